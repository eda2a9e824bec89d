#pragma once
// Compute kernels on raw row-major f32 arrays (llm.c style: shapes in the comments, callers own
// the buffers). GEMM goes to OpenBLAS; the rest are loops written for the compiler to vectorise,
// split across OpenMP threads where the work is large enough to pay for it.
#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"
#include "tensor/matmul_precision.h"

namespace fsdp::ops {

// Elementwise loops below this many elements stay on one thread: waking the team costs more.
inline constexpr int64_t kParallelMin = 1 << 15;

// C (M,N) = alpha * op(A) @ op(B) + beta * C, row-major; op(A) is (M,K), op(B) is (K,N).
// precision high/medium: A and B are first copied, rounded to TF32/bf16 (matmul_precision.h).
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
          MatmulPrecision precision = MatmulPrecision::highest);

// The largest of x[0..n) (-inf for n = 0; NaNs are passed over, as std::max(mx, x) passes over
// them), in lane-wise maxima that vectorise: GCC 12 left `omp simd reduction(max)` over
// std::max a scalar vmaxss chain inside causal_softmax_forward's parallel region (64% of that
// kernel's samples). A maximum rounds nothing, so any order gives the same bits.
inline float row_max(const float* x, int64_t n) {
  constexpr int kLanes = 16;
  float lane[kLanes];
  for (float& l : lane) l = -__builtin_inff();
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) lane[l] = x[j + l] > lane[l] ? x[j + l] : lane[l];
  float mx = -__builtin_inff();
  for (; j < n; ++j) mx = x[j] > mx ? x[j] : mx;
  for (float l : lane) mx = l > mx ? l : mx;
  return mx;
}

// x rounded to the nearest TF32 value (10 mantissa bits, ties to even; overflow to inf, NaN kept)
// and to the nearest bf16 value, both returned as f32.
float round_to_tf32(float x);
float round_to_bf16(float x);

// Y (rows, out) = X (rows, in) @ W^T (W: (out, in)) + b (out) — torch.nn.Linear.
void linear_forward(float* Y, const float* X, const float* W, const float* b, int64_t rows, int64_t in, int64_t out,
                    MatmulPrecision precision = MatmulPrecision::highest);
// dW += dY^T X, db += colsum(dY), dX = dY W (dX may be null: first layer).
void linear_backward(float* dX, float* dW, float* db, const float* dY, const float* X, const float* W, int64_t rows,
                     int64_t in, int64_t out, MatmulPrecision precision = MatmulPrecision::highest);

// Image (C,H,W) -> columns (C*KH*KW, OH*OW) with stride 1 and zero padding `pad`; `col_ld` is
// the row stride of the column matrix so several images can sit side by side.
void im2col(const float* image, float* col, int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW, int64_t pad,
            int64_t OH, int64_t OW, int64_t col_ld);
// Adjoint of im2col: image += scatter(col). image must be zeroed by the caller.
void col2im(const float* col, float* image, int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW, int64_t pad,
            int64_t OH, int64_t OW, int64_t col_ld);

void relu_forward(float* y, const float* x, int64_t n);
void relu_backward(float* dx, const float* dy, const float* y, int64_t n);  // uses the output
void gelu_forward(float* y, const float* x, int64_t n);                     // exact (erf) GELU
void gelu_backward(float* dx, const float* dy, const float* x, int64_t n);
void add(float* y, const float* a, const float* b, int64_t n);  // y = a + b
void add_inplace(float* y, const float* x, int64_t n);          // y += x

// LayerNorm over the last dim C of (rows, C): y = (x - mean) * rstd * w + b, biased variance.
// mean/rstd (rows) saved for backward.
// residual not null: x + residual is normalised and stored in sum first; y and sum are rounded to
// `round` (Kernels::add_layernorm_forward).
void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w, const float* b, int64_t rows,
                       int64_t C, float eps, const float* residual = nullptr, float* sum = nullptr,
                       DType round = DType::f32);
// dx = (not accumulated; plus residual where that is not null), dw += , db += .
void layernorm_backward(float* dx, const float* residual, float* dw, float* db, const float* dy, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t rows, int64_t C);

// Row-wise log-softmax of (rows, C) and its backward dx = dy - exp(y) * sum(dy).
void log_softmax_forward(float* y, const float* x, int64_t rows, int64_t C);
void log_softmax_backward(float* dx, const float* dy, const float* y, int64_t rows, int64_t C);

// 2x2 max-pool, stride 2, on (N*C, H, W) planes; argmax (flat index within the plane) saved.
void maxpool2_forward(float* y, int32_t* argmax, const float* x, int64_t planes, int64_t H, int64_t W);
void maxpool2_backward(float* dx, const float* dy, const int32_t* argmax, int64_t planes, int64_t H, int64_t W);

// bf16 operands (raw uint16 bits), f32 accumulate and output: OpenBLAS's cblas_sbgemm where the
// library has it (detected by Meson), otherwise both operands are widened to f32 scratch and
// sgemm runs — exact either way, since every bf16 value is an f32 value.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
               const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace fsdp::ops
