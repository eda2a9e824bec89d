#pragma once
// Linear's forward with the bias in cuBLASLt's epilogue: Y = X W^T + b in one GEMM. The plain
// cuBLAS path seeds Y with the bias (a kernel writing all of Y) and runs the GEMM with beta = 1
// (which reads all of Y again): on the H200 the seeding alone was 3.9% of the performance
// model's step. PyTorch's addmm takes the same route (at::cuda::blas::gemm_and_bias).
//
// Operands are the GEMM's as stored: X (rows, in) and W (out, in), row-major and packed (ld =
// in), either f32 (matmul_precision highest: CUBLAS_COMPUTE_32F, no TF32; high: TF32 values,
// CUBLAS_COMPUTE_32F_FAST_TF32, exact on them) or bf16 (medium: CUBLAS_COMPUTE_32F); Y and b are
// f32. Each element is the f32 sum of its products plus b, rounded once, as with the seeded
// GEMM (the order of the sum is cuBLAS's either way).
//
// A shape (with the pointers' alignments, which limit the algorithms) gets its descriptors and
// cuBLASLt's first heuristic algorithm once; where cuBLASLt has none, run() says so and enqueues
// nothing, and the caller seeds and runs cuBLAS as before. The 32 MiB workspace (NVIDIA's size
// for Hopper) is allocated at the first run, outside the caching allocator, like cuBLAS's own.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "tensor/cuda/cuda_runtime.h"

namespace fsdp::cuda {

class LtBiasGemm {
 public:
  explicit LtBiasGemm(cudaStream_t stream);
  ~LtBiasGemm();
  LtBiasGemm(const LtBiasGemm&) = delete;
  LtBiasGemm& operator=(const LtBiasGemm&) = delete;

  // Y (rows, out) = X (rows, in) W (out, in)^T + b (out), enqueued on the stream; `type` is
  // CUDA_R_32F or CUDA_R_16BF for X and W. False, with nothing enqueued, where cuBLASLt has no
  // algorithm for it (or a size does not fit its 32-bit int, or in == 0).
  bool run(cudaDataType_t type, cublasComputeType_t compute, const void* X, const void* W, const float* b, float* Y,
           int64_t rows, int64_t in, int64_t out);
  int64_t runs() const { return runs_; }  // GEMMs that ran with the bias epilogue (test_gpu)

 private:
  struct Plan;
  // type, compute, rows, in, out, and the alignments (bytes, up to 256) of X, W, b and Y.
  using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int, int, int, int>;
  const Plan& plan(const Key& key);

  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  std::unique_ptr<DeviceBuffer> workspace_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  int64_t runs_ = 0;
};

}  // namespace fsdp::cuda
