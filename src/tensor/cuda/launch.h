#pragma once
// The launchers of kernels_*.cu (compiled by nvcc; one file per family of kernels), called by cuda_kernels.cpp (the C++
// compiler): each enqueues its kernel(s) on `s` and checks the launch with cudaGetLastError.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "tensor/kernels.h"

namespace fsdp::cuda::launch {

void bias_rows(float* Y, const float* b, int64_t rows, int64_t out, cudaStream_t s);      // Y[r, :] = b
void col_sum_add(float* db, const float* dY, int64_t rows, int64_t out, cudaStream_t s);  // db += colsum(dY)
void im2col(const float* x, float* col, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K, int64_t pad, int64_t OH,
            int64_t OW, cudaStream_t s);
void col2im(const float* dcol, float* dx, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K, int64_t pad,
            int64_t OH, int64_t OW, cudaStream_t s);
void conv_bias_permute(float* y, const float* ybuf, const float* bias, int64_t B, int64_t out, int64_t P,
                       cudaStream_t s);
void conv_grad_permute(float* dyt, float* db, const float* dy, int64_t B, int64_t out, int64_t P, cudaStream_t s);

enum class Unary : uint8_t {
  relu_forward,
  relu_backward,
  gelu_forward,
  gelu_backward,
  gelu_tanh_forward,
  gelu_tanh_backward,
  silu_forward,
  silu_backward,
  add,
  add_inplace,
  mul
};
// y = f(a, b) elementwise (b unused by the one-input ops).
void elementwise(Unary op, float* y, const float* a, const float* b, int64_t n, cudaStream_t s);
void scale(float* x, float factor, int64_t n, cudaStream_t s);
void fill(float* x, float value, int64_t n, cudaStream_t s);
void dropout_forward(float* y, uint8_t* keep, const float* x, int64_t B, int64_t per_sample, float p, uint64_t key,
                     uint64_t stream, int64_t sample_offset, cudaStream_t s);
void dropout_backward(float* dx, const float* dy, const uint8_t* keep, float p, int64_t n, cudaStream_t s);

// residual not null: x + residual normalised, stored in sum; sum and y rounded to dtype.
void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w, const float* b, int64_t rows,
                       int64_t C, float eps, cudaStream_t s, const float* residual = nullptr, float* sum = nullptr,
                       DType dtype = DType::f32);
void layernorm_backward(float* dx, const float* residual, float* dw, float* db, const float* dy, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t rows, int64_t C, cudaStream_t s);
void log_softmax_forward(float* y, const float* x, int64_t rows, int64_t C, cudaStream_t s);
void log_softmax_backward(float* dx, const float* dy, const float* y, int64_t rows, int64_t C, cudaStream_t s);
void causal_softmax_forward(float* P, CausalRows g, float* row_max, float* row_inv, cudaStream_t s);
void causal_softmax_recompute(float* P, CausalRows g, const float* row_max, const float* row_inv, cudaStream_t s);
void causal_softmax_backward(float* dP, const float* P, CausalRows g, float scale, cudaStream_t s);
void causal_softmax_flash(float* P, CausalRows g, float* row_max, float* row_inv, DType dtype, cudaStream_t s);
void attention_rescale(float* y, const float* row_inv, int64_t B, int64_t T, int64_t H, int64_t hd, int64_t inv_stride,
                       DType dtype, cudaStream_t s);
void causal_softmax_normalize(float* P, CausalRows g, const float* row_inv, DType dtype, cudaStream_t s);
void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t rows, int64_t C, float eps,
                     cudaStream_t s, const float* residual = nullptr, float* sum = nullptr, DType dtype = DType::f32);
void rmsnorm_backward(float* dx, const float* residual, float* dw, const float* dy, const float* x, const float* w,
                      const float* rstd, int64_t rows, int64_t C, cudaStream_t s);
