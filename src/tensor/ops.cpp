#include "tensor/ops.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tensor/kernel_math.h"

namespace fsdp::ops {

float round_to_tf32(float x) { return kmath::round_to_tf32(x); }

float round_to_bf16(float x) { return kmath::bf16_to_f32(kmath::f32_to_bf16(x)); }

namespace {

// The stored matrix (rows, cols) at leading dimension ld, rounded to `precision`, packed dense.
std::vector<float> rounded_copy(const float* X, int64_t rows, int64_t cols, int64_t ld, MatmulPrecision precision) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  const bool tf32 = precision == MatmulPrecision::high;
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = X + r * ld;
    float* dst = out.data() + r * cols;
    for (int64_t c = 0; c < cols; ++c) dst[c] = tf32 ? round_to_tf32(src[c]) : round_to_bf16(src[c]);
  }
  return out;
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc, MatmulPrecision precision) {
  if (M == 0 || N == 0) return;
  if (precision != MatmulPrecision::highest) {
    // Round copies (the stored layout, packed): then the same sgemm. Host memory outside the
    // tracker, transient (the GPU's copies are device memory, charged: matmul_precision.h).
    const int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
    const int64_t b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
    const std::vector<float> a = rounded_copy(A, a_rows, a_cols, lda, precision);
    const std::vector<float> b = rounded_copy(B, b_rows, b_cols, ldb, precision);
    gemm(trans_a, trans_b, M, N, K, alpha, a.data(), std::max<int64_t>(a_cols, 1), b.data(),
         std::max<int64_t>(b_cols, 1), beta, C, ldc);
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
              static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C, static_cast<blasint>(ldc));
}

void linear_forward(float* Y, const float* X, const float* W, const float* b, int64_t rows, int64_t in, int64_t out,
                    MatmulPrecision precision) {
  if (b) {
    // Seeding Y with the bias lets one GEMM with beta = 1 do the add.
    for (int64_t r = 0; r < rows; ++r) std::memcpy(Y + r * out, b, out * sizeof(float));
  }
  gemm(false, true, rows, out, in, 1.0f, X, in, W, in, b ? 1.0f : 0.0f, Y, out, precision);
}

void linear_backward(float* dX, float* dW, float* db, const float* dY, const float* X, const float* W, int64_t rows,
                     int64_t in, int64_t out, MatmulPrecision precision) {
  gemm(true, false, out, in, rows, 1.0f, dY, out, X, in, 1.0f, dW, in, precision);
  if (db) {
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = dY + r * out;
#pragma omp simd
      for (int64_t o = 0; o < out; ++o) db[o] += row[o];
    }
  }
  if (dX) gemm(false, false, rows, in, out, 1.0f, dY, out, W, in, 0.0f, dX, in, precision);
}

void im2col(const float* image, float* col, int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW, int64_t pad,
            int64_t OH, int64_t OW, int64_t col_ld) {
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t kh = 0; kh < KH; ++kh) {
      for (int64_t kw = 0; kw < KW; ++kw) {
        float* dst = col + ((c * KH + kh) * KW + kw) * col_ld;
        for (int64_t oh = 0; oh < OH; ++oh) {
          int64_t ih = oh + kh - pad;
          float* d = dst + oh * OW;
          if (ih < 0 || ih >= H) {
            std::memset(d, 0, OW * sizeof(float));
            continue;
          }
          const float* src = image + (c * H + ih) * W;
          for (int64_t ow = 0; ow < OW; ++ow) {
            int64_t iw = ow + kw - pad;
            d[ow] = (iw >= 0 && iw < W) ? src[iw] : 0.0f;
          }
        }
      }
    }
  }
}

void col2im(const float* col, float* image, int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW, int64_t pad,
            int64_t OH, int64_t OW, int64_t col_ld) {
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t kh = 0; kh < KH; ++kh) {
      for (int64_t kw = 0; kw < KW; ++kw) {
        const float* src = col + ((c * KH + kh) * KW + kw) * col_ld;
        for (int64_t oh = 0; oh < OH; ++oh) {
          int64_t ih = oh + kh - pad;
          if (ih < 0 || ih >= H) continue;
          float* dst = image + (c * H + ih) * W;
          const float* s = src + oh * OW;
          for (int64_t ow = 0; ow < OW; ++ow) {
            int64_t iw = ow + kw - pad;
            if (iw >= 0 && iw < W) dst[iw] += s[ow];
          }
        }
      }
    }
  }
}

// PyTorch's relu is clamp_min(x, 0): NaN stays NaN (a diverged run must show a NaN loss, not
// have its NaNs zeroed here) and -0 stays -0. Its backward is threshold_backward(dy, y, 0):
// zero where y <= 0, so a NaN output passes the gradient through.
void relu_forward(float* y, const float* x, int64_t n) {
#pragma omp parallel for simd if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] < 0.0f ? 0.0f : x[i];
}

