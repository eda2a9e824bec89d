// gpu_versions: the versions of the CUDA libraries this binary loads, as the loaded libraries
// report them (the GPU bundle's run-gpu-checks.sh prints them; none of the calls needs a GPU).
//   cudart R (linked: static in the bundle)   driver D (0: no driver)   cublas X.Y.Z   nccl X.Y.Z
//   cudnn X.Y.Z (loaded as fused attention loads it: dlopen libcudnn.so.9; "none" where absent)
#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstdio>

int main() {
  int runtime = 0, driver = 0, major = 0, minor = 0, patch = 0, nccl = 0;
  cudaRuntimeGetVersion(&runtime);
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
  cublasGetProperty(MAJOR_VERSION, &major);
  cublasGetProperty(MINOR_VERSION, &minor);
  cublasGetProperty(PATCH_LEVEL, &patch);
  ncclGetVersion(&nccl);
  std::printf("cudart %d.%d\ndriver_cuda %d.%d\ncublas %d.%d.%d\nnccl %d.%d.%d\n", runtime / 1000, runtime % 1000 / 10,
              driver / 1000, driver % 1000 / 10, major, minor, patch, nccl / 10000, nccl % 10000 / 100, nccl % 100);
  // cudnnGetVersion() is MAJOR * 10000 + MINOR * 100 + PATCH from cuDNN 9 on.
  void* cudnn = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
  auto* get = cudnn ? reinterpret_cast<size_t (*)()>(dlsym(cudnn, "cudnnGetVersion")) : nullptr;
  if (get) {
    const size_t v = get();
    std::printf("cudnn %zu.%zu.%zu\n", v / 10000, v % 10000 / 100, v % 100);
  } else {
    std::printf("cudnn none\n");
  }
  if (cudnn) dlclose(cudnn);
  return 0;
}
