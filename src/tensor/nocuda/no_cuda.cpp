// A build without CUDA (-Dgpu=disabled, or no nvcc/cuBLAS found): the cuda device is named in
// every message, with how to get it.
#include "tensor/error.h"
#include "tensor/runtime_factory.h"

namespace fsdp {

std::unique_ptr<DeviceRuntime> make_cuda_runtime(MemoryTracker&, int) {
  throw Error(
      "device cuda: this binary was built without CUDA (reconfigure with -Dgpu=enabled; nvcc, cuBLAS "
      "and NCCL from the CUDA toolkit are needed)");
}

bool cuda_built_impl() { return false; }

int cuda_device_count_impl(std::string* why_none) {
  if (why_none) *why_none = "built without CUDA";
  return 0;
}

}  // namespace fsdp