void relu_backward(float* dx, const float* dy, const float* y, int64_t n) {
#pragma omp parallel for simd if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) dx[i] = y[i] <= 0.0f ? 0.0f : dy[i];
}

// GELU is kernel_math.h's, the CUDA kernels' too: its backward spells the one fused multiply-add
// out, so the bits do not depend on how a compiler contracts `cdf + x * pdf` (GCC's default
// -ffp-contract=fast fuses across statements, clang's =on only inside one expression).
//
// Both go in blocks of 16 inputs. A block whose inputs all have |x / sqrt 2| < 1 (most of a
// transformer's pre-activations: at the bench transformer's init their spread is about 0.45)
// takes erf's small branch only; any other block, and the tail, evaluates both of erf's branches
// and selects, as the device does. The same bits either way (test_kernel_math
// gelu_block_dispatch): erf's polynomial and exp for |x| >= 1 were half of GELU's time, and GELU
// 3.7% of the bench transformer's step.
namespace {
constexpr int64_t kGeluBlock = 16;

bool gelu_block_small(const float* x) {
  int small = 0;
#pragma omp simd reduction(+ : small)
  for (int64_t i = 0; i < kGeluBlock; ++i) small += kmath::gelu_erf_is_small(x[i]) ? 1 : 0;
  return small == kGeluBlock;
}
}  // namespace

void gelu_forward(float* y, const float* x, int64_t n) {
  const int64_t blocks = n / kGeluBlock;
#pragma omp parallel for if (n > kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * kGeluBlock;
    float* yb = y + b * kGeluBlock;
    // NOLINTNEXTLINE(bugprone-branch-clone): the branches differ in erf's template argument
    if (gelu_block_small(xb)) {
#pragma omp simd
      for (int64_t i = 0; i < kGeluBlock; ++i) yb[i] = kmath::gelu_forward<true>(xb[i]);
    } else {
#pragma omp simd
      for (int64_t i = 0; i < kGeluBlock; ++i) yb[i] = kmath::gelu_forward(xb[i]);
    }
  }
  for (int64_t i = blocks * kGeluBlock; i < n; ++i) y[i] = kmath::gelu_forward(x[i]);
}

void gelu_backward(float* dx, const float* dy, const float* x, int64_t n) {
  const int64_t blocks = n / kGeluBlock;
#pragma omp parallel for if (n > kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * kGeluBlock;
    const float* dyb = dy + b * kGeluBlock;
    float* dxb = dx + b * kGeluBlock;
    // NOLINTNEXTLINE(bugprone-branch-clone): the branches differ in erf's template argument
    if (gelu_block_small(xb)) {
#pragma omp simd
      for (int64_t i = 0; i < kGeluBlock; ++i) dxb[i] = kmath::gelu_backward<true>(dyb[i], xb[i]);
    } else {
#pragma omp simd
      for (int64_t i = 0; i < kGeluBlock; ++i) dxb[i] = kmath::gelu_backward(dyb[i], xb[i]);
    }
  }
  for (int64_t i = blocks * kGeluBlock; i < n; ++i) dx[i] = kmath::gelu_backward(dy[i], x[i]);
}

void add(float* y, const float* a, const float* b, int64_t n) {
#pragma omp parallel for simd if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for simd if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w, const float* b, int64_t rows,
                       int64_t C, float eps, const float* residual, float* sum, DType round) {
#pragma omp parallel for if (rows * C > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    if (residual) {  // the residual stream first: its row is then normalised from memory just written
      const float* rr = residual + r * C;
      float* sr = sum + r * C;
      for (int64_t c = 0; c < C; ++c) sr[c] = kmath::round_as(kmath::add_unfused(xr[c], rr[c]), round);
      xr = sr;
    }
    // Vector-lane partial sums: a serial float sum waits on each add's latency (the row sums were
    // most of this kernel's time); any order is as close to torch's Welford moments as the other.
    float m = 0.0f;
#pragma omp simd reduction(+ : m)
    for (int64_t c = 0; c < C; ++c) m += xr[c];
    m /= static_cast<float>(C);
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int64_t c = 0; c < C; ++c) v += (xr[c] - m) * (xr[c] - m);
    v /= static_cast<float>(C);
    float s = 1.0f / std::sqrt(v + eps);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * s * w[c] + b[c];
    if (round != DType::f32)
      for (int64_t c = 0; c < C; ++c) yr[c] = kmath::round_as(yr[c], round);
    mean[r] = m;
    rstd[r] = s;
  }
}

