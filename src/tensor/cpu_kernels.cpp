// The host implementation of Kernels (kernels.h): OpenBLAS for the GEMMs, ops.h for the layer
// kernels, and here the loops that used to live inline in the layers, losses and optimizers.
// Each loop is the one that ran before, OpenMP split included, so host results are bitwise what
// they were (the PyTorch reference and the bitwise-resume tests depend on that).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "tensor/error.h"
#include "tensor/kernel_math.h"
#include "tensor/kernels.h"
#include "tensor/ops.h"
#include "tensor/rng.h"

namespace fsdp {
namespace {

using ops::kParallelMin;
// Below this many elements the OpenMP fork/join costs more than an optimizer update.
constexpr int64_t kOptimParallelMin = 1 << 16;
// Softmax rows of one (T, T) plane go parallel above this many scores, as attention did.
constexpr int64_t kSoftmaxParallelMin = 1 << 14;

// torch's AVX2 kernels evaluate `self + alpha * other` (add_ with alpha, addcmul_) as one
// fused multiply-add, vector body and scalar tail alike. Fuse exactly there when FMA is an
// instruction (-march=native builds): bit-identical to torch. Elsewhere a libm fmaf call would
// cost far more than the one-rounding difference it removes. An explicit fmaf also keeps the
// compiler from contracting the *other* products into adds, which torch rounds separately.
inline float madd(float a, float b, float c) {
#ifdef FP_FAST_FMAF
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

// Each element's math is independent of the others and of the thread split, so threading never
// changes results. f is a by-value lambda of pointers and scalars: each thread's private copy
// keeps them in registers rather than reloaded through a shared reference every element.
// (std::sqrt loops only vectorize under -fno-math-errno; sqrt is exact either way, so that
// flag changes speed, not values.)
template <class F>
void parallel_for(int64_t n, F f) {
#pragma omp parallel for simd if (n >= kOptimParallelMin) firstprivate(f)
  for (int64_t i = 0; i < n; ++i) f(i);
}

// Calls f with one std::bool_constant per flag, so per-step options become `if constexpr`
// and the element loops stay branch-free.
template <class F>
void dispatch(F&& f) {
  f();
}
template <class F, class... Flags>
void dispatch(F&& f, bool flag, Flags... rest) {
  if (flag)
    dispatch([&](auto... c) { f(std::true_type{}, c...); }, rest...);
  else
    dispatch([&](auto... c) { f(std::false_type{}, c...); }, rest...);
}

// y[i] = f(a[i]) or f(a[i], b[i]) over n elements (b null: one input), threads past
// kParallelMin: the element-wise kernels whose per-element math is kernel_math.h's.
template <class F>
void elementwise(float* y, const float* a, const float* b, int64_t n, F f) {
  if (!b) {
#pragma omp parallel for simd if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) y[i] = f(a[i], 0.0f);
    return;
  }
#pragma omp parallel for simd if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = f(a[i], b[i]);
}

class CpuKernels final : public Kernels {
 public:
  Device device() const override { return Device::cpu; }

  // ---- GEMM ----

  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
            const float* B, int64_t ldb, float beta, float* C, int64_t ldc) override {
    ops::gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, precision_);
  }

  // One sgemm per operand: the same calls the per-head loops made, so the same results.
  void gemm_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                            int64_t lda, int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b, float beta,
                            float* C, int64_t ldc, int64_t stride_c, int64_t batch) override {
    for (int64_t i = 0; i < batch; ++i)
      ops::gemm(trans_a, trans_b, M, N, K, alpha, A + i * stride_a, lda, B + i * stride_b, ldb, beta, C + i * stride_c,
                ldc, precision_);
  }

  int64_t causal_row_block(int64_t T) const override { return host_causal_row_block(T); }

