#pragma once
// Whether the MPI library takes device (CUDA) pointers in collectives, asked at run time: Open
// MPI's CUDA extension (mpi-ext.h: MPIX_Query_cuda_support() == 1 once the library was built with
// CUDA and found the driver). Any other MPI cannot be asked: comm.device_buffers: direct passes
// device pointers to it anyway (Cray MPICH, MVAPICH2-GDR). Debian's Open MPI is built without
// CUDA; jobs/cuda-aware-mpi.sh builds one with it.
#include "comm/comm.h"

namespace fsdp {

// After MPI_Init. library: "CUDA-aware Open MPI v4.1.4"; why_not: what MPIX_Query_cuda_support
// said, or that this MPI has no such query.
LibraryDeviceSupport mpi_device_support();

}  // namespace fsdp