namespace {

// One row of layernorm's dx (= residual + d(layernorm) where residual is not null).
inline void layernorm_dx_row(float* dxr, const float* resr, const float* dyr, const float* xr, const float* w, float m,
                             float s, int64_t C) {
  float sum_g = 0.0f, sum_gx = 0.0f;  // g = dy * w; x_hat = (x - m) * s
#pragma omp simd reduction(+ : sum_g, sum_gx)
  for (int64_t c = 0; c < C; ++c) {
    float g = dyr[c] * w[c];
    sum_g += g;
    sum_gx += g * (xr[c] - m) * s;
  }
  float inv_c = 1.0f / static_cast<float>(C);
  if (resr) {
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      float xhat = (xr[c] - m) * s;
      // Rounded as add() rounds resr + (the stored dx): the sum must not fuse with the product.
      dxr[c] = kmath::add_unfused(resr[c], s * (dyr[c] * w[c] - inv_c * sum_g - xhat * inv_c * sum_gx));
    }
  } else {
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      float xhat = (xr[c] - m) * s;
      dxr[c] = s * (dyr[c] * w[c] - inv_c * sum_g - xhat * inv_c * sum_gx);
    }
  }
}

// dw, db += one row's terms. Rows go in order on one thread: the sum order (and result) never
// depends on the thread count.
inline void layernorm_dwdb_row(float* dw, float* db, const float* dyr, const float* xr, float m, float s, int64_t C) {
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) {
    dw[c] += (xr[c] - m) * s * dyr[c];
    db[c] += dyr[c];
  }
}

}  // namespace

void layernorm_backward(float* dx, const float* residual, float* dw, float* db, const float* dy, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t rows, int64_t C) {
  const bool parallel = rows * C > kParallelMin && omp_get_max_threads() > 1;
  if (!parallel) {
    // One pass: each row's x and dy are read from memory once for dw, db and dx.
    for (int64_t r = 0; r < rows; ++r) {
      layernorm_dwdb_row(dw, db, dy + r * C, x + r * C, mean[r], rstd[r], C);
      layernorm_dx_row(dx + r * C, residual ? residual + r * C : nullptr, dy + r * C, x + r * C, w, mean[r], rstd[r],
                       C);
    }
    return;
  }
  for (int64_t r = 0; r < rows; ++r) layernorm_dwdb_row(dw, db, dy + r * C, x + r * C, mean[r], rstd[r], C);
#pragma omp parallel for
  for (int64_t r = 0; r < rows; ++r)
    layernorm_dx_row(dx + r * C, residual ? residual + r * C : nullptr, dy + r * C, x + r * C, w, mean[r], rstd[r], C);
}

void log_softmax_forward(float* y, const float* x, int64_t rows, int64_t C) {
#pragma omp parallel for if (rows * C > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t c = 0; c < C; ++c) mx = std::max(mx, xr[c]);
    float sum = 0.0f;
    for (int64_t c = 0; c < C; ++c) sum += std::exp(xr[c] - mx);
    // cppcheck-suppress invalidFunctionArg ; sum >= 1: the largest element adds exp(0)
    float lse = mx + std::log(sum);
    for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] - lse;
  }
}

void log_softmax_backward(float* dx, const float* dy, const float* y, int64_t rows, int64_t C) {
#pragma omp parallel for if (rows * C > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* dyr = dy + r * C;
    const float* yr = y + r * C;
    float* dxr = dx + r * C;
    float sum = 0.0f;
    for (int64_t c = 0; c < C; ++c) sum += dyr[c];
    for (int64_t c = 0; c < C; ++c) dxr[c] = dyr[c] - std::exp(yr[c]) * sum;
  }
}

void maxpool2_forward(float* y, int32_t* argmax, const float* x, int64_t planes, int64_t H, int64_t W) {
  int64_t OH = H / 2, OW = W / 2;
#pragma omp parallel for if (planes * H * W > kParallelMin)
  for (int64_t p = 0; p < planes; ++p) {
    const float* xp = x + p * H * W;
    float* yp = y + p * OH * OW;
    int32_t* ap = argmax + p * OH * OW;
    for (int64_t oh = 0; oh < OH; ++oh) {
      for (int64_t ow = 0; ow < OW; ++ow) {
        int64_t best = (2 * oh) * W + 2 * ow;
        // PyTorch scans the window row-major and keeps the first maximum (NaN wins).
        for (int64_t k : {best + 1, best + W, best + W + 1}) {
          if (xp[k] > xp[best] || std::isnan(xp[k])) best = k;
        }
        yp[oh * OW + ow] = xp[best];
        ap[oh * OW + ow] = static_cast<int32_t>(best);
      }
    }
  }
}

void maxpool2_backward(float* dx, const float* dy, const int32_t* argmax, int64_t planes, int64_t H, int64_t W) {
  int64_t OH = H / 2, OW = W / 2;
  std::memset(dx, 0, planes * H * W * sizeof(float));
#pragma omp parallel for if (planes * H * W > kParallelMin)
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t i = 0; i < OH * OW; ++i) dx[p * H * W + argmax[p * OH * OW + i]] += dy[p * OH * OW + i];
  }
}

}  // namespace fsdp::ops