  void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                 int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) override {
    ops::gemm_bf16(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }

  // ---- Linear ----

  void linear_forward(float* Y, const float* X, const float* W, const float* b, int64_t rows, int64_t in,
                      int64_t out) override {
    ops::linear_forward(Y, X, W, b, rows, in, out, precision_);
  }
  void linear_backward(float* dX, float* dW, float* db, const float* dY, const float* X, const float* W, int64_t rows,
                       int64_t in, int64_t out) override {
    ops::linear_backward(dX, dW, db, dY, X, W, rows, in, out, precision_);
  }
  // The host's GEMMs take f32 operands: X widened (exactly) into host scratch, outside the
  // tracker as the host's rounded copies are; the GPU reads the bf16 as it is.
  void linear_backward_bf16_x(float* dX, float* dW, float* db, const float* dY, const uint16_t* X, const float* W,
                              int64_t rows, int64_t in, int64_t out) override {
    require_medium_for_bf16_x();
    std::vector<float> x32(static_cast<size_t>(rows * in));
    convert(X, DType::bf16, x32.data(), DType::f32, x32.size());
    ops::linear_backward(dX, dW, db, dY, x32.data(), W, rows, in, out, precision_);
  }

  // ---- Conv2d ----

  // Image b's columns sit at column offset b * OH*OW of col (C*K*K, B*OH*OW).
  void im2col(const float* x, float* col, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K, int64_t pad,
              int64_t OH, int64_t OW) override {
    const int64_t P = OH * OW;
#pragma omp parallel for
    for (int64_t b = 0; b < B; ++b) ops::im2col(x + b * C * H * W, col + b * P, C, H, W, K, K, pad, OH, OW, B * P);
  }

  void col2im(const float* dcol, float* dx, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K, int64_t pad,
              int64_t OH, int64_t OW) override {
    const int64_t P = OH * OW;
    std::memset(dx, 0, static_cast<size_t>(B * C * H * W) * sizeof(float));
#pragma omp parallel for
    for (int64_t b = 0; b < B; ++b) ops::col2im(dcol + b * P, dx + b * C * H * W, C, H, W, K, K, pad, OH, OW, B * P);
  }

  void conv_bias_permute(float* y, const float* ybuf, const float* bias, int64_t B, int64_t out, int64_t P) override {
#pragma omp parallel for collapse(2)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t o = 0; o < out; ++o) {
        const float* src = ybuf + o * B * P + b * P;
        float* dst = y + (b * out + o) * P;
        const float bo = bias[o];
#pragma omp simd
        for (int64_t p = 0; p < P; ++p) dst[p] = src[p] + bo;
      }
  }

  void conv_grad_permute(float* dyt, float* db, const float* dy, int64_t B, int64_t out, int64_t P) override {
#pragma omp parallel for collapse(2)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t b = 0; b < B; ++b) std::copy_n(dy + (b * out + o) * P, P, dyt + o * B * P + b * P);
    for (int64_t o = 0; o < out; ++o) {
      float s = 0.0f;
      const float* row = dyt + o * B * P;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < B * P; ++i) s += row[i];
      db[o] += s;
    }
  }

  // ---- Elementwise ----

  void relu_forward(float* y, const float* x, int64_t n) override { ops::relu_forward(y, x, n); }
  void relu_backward(float* dx, const float* dy, const float* y, int64_t n) override {
    ops::relu_backward(dx, dy, y, n);
  }
  void gelu_forward(float* y, const float* x, int64_t n) override { ops::gelu_forward(y, x, n); }
  void gelu_backward(float* dx, const float* dy, const float* x, int64_t n) override {
    ops::gelu_backward(dx, dy, x, n);
  }
  void gelu_tanh_forward(float* y, const float* x, int64_t n) override {
    elementwise(y, x, nullptr, n, [](float v, float) { return kmath::gelu_tanh_forward(v); });
  }
  void gelu_tanh_backward(float* dx, const float* dy, const float* x, int64_t n) override {
    elementwise(dx, dy, x, n, [](float g, float v) { return kmath::gelu_tanh_backward(g, v); });
  }
  void silu_forward(float* y, const float* x, int64_t n) override {
    elementwise(y, x, nullptr, n, [](float v, float) { return kmath::silu_forward(v); });
  }
  void silu_backward(float* dx, const float* dy, const float* x, int64_t n) override {
    elementwise(dx, dy, x, n, [](float g, float v) { return kmath::silu_backward(g, v); });
  }
  void add(float* y, const float* a, const float* b, int64_t n) override { ops::add(y, a, b, n); }
  void add_inplace(float* y, const float* x, int64_t n) override { ops::add_inplace(y, x, n); }

  void mul(float* y, const float* a, const float* b, int64_t n) override {
    elementwise(y, a, b, n, [](float u, float v) { return u * v; });
  }

  void scale(float* x, float factor, int64_t n) override {
#pragma omp parallel for simd if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) x[i] *= factor;
  }

  void fill(float* x, float value, int64_t n) override { std::fill_n(x, n, value); }

  // ---- Dropout ----

  void dropout_forward(float* y, uint8_t* keep, const float* x, int64_t B, int64_t per_sample, float p, uint64_t key,
                       uint64_t stream, int64_t sample_offset) override {
    const CounterRng rng(key, stream);
    const float scale = kmath::dropout_scale(p);
#pragma omp parallel for
    for (int64_t n = 0; n < B; ++n) {
      const uint64_t base = static_cast<uint64_t>(sample_offset + n) * static_cast<uint64_t>(per_sample);
      for (int64_t j = 0; j < per_sample; ++j) {
        const int64_t i = n * per_sample + j;
        const bool kept = rng.uniform(base + j) >= p;
        keep[i] = kept ? 1 : 0;
        y[i] = x[i] * (kept ? scale : 0.0f);
      }
    }
  }

  void dropout_backward(float* dx, const float* dy, const uint8_t* keep, float p, int64_t n) override {
    const float scale = kmath::dropout_scale(p);
#pragma omp parallel for simd
    for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * (keep[i] ? scale : 0.0f);
  }

  // ---- Normalisation and softmax ----

  void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w, const float* b,
                         int64_t rows, int64_t C, float eps) override {
    ops::layernorm_forward(y, mean, rstd, x, w, b, rows, C, eps);
  }
  void add_layernorm_forward(float* sum, float* y, float* mean, float* rstd, const float* x, const float* residual,
                             const float* w, const float* b, int64_t rows, int64_t C, float eps, DType dtype) override {
    ops::layernorm_forward(y, mean, rstd, x, w, b, rows, C, eps, residual, sum, dtype);
  }
  void layernorm_backward(float* dx, const float* residual, float* dw, float* db, const float* dy, const float* x,
                          const float* w, const float* mean, const float* rstd, int64_t rows, int64_t C) override {
    ops::layernorm_backward(dx, residual, dw, db, dy, x, w, mean, rstd, rows, C);
  }
  void log_softmax_forward(float* y, const float* x, int64_t rows, int64_t C) override {
    ops::log_softmax_forward(y, x, rows, C);
  }
  void log_softmax_backward(float* dx, const float* dy, const float* y, int64_t rows, int64_t C) override {
    ops::log_softmax_backward(dx, dy, y, rows, C);
  }

  // Rows of every plane are independent and each is computed serially, so splitting the
  // planes * T rows across threads (rather than one plane's T rows at a time) changes nothing.
  void causal_softmax_forward(float* P, CausalRows g, float* row_max, float* row_inv) override {
    softmax_rows(P, g, row_max, row_inv, false, DType::f32);
  }

  void causal_softmax_flash(float* P, CausalRows g, float* row_max, float* row_inv, DType dtype) override {
    softmax_rows(P, g, row_max, row_inv, true, dtype);
  }

  void attention_rescale(float* y, const float* row_inv, int64_t B, int64_t T, int64_t H, int64_t hd,
                         int64_t inv_stride, DType dtype) override {
#pragma omp parallel for if (B * T * H * hd > kParallelMin)
    for (int64_t bt = 0; bt < B * T; ++bt) {
      const int64_t b = bt / T, t = bt % T;
      float* yr = y + bt * H * hd;
      for (int64_t h = 0; h < H; ++h) {
        const float inv = row_inv[(b * H + h) * inv_stride + t];
        for (int64_t d = 0; d < hd; ++d) yr[h * hd + d] = kmath::round_as(yr[h * hd + d] * inv, dtype);
      }
    }
  }

  void causal_softmax_normalize(float* P, CausalRows g, const float* row_inv, DType dtype) override {
    const int64_t T = g.T;
#pragma omp parallel for if (g.planes * g.rows * T > kSoftmaxParallelMin)
    for (int64_t r = 0; r < g.planes * g.rows; ++r) {
      const int64_t i = g.row0 + r % g.rows;
      const float inv = row_inv[(r / g.rows) * T + i];
      float* row = P + r * T;
      for (int64_t j = 0; j <= i; ++j) row[j] = kmath::round_as(row[j] * inv, dtype);
      for (int64_t j = i + 1; j < T; ++j) row[j] = 0.0f;
    }
  }

  void causal_softmax_recompute(float* P, CausalRows g, const float* row_max, const float* row_inv) override {
    const int64_t T = g.T;
#pragma omp parallel for if (g.planes * g.rows * T > kSoftmaxParallelMin)
    for (int64_t r = 0; r < g.planes * g.rows; ++r) {
      const int64_t i = g.row0 + r % g.rows;
      const int64_t at = (r / g.rows) * T + i;
      const float mx = row_max[at], inv = row_inv[at];
      float* row = P + r * T;
      // The forward stored exp_f32(s - mx), then multiplied by inv: the same two roundings.
      for (int64_t j = 0; j <= i; ++j) row[j] = kmath::exp_f32(row[j] - mx) * inv;
      for (int64_t j = i + 1; j < T; ++j) row[j] = 0.0f;
    }
  }

  void causal_softmax_backward(float* dP, const float* P, CausalRows g, float scale) override {
    const int64_t T = g.T;
#pragma omp parallel for if (g.planes * g.rows * T > kSoftmaxParallelMin)
    for (int64_t r = 0; r < g.planes * g.rows; ++r) {
      const int64_t i = g.row0 + r % g.rows;
      const float* pr = P + r * T;
      float* dr = dP + r * T;
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j <= i; ++j) dot += pr[j] * dr[j];
      for (int64_t j = 0; j <= i; ++j) dr[j] = scale * pr[j] * (dr[j] - dot);
      for (int64_t j = i + 1; j < T; ++j) dr[j] = 0.0f;
    }
  }

  // Rows are independent: parallel over rows. The sum of squares in f64 (kernels.h).
  void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t rows, int64_t C,
                       float eps) override {
    add_rmsnorm_forward(nullptr, y, rstd, x, nullptr, w, rows, C, eps, DType::f32);
  }
  // residual null: rmsnorm_forward (sum unused, y as computed when dtype is f32).
  void add_rmsnorm_forward(float* sum, float* y, float* rstd, const float* x, const float* residual, const float* w,
                           int64_t rows, int64_t C, float eps, DType dtype) override {
#pragma omp parallel for if (rows * C > kParallelMin)
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * C;
      float* yr = y + r * C;
      if (residual) {
        const float* rr = residual + r * C;
        float* sr = sum + r * C;
        for (int64_t c = 0; c < C; ++c) sr[c] = kmath::round_as(kmath::add_unfused(xr[c], rr[c]), dtype);
        xr = sr;
      }
      double ss = 0.0;
      for (int64_t c = 0; c < C; ++c) ss += static_cast<double>(xr[c]) * xr[c];
      const float var = static_cast<float>(ss / static_cast<double>(C));
      const float s = 1.0f / std::sqrt(var + eps);  // torch.rsqrt: sqrt, then a division
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yr[c] = w[c] * (xr[c] * s);  // weight * (x * rsqrt): HF's order
      if (dtype != DType::f32)
        for (int64_t c = 0; c < C; ++c) yr[c] = kmath::round_as(yr[c], dtype);
      rstd[r] = s;
    }
  }

  // y = w x s with s = (mean x^2 + eps)^-1/2, ds/dx_k = -s^3 x_k / C:
  // dx_k = s (g_k - x_k s^2 sum_j(g_j x_j) / C), g = dy * w.
  void rope(float* x, const float* cos, const float* sin, int64_t rows, int64_t T, int64_t heads, int64_t D, int64_t ld,
            int64_t pos0, bool backward) override {
    const int64_t half = D / 2;
#pragma omp parallel for if (rows * heads * D > kParallelMin)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t p = pos0 + r % T;
      const float* c = cos + p * half;
      const float* s = sin + p * half;
      for (int64_t h = 0; h < heads; ++h) {
        float* head = x + r * ld + h * D;
        for (int64_t i = 0; i < half; ++i) kmath::rope_pair(head + i, head + half + i, c[i], backward ? -s[i] : s[i]);
      }
    }
  }
  void rmsnorm_backward(float* dx, const float* residual, float* dw, const float* dy, const float* x, const float* w,
                        const float* rstd, int64_t rows, int64_t C) override {
    // dw is a reduction over rows: serial in row order, so the sum never depends on the thread
    // count; fmaf spelled out so both sides round each term alike (the device sums the same terms
    // in another fixed order: kernels_common.cuh's column sums).
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * C;
      const float* dyr = dy + r * C;
      const float s = rstd[r];
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dw[c] = std::fma(xr[c] * s, dyr[c], dw[c]);
    }
    if (!dx) return;
