#include "mpi/mpi_cuda.h"

#include <mpi.h>

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI's extensions: MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support
#endif

namespace fsdp {

bool mpi_device_aware() {
#if defined(MPIX_CUDA_AWARE_SUPPORT)
  // Asked even when the header says 0 (Debian's): the library loaded at run time may differ.
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

}  // namespace fsdp
