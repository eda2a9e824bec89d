#pragma once
// The f32 GEMM kernels of a GPU at each train.matmul_precision (matmul_precision.h) as steps over
// an executor: at high and medium, which operands are rounded into packed copies, in which order,
// how long each copy lives, and the GEMMs on them. Written once, run by two executors:
// CudaKernels' makes the copies on the device (its caching allocator) and calls cuBLAS; the
// memory plan's (MetaKernels) charges each copy's bytes for as long as it lives and times each
// GEMM. So the plan's peak holds the run's copies by construction, not by a second account.
//
// An executor E has:
//   MatmulPrecision precision() const;
//   Copy round(const GemmOperand& o, int64_t batch);  // the copy lives as long as the returned
//                                                      // object; .get() is where it is
//   void gemm(const GemmCall& c, const GemmOperand& a, const GemmOperand& b);  // f32 operands
//   void gemm_on(const GemmCall& c, const GemmOperand& a, const void* a_copy, const GemmOperand& b,
//                const void* b_copy);                  // on the rounded copies of a and b
//   bool bias_epilogue(const GemmCall& c, const GemmOperand& x, const void* x_copy,
//                      const GemmOperand& w, const void* w_copy, const float* bias);
//                                                      // C = x w^T + bias as one GEMM whose
//                                                      // epilogue adds the bias, where there is
//                                                      // one (copies null at highest)
//   void bias_rows(float* Y, const float* bias, int64_t rows, int64_t cols);  // Y's rows = bias
//   void col_sum_add(float* db, const float* dY, int64_t rows, int64_t cols);  // db += sum of rows
#include <cstdint>

#include "tensor/matmul_precision.h"

namespace fsdp {

// One f32 operand of a (batched) GEMM as stored: rows x cols at row stride ld, batch stride.
struct GemmOperand {
  const float* data;
  int64_t rows, cols, ld, stride;
};

// C (M, N) = alpha op(A) op(B) + beta C, `batch` times: C at row stride ldc, batch stride stride_c.
struct GemmCall {
  bool trans_a, trans_b;
  int64_t M, N, K;
  float alpha, beta;
  float* C;
  int64_t ldc, stride_c, batch;
};

// A and B as stored: op(A) is M x K, op(B) K x N.
inline GemmOperand gemm_a(const GemmCall& c, const float* A, int64_t lda, int64_t stride_a) {
  return {A, c.trans_a ? c.K : c.M, c.trans_a ? c.M : c.K, lda, stride_a};
}
inline GemmOperand gemm_b(const GemmCall& c, const float* B, int64_t ldb, int64_t stride_b) {
  return {B, c.trans_b ? c.N : c.K, c.trans_b ? c.K : c.N, ldb, stride_b};
}

// One GEMM: at high and medium both operands rounded, the copies held for the GEMM.
template <class E>
void gemm_steps(E& e, const GemmCall& c, const GemmOperand& a, const GemmOperand& b) {
  if (c.M == 0 || c.N == 0 || c.batch == 0) return;
  if (e.precision() == MatmulPrecision::highest) return e.gemm(c, a, b);
  const auto a_copy = e.round(a, c.batch);
  const auto b_copy = e.round(b, c.batch);
  e.gemm_on(c, a, a_copy.get(), b, b_copy.get());
}

// Kernels::linear_forward: Y (rows, out) = X (rows, in) W^T + b, W (out, in). With a bias, one
// GEMM with the bias in its epilogue where the executor has one, else Y seeded with the bias and a
// GEMM with beta 1 (as the CPU). The copies are made once, X's before W's, whichever path runs.
template <class E>
void linear_forward_steps(E& e, float* Y, const float* X, const float* W, const float* b, int64_t rows, int64_t in,
                          int64_t out) {
  const GemmOperand x{X, rows, in, in, 0}, w{W, out, in, in, 0};
  const GemmCall c{false, true, rows, out, in, 1.0f, b ? 1.0f : 0.0f, Y, out, 0, 1};
  if (!b || rows == 0 || in == 0 || out == 0) {
    if (b) e.bias_rows(Y, b, rows, out);
    return gemm_steps(e, c, x, w);
  }
  if (e.precision() == MatmulPrecision::highest) {
    if (e.bias_epilogue(c, x, nullptr, w, nullptr, b)) return;
    e.bias_rows(Y, b, rows, out);
    return e.gemm(c, x, w);
  }
  const auto x_copy = e.round(x, 1);
  const auto w_copy = e.round(w, 1);
  if (e.bias_epilogue(c, x, x_copy.get(), w, w_copy.get(), b)) return;
  e.bias_rows(Y, b, rows, out);
  e.gemm_on(c, x, x_copy.get(), w, w_copy.get());
}

// Kernels::linear_backward: dW += dY^T X, db += column sums of dY, dX = dY W (dX null: skipped).
// At high and medium with dX, dY is rounded once for both GEMMs (dW's, then dX's) and X's copy is
// freed before W's is made: the peak holds dY's copy and the larger of the other two.
// X_rounded (Kernels::linear_backward_bf16_x, medium only; X null then): X's bf16 values as they
// are, taken as dW's operand with no copy of X at all.
template <class E>
// NOLINTNEXTLINE(readability-non-const-parameter): dX and dW are written, through GemmCall::C
void linear_backward_steps(E& e, float* dX, float* dW, float* db, const float* dY, const float* X,
                           const void* X_rounded, const float* W, int64_t rows, int64_t in, int64_t out) {
  const GemmOperand dy{dY, rows, out, out, 0}, x{X, rows, in, in, 0}, w{W, out, in, in, 0};
  const GemmCall dw_call{true, false, out, in, rows, 1.0f, 1.0f, dW, in, 0, 1};
  const GemmCall dx_call{false, false, rows, in, out, 1.0f, 0.0f, dX, in, 0, 1};
  const bool empty = rows == 0 || in == 0 || out == 0;
  if (!X_rounded && (e.precision() == MatmulPrecision::highest || !dX || empty)) {
    gemm_steps(e, dw_call, dy, x);
    if (db) e.col_sum_add(db, dY, rows, out);
    if (dX) gemm_steps(e, dx_call, dy, w);
    return;
  }
  if (empty) {  // no dW to add to; dX (when it has elements) is zeros, as the GEMM of K = 0 writes
    if (db) e.col_sum_add(db, dY, rows, out);
    if (dX) gemm_steps(e, dx_call, dy, w);
    return;
  }
  const auto dy_copy = e.round(dy, 1);
  if (X_rounded) {
    e.gemm_on(dw_call, dy, dy_copy.get(), x, X_rounded);
  } else {
    const auto x_copy = e.round(x, 1);
    e.gemm_on(dw_call, dy, dy_copy.get(), x, x_copy.get());
  }
  if (db) e.col_sum_add(db, dY, rows, out);
  if (!dX) return;
  const auto w_copy = e.round(w, 1);
  e.gemm_on(dx_call, dy, dy_copy.get(), w, w_copy.get());
}

}  // namespace fsdp