#pragma omp parallel for if (rows * C > kParallelMin)
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * C;
      const float* dyr = dy + r * C;
      float* dxr = dx + r * C;
      const float s = rstd[r];
      double dot = 0.0;  // sum_j g_j x_j in f64, as the forward's sum of squares
      for (int64_t c = 0; c < C; ++c) dot += static_cast<double>(dyr[c] * w[c]) * xr[c];
      const float k = static_cast<float>(dot / static_cast<double>(C)) * s * s;
      if (residual) {
        const float* resr = residual + r * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) dxr[c] = kmath::add_unfused(resr[c], s * std::fma(-xr[c], k, dyr[c] * w[c]));
      } else {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) dxr[c] = s * std::fma(-xr[c], k, dyr[c] * w[c]);
      }
    }
  }

  // One row per (b, h, i): masked keys are skipped, the rest is softmax over scores + bias.
  void attention_softmax_forward(float* P, const float* bias, const int32_t* key_valid, bool causal, int64_t B,
                                 int64_t H, int64_t Tq, int64_t Tk) override {
    const int64_t rows = B * H * Tq;
#pragma omp parallel for if (rows * Tk > kSoftmaxParallelMin)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = r % Tq, h = (r / Tq) % H, b = r / (H * Tq);
      float* row = P + r * Tk;
      const float* br = bias ? bias + (h * Tq + i) * Tk : nullptr;
      const int32_t* kv = key_valid ? key_valid + b * Tk : nullptr;
      // Keys j < end may be unmasked (causal: j <= i).
      const int64_t end = causal ? std::min(i + 1, Tk) : Tk;
      auto valid = [&](int64_t j) { return j < end && (!kv || kv[j] != 0); };
      float mx = -std::numeric_limits<float>::infinity();
      bool any = false;
      for (int64_t j = 0; j < Tk; ++j) {
        if (!valid(j)) continue;
        if (br) row[j] += br[j];
        mx = std::max(mx, row[j]);
        any = true;
      }
      if (!any) {  // every key masked: HF's finfo.min mask makes all scores equal
        std::fill_n(row, Tk, 1.0f / static_cast<float>(Tk));
        continue;
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < Tk; ++j) {
        row[j] = valid(j) ? std::exp(row[j] - mx) : 0.0f;
        sum += row[j];
      }
      for (int64_t j = 0; j < Tk; ++j) row[j] /= sum;  // masked: 0 / sum = 0
    }
  }

  void softmax_backward(float* dP, const float* P, int64_t rows, int64_t Tk) override {
#pragma omp parallel for if (rows * Tk > kSoftmaxParallelMin)
    for (int64_t r = 0; r < rows; ++r) {
      const float* pr = P + r * Tk;
      float* dr = dP + r * Tk;
      float dot = 0.0f;
      for (int64_t j = 0; j < Tk; ++j) dot += pr[j] * dr[j];
      for (int64_t j = 0; j < Tk; ++j) dr[j] = pr[j] * (dr[j] - dot);
    }
  }

  void relative_bias_forward(float* bias, const float* table, const int32_t* bucket, int64_t H, int64_t Tq,
                             int64_t Tk) override {
#pragma omp parallel for if (H * Tq * Tk > kParallelMin)
    for (int64_t hi = 0; hi < H * Tq; ++hi) {
      const int64_t h = hi / Tq, i = hi % Tq;
      const int32_t* bk = bucket + i * Tk;
      float* out = bias + hi * Tk;
      for (int64_t j = 0; j < Tk; ++j) out[j] = table[static_cast<int64_t>(bk[j]) * H + h];
    }
  }

  // Head h only writes column h of dtable: heads go parallel, each in a fixed (i, j, b) order.
  void relative_bias_backward(float* dtable, const float* dS, const int32_t* bucket, int64_t B, int64_t H, int64_t Tq,
                              int64_t Tk) override {
    const int64_t plane = Tq * Tk;
#pragma omp parallel for if (B * H * plane > kParallelMin)
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t ij = 0; ij < plane; ++ij) {
        float s = 0.0f;
        for (int64_t b = 0; b < B; ++b) s += dS[(b * H + h) * plane + ij];
        dtable[static_cast<int64_t>(bucket[ij]) * H + h] += s;
      }
    }
  }

  // ---- Pooling ----

  void maxpool2_forward(float* y, int32_t* argmax, const float* x, int64_t planes, int64_t H, int64_t W) override {
    ops::maxpool2_forward(y, argmax, x, planes, H, W);
  }
  void maxpool2_backward(float* dx, const float* dy, const int32_t* argmax, int64_t planes, int64_t H,
                         int64_t W) override {
    ops::maxpool2_backward(dx, dy, argmax, planes, H, W);
  }

  // ---- Embeddings ----

  void embedding_forward(float* y, const int32_t* tokens, const float* wte, const float* wpe, int64_t B, int64_t T,
                         int64_t C) override {
#pragma omp parallel for
    for (int64_t i = 0; i < B * T; ++i) {
      const float* te = wte + static_cast<int64_t>(tokens[i]) * C;
      float* yr = y + i * C;
      if (!wpe) {  // no position embedding (T5)
        std::copy_n(te, C, yr);
        continue;
      }
      const float* pe = wpe + (i % T) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yr[c] = te[c] + pe[c];
    }
  }

  void embedding_backward(float* dwte, float* dwpe, const float* dy, const int32_t* tokens, int64_t B, int64_t T,
                          int64_t C) override {
    // Serial: several positions may hit the same token row, and a fixed order keeps sums exact.
    for (int64_t i = 0; i < B * T; ++i) {
      if (tokens[i] < 0) continue;  // nn.Embedding's padding_idx: no gradient (kernels.h)
      float* tg = dwte + static_cast<int64_t>(tokens[i]) * C;
      const float* gr = dy + i * C;
      if (!dwpe) {  // no position embedding (T5)
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) tg[c] += gr[c];
        continue;
      }
      float* pg = dwpe + (i % T) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        tg[c] += gr[c];
        pg[c] += gr[c];
      }
    }
  }

  // ---- Losses ----

  // In double so the sum is independent of how the batch is split across ranks.
  void nll_sum(const float* logp, const int32_t* targets, int64_t rows, int64_t C, double* sum,
               int64_t* correct) override {
    double s = 0.0;
    int64_t hits = 0;
    for (int64_t r = 0; r < rows; ++r) {
      if (targets[r] < 0) continue;  // ignored row (kernels.h)
      const float* row = logp + r * C;
      s -= row[targets[r]];
      hits += std::max_element(row, row + C) - row == targets[r];  // the first maximum
    }
    *sum = s;
    *correct = hits;
  }

  void nll_backward(float* d, const int32_t* targets, int64_t rows, int64_t C, float g) override {
    std::memset(d, 0, static_cast<size_t>(rows * C) * sizeof(float));
    for (int64_t r = 0; r < rows; ++r)
      if (targets[r] >= 0) d[r * C + targets[r]] = g;  // ignored rows stay zero
  }

  void cross_entropy_sum(const float* logits, const int32_t* targets, int64_t rows, int64_t C, float* lse, double* sum,
                         int64_t* correct) override {
#pragma omp parallel for if (rows * C > kParallelMin)
    for (int64_t r = 0; r < rows; ++r) {  // ops::log_softmax_forward's lse, step for step
      const float* xr = logits + r * C;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t c = 0; c < C; ++c) mx = std::max(mx, xr[c]);
      float s = 0.0f;
      for (int64_t c = 0; c < C; ++c) s += std::exp(xr[c] - mx);
      // cppcheck-suppress invalidFunctionArg ; s >= 1: the largest element adds exp(0)
      lse[r] = mx + std::log(s);
    }
    double total = 0.0;  // in row order, in double: nll_sum's sum
    int64_t hits = 0;
    for (int64_t r = 0; r < rows; ++r) {
      if (targets[r] < 0) continue;
      const float* xr = logits + r * C;
      total -= xr[targets[r]] - lse[r];
      hits += std::max_element(xr, xr + C) - xr == targets[r];
    }
    *sum = total;
    *correct = hits;
  }

  void cross_entropy_backward_logits(float* d, const float* logits, const float* lse, const int32_t* targets,
                                     int64_t rows, int64_t C, float inv_n) override {
#pragma omp parallel for if (rows * C > kParallelMin)
    for (int64_t r = 0; r < rows; ++r) {
      if (targets[r] < 0) {
        std::fill_n(d + r * C, C, 0.0f);
        continue;
      }
      const float* xr = logits + r * C;
      float* dr = d + r * C;
      const float l = lse[r];
      for (int64_t c = 0; c < C; ++c) dr[c] = std::exp(xr[c] - l) * inv_n;
      dr[targets[r]] -= inv_n;
    }
  }

  void cross_entropy_backward(float* d, const float* logp, const int32_t* targets, int64_t rows, int64_t C,
                              float inv_n) override {
#pragma omp parallel for
    for (int64_t r = 0; r < rows; ++r) {
      if (targets[r] < 0) {  // ignored row: zero gradient
        std::fill_n(d + r * C, C, 0.0f);
        continue;
      }
      for (int64_t c = 0; c < C; ++c) d[r * C + c] = std::exp(logp[r * C + c]) * inv_n;
      d[r * C + targets[r]] -= inv_n;
    }
  }

  // ---- Optimizers: torch 1.13's _single_tensor_* updates, one fused pass ----
  // Every tensor op there rounds to f32 and every Python-float scalar is cast to f32 when it
  // meets a tensor, so each element follows the same sequence of f32 roundings.

  void adamw_step(float* p, const float* g, float* exp_avg, float* exp_avg_sq, int64_t n, const AdamWArgs& a) override {
    float* m = exp_avg;
    float* v = exp_avg_sq;
    const float decay = a.decay, fb1 = a.beta1, one_m_b1 = a.one_minus_beta1;
    const float fb2 = a.beta2, one_m_b2 = a.one_minus_beta2;
    const float bc2_sqrt = a.bias_correction2_sqrt, eps = a.eps, neg_step_size = a.neg_step_size;
    dispatch(
        [&](auto has_wd) {
          parallel_for(n, [=](int64_t i) {
            float pi = p[i];
            if constexpr (has_wd) pi = pi * decay;  // param.mul_(1 - lr*wd)
            const float gi = g[i];
            const float mi = madd(one_m_b1, gi, m[i] * fb1);       // mul_(b1).add_(g, alpha=1-b1)
            const float vi = madd(one_m_b2 * gi, gi, v[i] * fb2);  // mul_(b2).addcmul_(g, g, 1-b2)
            m[i] = mi;
            v[i] = vi;
            const float denom = std::sqrt(vi) / bc2_sqrt + eps;  // (sq.sqrt() / bc2_sqrt).add_(eps)
            // addcdiv_(m, denom, value=-step_size) is an unfused add; madd(x, 1, pi) rounds the
            // same while stopping the compiler from fusing the decay product into it.
            p[i] = madd(neg_step_size * mi / denom, 1.0f, pi);
          });
        },
        a.has_weight_decay);
  }

  void sgd_step(float* p, const float* g, float* momentum_buffer, int64_t n, const SgdArgs& a) override {
    float* buf = momentum_buffer;
    const float wd = a.weight_decay, mom = a.momentum, keep = a.keep, neg_lr = a.neg_lr;
    dispatch(
        [&](auto has_wd, auto has_mom, auto is_first, auto nesterov) {
          parallel_for(n, [=](int64_t i) {
            float d = g[i];
            if constexpr (has_wd) d = madd(wd, p[i], d);  // d_p.add(param, alpha=wd)
            if constexpr (has_mom) {
              float b = d;                                               // the first step clones d_p into the buffer
              if constexpr (!is_first) b = madd(keep, d, buf[i] * mom);  // buf.mul_(momentum).add_(d_p, alpha=1-damp)
              buf[i] = b;
              if constexpr (nesterov)
                d = madd(mom, b, d);  // d_p.add(buf, alpha=momentum)
              else
                d = b;
            }
            p[i] = madd(neg_lr, d, p[i]);  // param.add_(d_p, alpha=-lr)
          });
        },
        a.has_weight_decay, a.has_momentum && buf != nullptr, a.first_step, a.nesterov);
  }

  void adadelta_step(float* p, const float* g, float* square_avg, float* acc_delta, int64_t n,
                     const AdadeltaArgs& a) override {
    float* sq = square_avg;
    float* acc = acc_delta;
    const float wd = a.weight_decay, rho = a.rho, one_m_rho = a.one_minus_rho, eps = a.eps, neg_lr = a.neg_lr;
    dispatch(
        [&](auto has_wd) {
          parallel_for(n, [=](int64_t i) {
            float gi = g[i];
            if constexpr (has_wd) gi = madd(wd, p[i], gi);  // grad.add(param, alpha=wd)
            // square_avg.mul_(rho).addcmul_(grad, grad, value=1-rho)
            const float s = madd(one_m_rho * gi, gi, sq[i] * rho);
            sq[i] = s;
            // std = square_avg.add(eps).sqrt_()
            // delta = acc_delta.add(eps).sqrt_().div_(std).mul_(grad)
            const float delta = std::sqrt(acc[i] + eps) / std::sqrt(s + eps) * gi;
            // acc_delta.mul_(rho).addcmul_(delta, delta, value=1-rho)
            acc[i] = madd(one_m_rho * delta, delta, acc[i] * rho);
            p[i] = madd(neg_lr, delta, p[i]);  // param.add_(delta, alpha=-lr)
          });
        },
        a.has_weight_decay);
  }

  // ---- FSDP ----

  void cast(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) override {
    convert(src, src_dtype, dst, dst_dtype, static_cast<size_t>(n));
  }

  void round_to(float* x, DType dtype, int64_t n) override {
    if (dtype == DType::f32) return;
    if (dtype == DType::bf16)
      elementwise(x, x, nullptr, n, [](float v, float) { return kmath::round_as(v, DType::bf16); });
    else if (dtype == DType::f16)
      elementwise(x, x, nullptr, n, [](float v, float) { return kmath::round_as(v, DType::f16); });
    else
      throw Error("round_to: " + std::string(dtype_name(dtype)) + " is not bf16 or f16");
  }

  // Serial, in index order: the partial sum is the same whatever the thread count.
  double sum_squares(const float* x, int64_t n) override {
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
    return s;
  }

  bool all_finite(const float* x, int64_t n) override {
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(x[i])) return false;
    return true;
  }

 private:
  // causal_softmax_forward (flash false) and causal_softmax_flash: exp(s - max) per row, its sum
  // of the unrounded values; then P divided by it, or (flash) the exponentials rounded to `dtype`.
  static void softmax_rows(float* P, CausalRows g, float* row_max, float* row_inv, bool flash, DType dtype) {
    const int64_t T = g.T;
#pragma omp parallel for if (g.planes * g.rows * T > kSoftmaxParallelMin)
    for (int64_t r = 0; r < g.planes * g.rows; ++r) {
      const int64_t i = g.row0 + r % g.rows;
      float* row = P + r * T;
      const float mx = ops::row_max(row, i + 1);
      // exp_f32 (kernel_math.h) vectorises where glibc's expf is a call per element. The sums
      // (here and in the backward) go in vector-lane partial sums: serially, each add waits
      // for the last.
      for (int64_t j = 0; j <= i; ++j) row[j] = kmath::exp_f32(row[j] - mx);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j <= i; ++j) sum += row[j];
      const float inv = 1.0f / sum;
      if (flash)
        for (int64_t j = 0; j <= i; ++j) row[j] = kmath::round_as(row[j], dtype);
      else
        for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
      for (int64_t j = i + 1; j < T; ++j) row[j] = 0.0f;
      if (row_max) {
        const int64_t at = (r / g.rows) * T + i;
        row_max[at] = mx;
        row_inv[at] = inv;
      }
    }
  }
};

}  // namespace

// Kernels' fused attention where a kernel set has none (the CPU's): the one line that says why.
int64_t Kernels::fused_attention_workspace_bytes(const FusedAttentionShape&, bool) {
  throw Error(fused_attention_unavailable());
}
void Kernels::fused_attention_forward(const FusedAttentionShape&, const uint16_t*, uint16_t*, float*, void*) {
  throw Error(fused_attention_unavailable());
}
void Kernels::fused_attention_backward(const FusedAttentionShape&, const uint16_t*, const uint16_t*, const uint16_t*,
                                       const float*, uint16_t*, void*) {
  throw Error(fused_attention_unavailable());
}

std::unique_ptr<Kernels> make_cpu_kernels() { return std::make_unique<CpuKernels>(); }

Kernels& cpu_kernels() {
  static CpuKernels kernels;  // no state but the matmul precision, which nobody sets on this one
  return kernels;
}

}  // namespace fsdp
