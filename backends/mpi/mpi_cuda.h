#pragma once
// Whether the MPI library takes device (CUDA) pointers in collectives: Open MPI built with CUDA
// support (mpi-ext.h defines MPIX_CUDA_AWARE_SUPPORT) whose library, queried at run time, says so
// (MPIX_Query_cuda_support() == 1: the library loaded may differ from the header). False for any
// other MPI, and for Debian's Open MPI (built without CUDA). The registry hands it to
// make_communicator (comm.h BackendEntry::device_aware): true lets device buffers go to MPI
// as they are, false stages them through host memory (comm/device_comm.h).
namespace fsdp {

bool mpi_device_aware();

}  // namespace fsdp
