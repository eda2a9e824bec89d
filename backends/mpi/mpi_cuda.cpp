#include "mpi/mpi_cuda.h"

#include <mpi.h>

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI's extensions: MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support
#endif

namespace fsdp {

namespace {

// "Open MPI v4.1.4, package: Debian OpenMPI, ..." -> "Open MPI v4.1.4".
std::string library_name() {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(version, &len);
  std::string name(version, static_cast<size_t>(len));
  const size_t end = name.find_first_of(",\n");
  if (end != std::string::npos) name.resize(end);
  return name;
}

}  // namespace

LibraryDeviceSupport mpi_device_support() {
  LibraryDeviceSupport s;
  const std::string name = library_name();
#if defined(MPIX_CUDA_AWARE_SUPPORT)
  // Asked even when the header says 0 (Debian's): the library loaded at run time may differ.
  s.reads_device_memory = MPIX_Query_cuda_support() == 1;
  s.library = "CUDA-aware " + name;
  s.why_not = name +
              " has no CUDA support at run time (MPIX_Query_cuda_support() = 0: built without CUDA, "
              "as Debian's is, or no CUDA driver; jobs/cuda-aware-mpi.sh builds one with it)";
#else
  s.library = name;
  s.why_not = name +
              " cannot be asked whether it reads device memory (no Open MPI CUDA extension; "
              "comm.device_buffers: direct passes device pointers to a CUDA-aware MPI anyway)";
#endif
  return s;
}

}  // namespace fsdp
