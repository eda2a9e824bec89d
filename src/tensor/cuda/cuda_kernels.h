#pragma once
// CudaKernels: tensor/kernels.h on the GPU, enqueued on the runtime's compute stream. GEMMs go
// to cuBLAS (f32 with CUBLAS_DEFAULT_MATH: no TF32, so results compare with the CPU's; bf16
// through cublasGemmEx with f32 compute and output); everything else is a kernel of kernels_*.cu
// (launch.h). The host-value functions (nll_sum, sum_squares, all_finite) reduce on the device,
// copy a few bytes to pinned memory and wait for the compute stream only.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <memory>

#include "tensor/caching_allocator.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/cuda/fused_attention.h"
#include "tensor/cuda/lt_bias_gemm.h"
#include "tensor/gemm_steps.h"
#include "tensor/kernels.h"

namespace fsdp::cuda {

class CublasHandle {
 public:
  explicit CublasHandle(cudaStream_t stream);
  ~CublasHandle();
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

// Throws Error("cuda: <call>: <cublasGetStatusString> (<context>)").
void check_cublas(cublasStatus_t rc, const char* call, const std::string& context);

class CudaKernels final : public Kernels {
 public:
  // allocator: where high's and medium's rounded operand copies come from (on `stream`, so freeing them right
  // after the GEMM is safe: the stream orders their next use after it).
  CudaKernels(cudaStream_t stream, CachingAllocator& allocator);
  Device device() const override { return Device::cuda; }
  cudaStream_t stream() const { return stream_; }

  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
            const float* B, int64_t ldb, float beta, float* C, int64_t ldc) override;
  void gemm_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                            int64_t lda, int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b, float beta,
                            float* C, int64_t ldc, int64_t stride_c, int64_t batch) override;
  void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                 int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) override;
  void linear_forward(float* Y, const float* X, const float* W, const float* b, int64_t rows, int64_t in,
                      int64_t out) override;
  void linear_backward(float* dX, float* dW, float* db, const float* dY, const float* X, const float* W, int64_t rows,
                       int64_t in, int64_t out) override;
  void linear_backward_bf16_x(float* dX, float* dW, float* db, const float* dY, const uint16_t* X, const float* W,
                              int64_t rows, int64_t in, int64_t out) override;
  void im2col(const float* x, float* col, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K, int64_t pad,
              int64_t OH, int64_t OW) override;
  void col2im(const float* dcol, float* dx, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K, int64_t pad,
              int64_t OH, int64_t OW) override;
  void conv_bias_permute(float* y, const float* ybuf, const float* bias, int64_t B, int64_t out, int64_t P) override;
  void conv_grad_permute(float* dyt, float* db, const float* dy, int64_t B, int64_t out, int64_t P) override;
  void relu_forward(float* y, const float* x, int64_t n) override;
  void relu_backward(float* dx, const float* dy, const float* y, int64_t n) override;
  void gelu_forward(float* y, const float* x, int64_t n) override;
  void gelu_backward(float* dx, const float* dy, const float* x, int64_t n) override;
  void gelu_tanh_forward(float* y, const float* x, int64_t n) override;
  void gelu_tanh_backward(float* dx, const float* dy, const float* x, int64_t n) override;
  void silu_forward(float* y, const float* x, int64_t n) override;
  void silu_backward(float* dx, const float* dy, const float* x, int64_t n) override;
  void rope(float* x, const float* cos, const float* sin, int64_t rows, int64_t T, int64_t heads, int64_t D, int64_t ld,
            int64_t pos0, bool backward) override;
  void add(float* y, const float* a, const float* b, int64_t n) override;
  void add_inplace(float* y, const float* x, int64_t n) override;
  void mul(float* y, const float* a, const float* b, int64_t n) override;
  void scale(float* x, float factor, int64_t n) override;
  void fill(float* x, float value, int64_t n) override;
  void dropout_forward(float* y, uint8_t* keep, const float* x, int64_t B, int64_t per_sample, float p, uint64_t key,
                       uint64_t stream, int64_t sample_offset) override;
  void dropout_backward(float* dx, const float* dy, const uint8_t* keep, float p, int64_t n) override;
  void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w, const float* b,
                         int64_t rows, int64_t C, float eps) override;
  void layernorm_backward(float* dx, const float* residual, float* dw, float* db, const float* dy, const float* x,
                          const float* w, const float* mean, const float* rstd, int64_t rows, int64_t C) override;
  void log_softmax_forward(float* y, const float* x, int64_t rows, int64_t C) override;
  void log_softmax_backward(float* dx, const float* dy, const float* y, int64_t rows, int64_t C) override;
  void causal_softmax_forward(float* P, CausalRows g, float* row_max, float* row_inv) override;
  void causal_softmax_recompute(float* P, CausalRows g, const float* row_max, const float* row_inv) override;
  void causal_softmax_backward(float* dP, const float* P, CausalRows g, float scale) override;
  void causal_softmax_flash(float* P, CausalRows g, float* row_max, float* row_inv, DType dtype) override;
  void attention_rescale(float* y, const float* row_inv, int64_t B, int64_t T, int64_t H, int64_t hd,
                         int64_t inv_stride, DType dtype) override;
  void causal_softmax_normalize(float* P, CausalRows g, const float* row_inv, DType dtype) override;
  void add_layernorm_forward(float* sum, float* y, float* mean, float* rstd, const float* x, const float* residual,
                             const float* w, const float* b, int64_t rows, int64_t C, float eps, DType dtype) override;
  void add_rmsnorm_forward(float* sum, float* y, float* rstd, const float* x, const float* residual, const float* w,
                           int64_t rows, int64_t C, float eps, DType dtype) override;
  void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t rows, int64_t C,
                       float eps) override;
  void rmsnorm_backward(float* dx, const float* residual, float* dw, const float* dy, const float* x, const float* w,
                        const float* rstd, int64_t rows, int64_t C) override;
  void attention_softmax_forward(float* P, const float* bias, const int32_t* key_valid, bool causal, int64_t B,
                                 int64_t H, int64_t Tq, int64_t Tk) override;
  void softmax_backward(float* dP, const float* P, int64_t rows, int64_t Tk) override;
  void relative_bias_forward(float* bias, const float* table, const int32_t* bucket, int64_t H, int64_t Tq,
                             int64_t Tk) override;
  void relative_bias_backward(float* dtable, const float* dS, const int32_t* bucket, int64_t B, int64_t H, int64_t Tq,
                              int64_t Tk) override;
  void maxpool2_forward(float* y, int32_t* argmax, const float* x, int64_t planes, int64_t H, int64_t W) override;
  void maxpool2_backward(float* dx, const float* dy, const int32_t* argmax, int64_t planes, int64_t H,
                         int64_t W) override;
  void embedding_forward(float* y, const int32_t* tokens, const float* wte, const float* wpe, int64_t B, int64_t T,
                         int64_t C) override;
  void embedding_backward(float* dwte, float* dwpe, const float* dy, const int32_t* tokens, int64_t B, int64_t T,
                          int64_t C) override;
  void nll_sum(const float* logp, const int32_t* targets, int64_t rows, int64_t C, double* sum,
               int64_t* correct) override;
  void nll_backward(float* d, const int32_t* targets, int64_t rows, int64_t C, float g) override;
  void cross_entropy_sum(const float* logits, const int32_t* targets, int64_t rows, int64_t C, float* lse, double* sum,
                         int64_t* correct) override;
  void cross_entropy_backward_logits(float* d, const float* logits, const float* lse, const int32_t* targets,
                                     int64_t rows, int64_t C, float inv_n) override;
  void cross_entropy_backward(float* d, const float* logp, const int32_t* targets, int64_t rows, int64_t C,
                              float inv_n) override;
  void adamw_step(float* p, const float* g, float* exp_avg, float* exp_avg_sq, int64_t n, const AdamWArgs& a) override;
  void sgd_step(float* p, const float* g, float* momentum_buffer, int64_t n, const SgdArgs& a) override;
  void adadelta_step(float* p, const float* g, float* square_avg, float* acc_delta, int64_t n,
                     const AdadeltaArgs& a) override;
  void cast(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) override;
  void round_to(float* x, DType dtype, int64_t n) override;
  double sum_squares(const float* x, int64_t n) override;
  bool all_finite(const float* x, int64_t n) override;
  // linear_forward calls whose bias went through cuBLASLt's epilogue (lt_bias_gemm.h; test_gpu).
  int64_t bias_epilogue_runs() const { return lt_bias_.runs(); }
  std::string fused_attention_unavailable() override { return fused_.unavailable(); }
  int64_t fused_attention_workspace_bytes(const FusedAttentionShape& s, bool backward) override {
    return fused_.workspace_bytes(s, backward);
  }
  void fused_attention_forward(const FusedAttentionShape& s, const uint16_t* qkv, uint16_t* o, float* stats,
                               void* workspace) override {
    fused_.forward(s, qkv, o, stats, workspace);
  }
  void fused_attention_backward(const FusedAttentionShape& s, const uint16_t* qkv, const uint16_t* o,
                                const uint16_t* dO, const float* stats, uint16_t* dqkv, void* workspace) override {
    fused_.backward(s, qkv, o, dO, stats, dqkv, workspace);
  }

 private:
  // Copies the reduction results (scratch_ offsets 0..15 bytes) to pinned memory and waits.
  void fetch_results();
  // gemm_steps.h's executor: rounded copies from allocator_ (TF32 in f32 or bf16), cuBLAS GEMMs on
  // them with f32 accumulation and output.
  class Steps;
  cudaStream_t stream_;
  CachingAllocator& allocator_;
  CublasHandle cublas_;
  DeviceBuffer scratch_;  // [0] double result, [8] int64 hits, then partial doubles and hits
  PinnedBuffer host_;     // the 16 result bytes
  FusedAttention fused_;  // cuDNN's SDPA, or the stub of a build without it
  LtBiasGemm lt_bias_;    // linear_forward with a bias: one GEMM with the bias in its epilogue
};

}  // namespace fsdp::cuda