void attention_softmax_forward(float* P, const float* bias, const int32_t* key_valid, bool causal, int64_t B, int64_t H,
                               int64_t Tq, int64_t Tk, cudaStream_t s);
void softmax_backward(float* dP, const float* P, int64_t rows, int64_t Tk, cudaStream_t s);
void relative_bias_forward(float* bias, const float* table, const int32_t* bucket, int64_t H, int64_t Tq, int64_t Tk,
                           cudaStream_t s);
void relative_bias_backward(float* dtable, const float* dS, const int32_t* bucket, int64_t B, int64_t H, int64_t Tq,
                            int64_t Tk, cudaStream_t s);
void maxpool2_forward(float* y, int32_t* argmax, const float* x, int64_t planes, int64_t H, int64_t W, cudaStream_t s);
void maxpool2_backward(float* dx, const float* dy, const int32_t* argmax, int64_t planes, int64_t H, int64_t W,
                       cudaStream_t s);
void rope(float* x, const float* cos, const float* sin, int64_t rows, int64_t T, int64_t heads, int64_t D, int64_t ld,
          int64_t pos0, bool backward, cudaStream_t s);
void embedding_forward(float* y, const int32_t* tokens, const float* wte, const float* wpe, int64_t B, int64_t T,
                       int64_t C, cudaStream_t s);
void embedding_backward(float* dwte, float* dwpe, const float* dy, const int32_t* tokens, int64_t B, int64_t T,
                        int64_t C, cudaStream_t s);

// Reductions into device scratch: `partials` holds kReduceBlocks doubles (+ as many int64 for
// nll's hit counts); the final value lands in result[0] (and hits[0]).
constexpr int kReduceBlocks = 256;
// lse not null: logp is the logits, and each row's log-probabilities are logits - lse (in f32).
void nll_sum(const float* logp, const int32_t* targets, int64_t rows, int64_t C, double* partials,
             long long* partial_hits, double* result, long long* hits, cudaStream_t s, const float* lse = nullptr);
void sum_squares(const float* x, int64_t n, double* partials, double* result, cudaStream_t s);
void count_nonfinite(const float* x, int64_t n, long long* partial_hits, long long* hits, cudaStream_t s);
void nll_backward(float* d, const int32_t* targets, int64_t rows, int64_t C, float g, cudaStream_t s);
// lse (rows): each row's log-sum-exp, log_softmax_forward's arithmetic (Kernels::cross_entropy_sum).
void row_logsumexp(float* lse, const float* x, int64_t rows, int64_t C, cudaStream_t s);
void cross_entropy_backward(float* d, const float* logp, const int32_t* targets, int64_t rows, int64_t C, float inv_n,
                            cudaStream_t s, const float* lse = nullptr);

void adamw_step(float* p, const float* g, float* exp_avg, float* exp_avg_sq, int64_t n, const AdamWArgs& a,
                cudaStream_t s);
void sgd_step(float* p, const float* g, float* momentum_buffer, int64_t n, const SgdArgs& a, cudaStream_t s);
void adadelta_step(float* p, const float* g, float* square_avg, float* acc_delta, int64_t n, const AdadeltaArgs& a,
                   cudaStream_t s);
// f32 <-> bf16 <-> f16 (any pair of the three; same type: a copy).
void cast(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n, cudaStream_t s);
// x[i] rounded to bf16/f16 in place, kept in f32 (Kernels::round_to).
void round_in_place(float* x, DType dtype, int64_t n, cudaStream_t s);
// A GEMM operand at train.matmul_precision high or medium: batch matrices of (rows, cols) f32 at
// row stride ld and batch stride `stride`, rounded as the CPU rounds them (nearest, ties to even:
// to TF32 kept in f32 at high, to bf16 at medium) and packed into dst as (batch, rows, cols).
void round_packed(void* dst, MatmulPrecision p, const float* src, int64_t batch, int64_t rows, int64_t cols, int64_t ld,
                  int64_t stride, cudaStream_t s);

}  // namespace fsdp::cuda::launch
