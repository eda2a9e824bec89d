// CudaKernels' normalisation and softmax, one block per row: layernorm, RMS norm, log-softmax, the causal and the
// attention softmaxes, T5's relative position bias (launch.h; kernels_common.cuh: what they share).
#include "tensor/cuda/kernels_common.cuh"

namespace fsdp::cuda::launch {
namespace {

// ---- Normalisation and softmax (one block per row).
// residual not null: sum = x + residual first (each thread writes and then reads back only its
// own columns), normalised; sum and y stored rounded to `dtype` (Kernels::add_layernorm_forward).
__global__ void layernorm_forward_k(float* y, float* mean, float* rstd, const float* x, const float* w, const float* b,
                                    int64_t C, float eps, const float* residual, float* sum, DType dtype) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * C;
  float* yr = y + r * C;
  if (residual) {
    float* sr = sum + r * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
      sr[c] = kmath::round_as(kmath::add_unfused(xr[c], residual[r * C + c]), dtype);
    xr = sr;
  }
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += xr[c];
  const float m = block_reduce(s, Sum{}) / static_cast<float>(C);
  float v = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) v += (xr[c] - m) * (xr[c] - m);
  const float var = block_reduce(v, Sum{}) / static_cast<float>(C);
  const float rs = 1.0f / sqrtf(var + eps);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) yr[c] = kmath::round_as((xr[c] - m) * rs * w[c] + b[c], dtype);
  if (threadIdx.x == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
}
// dx = residual + d(layernorm) where residual is not null: the sum add_k would make of the two.
__global__ void layernorm_dx_k(float* dx, const float* residual, const float* dy, const float* x, const float* w,
                               const float* mean, const float* rstd, int64_t C) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * C;
  const float* dyr = dy + r * C;
  float* dxr = dx + r * C;
  const float m = mean[r], s = rstd[r];
  float sg = 0.0f, sgx = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float g = dyr[c] * w[c];
    sg += g;
    sgx += g * (xr[c] - m) * s;
  }
  const float sum_g = block_reduce(sg, Sum{});
  const float sum_gx = block_reduce(sgx, Sum{});
  const float inv_c = 1.0f / static_cast<float>(C);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float xhat = (xr[c] - m) * s;
    const float d = s * (dyr[c] * w[c] - inv_c * sum_g - xhat * inv_c * sum_gx);
    dxr[c] = residual ? kmath::add_unfused(residual[r * C + c], d) : d;
  }
}
// dw[c] += sum_r (x - mean) * rstd * dy, db[c] += sum_r dy (column sums, as col_sum_add_k).
__global__ void layernorm_dwdb_k(float* dw, float* db, const float* dy, const float* x, const float* mean,
                                 const float* rstd, int64_t rows, int64_t C) {
  const int64_t c = tile_column();
  float aw = 0.0f, ab = 0.0f;
  if (c < C) {
#pragma unroll 4
    for (int64_t r = threadIdx.y; r < rows; r += kRowLanes) {
      const float g = dy[r * C + c];
      aw += (x[r * C + c] - mean[r]) * rstd[r] * g;
      ab += g;
    }
  }
  aw = sum_row_lanes(aw);
  ab = sum_row_lanes(ab);
  if (threadIdx.y == 0 && c < C) {
    dw[c] += aw;
    db[c] += ab;
  }
}
// A row's log-sum-exp (every thread of the block gets it): log_softmax_forward_k's and
// row_logsumexp_k's (Kernels::cross_entropy_sum) one arithmetic.
__device__ float row_lse(const float* xr, int64_t C) {
  float mx = -INFINITY;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) mx = fmaxf(mx, xr[c]);
  mx = block_max(mx);
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += expf(xr[c] - mx);
  return mx + logf(block_reduce(s, Sum{}));
}
__global__ void log_softmax_forward_k(float* y, const float* x, int64_t C) {
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * C;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * C;
  const float lse = row_lse(xr, C);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) yr[c] = xr[c] - lse;
}
__global__ void row_logsumexp_k(float* lse, const float* x, int64_t C) {
  const float l = row_lse(x + static_cast<int64_t>(blockIdx.x) * C, C);
  if (threadIdx.x == 0) lse[blockIdx.x] = l;
}
__global__ void log_softmax_backward_k(float* dx, const float* dy, const float* y, int64_t C) {
  const int64_t off = static_cast<int64_t>(blockIdx.x) * C;
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += dy[off + c];
  const float sum = block_reduce(s, Sum{});
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dx[off + c] = dy[off + c] - expf(y[off + c]) * sum;
}
// One block per (plane, row r) of CausalRows g: query row i = row0 + r keeps j <= i. flash:
// flash attention's P (Kernels::causal_softmax_flash): exp(s - max) rounded to `dtype` and left
// undivided; the sum (and so row_inv) is of the unrounded values either way.
__global__ void causal_softmax_forward_k(float* P, CausalRows g, float* row_max, float* row_inv, bool flash,
                                         DType dtype) {
  const int64_t row = blockIdx.x, i = g.row0 + row % g.rows, T = g.T;
  float* pr = P + row * T;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) mx = fmaxf(mx, pr[j]);
  mx = block_max(mx);
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
    float e = expf(pr[j] - mx);
    pr[j] = flash ? kmath::round_as(e, dtype) : e;
    s += e;
  }
  const float inv = 1.0f / block_reduce(s, Sum{});
  for (int64_t j = threadIdx.x; j < T; j += blockDim.x) pr[j] = j <= i ? (flash ? pr[j] : pr[j] * inv) : 0.0f;
  if (row_max && threadIdx.x == 0) {
    const int64_t at = (row / g.rows) * T + i;
    row_max[at] = mx;
    row_inv[at] = inv;
  }
}
// The forward's P again: it stored expf(s - mx), then multiplied by inv; so does this.
__global__ void causal_softmax_recompute_k(float* P, CausalRows g, const float* row_max, const float* row_inv) {
  const int64_t row = blockIdx.x, i = g.row0 + row % g.rows, T = g.T;
  const int64_t at = (row / g.rows) * T + i;
  const float mx = row_max[at], inv = row_inv[at];
  float* pr = P + row * T;
  for (int64_t j = threadIdx.x; j < T; j += blockDim.x) pr[j] = j <= i ? __fmul_rn(expf(pr[j] - mx), inv) : 0.0f;
}
__global__ void attention_rescale_k(float* y, const float* row_inv, int64_t B, int64_t T, int64_t H, int64_t hd,
                                    int64_t inv_stride, DType dtype) {
  const int64_t n = B * T * H * hd, C = H * hd;
  for (int64_t k = gtid(); k < n; k += gstride()) {
    const int64_t bt = k / C, h = (k % C) / hd, b = bt / T, t = bt % T;
    y[k] = kmath::round_as(y[k] * row_inv[(b * H + h) * inv_stride + t], dtype);
  }
}
__global__ void causal_softmax_normalize_k(float* P, CausalRows g, const float* row_inv, DType dtype) {
  const int64_t row = blockIdx.x, i = g.row0 + row % g.rows, T = g.T;
  const float inv = row_inv[(row / g.rows) * T + i];
  float* pr = P + row * T;
  for (int64_t j = threadIdx.x; j < T; j += blockDim.x) pr[j] = j <= i ? kmath::round_as(pr[j] * inv, dtype) : 0.0f;
}
__global__ void causal_softmax_backward_k(float* dP, const float* P, CausalRows g, float scale) {
  const int64_t row = blockIdx.x, i = g.row0 + row % g.rows, T = g.T;
  const float* pr = P + row * T;
  float* dr = dP + row * T;
  float d = 0.0f;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) d += pr[j] * dr[j];
  const float dot = block_reduce(d, Sum{});
  for (int64_t j = threadIdx.x; j < T; j += blockDim.x) dr[j] = j <= i ? scale * pr[j] * (dr[j] - dot) : 0.0f;
}

// RMS norm (T5LayerNorm), one block per row. The sum of squares in f64 as on the host: each
// term x*x is exact in f64, so host and device differ only by f64 summation order, far below
// the f32 rounding of the mean; the rest is the host's f32 expression, operation for operation.
// residual: as layernorm_forward_k's.
__global__ void rmsnorm_forward_k(float* y, float* rstd, const float* x, const float* w, int64_t C, float eps,
                                  const float* residual, float* sum, DType dtype) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * C;
  float* yr = y + r * C;
  if (residual) {
    float* sr = sum + r * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
      sr[c] = kmath::round_as(kmath::add_unfused(xr[c], residual[r * C + c]), dtype);
    xr = sr;
  }
  double ss = 0.0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) ss += static_cast<double>(xr[c]) * xr[c];
  const float var = static_cast<float>(block_reduce(ss, Sum{}) / static_cast<double>(C));
  const float rs = 1.0f / sqrtf(var + eps);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) yr[c] = kmath::round_as(w[c] * (xr[c] * rs), dtype);
  if (threadIdx.x == 0) rstd[r] = rs;
}
// dx = s * (g - x * (s^2 * dot / C)), g = dy * w, dot = sum g x in f64 (see the forward).
__global__ void rmsnorm_dx_k(float* dx, const float* residual, const float* dy, const float* x, const float* w,
                             const float* rstd, int64_t C) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * C;
  const float* dyr = dy + r * C;
  float* dxr = dx + r * C;
  const float s = rstd[r];
  double d = 0.0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) d += static_cast<double>(dyr[c] * w[c]) * xr[c];
  const float k = static_cast<float>(block_reduce(d, Sum{}) / static_cast<double>(C)) * s * s;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = s * fmaf(-xr[c], k, dyr[c] * w[c]);
    dxr[c] = residual ? kmath::add_unfused(residual[r * C + c], v) : v;
  }
}
// dw[c] += sum_r x * rstd * dy: the host's fmaf terms, summed as col_sum_add_k.
__global__ void rmsnorm_dw_k(float* dw, const float* dy, const float* x, const float* rstd, int64_t rows, int64_t C) {
  const int64_t c = tile_column();
  float aw = 0.0f;
  if (c < C) {
#pragma unroll 4
    for (int64_t r = threadIdx.y; r < rows; r += kRowLanes) aw = fmaf(x[r * C + c] * rstd[r], dy[r * C + c], aw);
  }
  aw = sum_row_lanes(aw);
  if (threadIdx.y == 0 && c < C) dw[c] += aw;
}
// One block per (b, h, i) row of P (B, H, Tq, Tk); the host's order of operations (kernels.h).
__global__ void attention_softmax_forward_k(float* P, const float* bias, const int32_t* key_valid, bool causal,
                                            int64_t H, int64_t Tq, int64_t Tk) {
  const int64_t r = blockIdx.x, i = r % Tq, h = (r / Tq) % H, b = r / (H * Tq);
  float* row = P + r * Tk;
  const float* br = bias ? bias + (h * Tq + i) * Tk : nullptr;
  const int32_t* kv = key_valid ? key_valid + b * Tk : nullptr;
  const int64_t end = causal ? (i + 1 < Tk ? i + 1 : Tk) : Tk;
  float mx = -INFINITY;
  int any = 0;
  for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x) {
    if (j >= end || (kv && kv[j] == 0)) continue;
    if (br) row[j] += br[j];
    mx = fmaxf(mx, row[j]);
    any = 1;
  }
  mx = block_max(mx);
  if (block_reduce(any, Sum{}) == 0) {  // every key masked: uniform (block-wide, so no divergence)
    const float u = 1.0f / static_cast<float>(Tk);
    for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x) row[j] = u;
    return;
  }
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x) {
    const float e = (j >= end || (kv && kv[j] == 0)) ? 0.0f : expf(row[j] - mx);
    row[j] = e;
    s += e;
  }
  const float sum = block_reduce(s, Sum{});
  for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x) row[j] = row[j] / sum;
}
__global__ void softmax_backward_k(float* dP, const float* P, int64_t Tk) {
  const int64_t off = static_cast<int64_t>(blockIdx.x) * Tk;
  float d = 0.0f;
  for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x) d += P[off + j] * dP[off + j];
  const float dot = block_reduce(d, Sum{});
  for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x) dP[off + j] = P[off + j] * (dP[off + j] - dot);
}
__global__ void relative_bias_forward_k(float* bias, const float* table, const int32_t* bucket, int64_t H, int64_t Tq,
                                        int64_t Tk) {
  const int64_t plane = Tq * Tk;
  for (int64_t idx = gtid(); idx < H * plane; idx += gstride())
    bias[idx] = table[static_cast<int64_t>(bucket[idx % plane]) * H + idx / plane];
}
// One thread per (h, i, j) sums dS over b in order, then the lanes of a warp that share a table
// entry (__match_any_sync; T5's buckets come in runs along j) add their sums in lane order and
// one of them adds that to dtable with an atomic: far fewer atomics than one per element, but
// the order of the atomics across warps varies from run to run (not bitwise reproducible; the
// host is). Loops run warp-uniformly (base = the warp's first index) so every lane takes part in
// the warp intrinsics.
__global__ void relative_bias_backward_k(float* dtable, const float* dS, const int32_t* bucket, int64_t B, int64_t H,
                                         int64_t Tq, int64_t Tk) {
  const int64_t plane = Tq * Tk, n = H * plane;
  const int lane = static_cast<int>(threadIdx.x & 31);
  for (int64_t base = gtid() - lane; base < n; base += gstride()) {
    const int64_t idx = base + lane;
    long long key = -1;  // index into dtable; -1 past the end
    float s = 0.0f;
    if (idx < n) {
      const int64_t h = idx / plane, ij = idx % plane;
      for (int64_t b = 0; b < B; ++b) s += dS[(b * H + h) * plane + ij];
      key = static_cast<long long>(bucket[ij]) * H + h;
    }
    const unsigned peers = __match_any_sync(0xffffffffu, key);
    float acc = 0.0f;
    for (int l = 0; l < 32; ++l) {
      const float v = __shfl_sync(0xffffffffu, s, l);
      if ((peers >> l) & 1u) acc += v;
    }
    if (key >= 0 && lane == __ffs(peers) - 1) atomicAdd(&dtable[key], acc);
  }
}

}  // namespace

void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w, const float* b, int64_t rows,
                       int64_t C, float eps, cudaStream_t s, const float* residual, float* sum, DType dtype) {
  if (rows == 0) return;
  layernorm_forward_k<<<rows_grid(rows, "layernorm_forward"), kThreads, 0, s>>>(y, mean, rstd, x, w, b, C, eps,
                                                                                residual, sum, dtype);
  check_launch("layernorm_forward");
}
void layernorm_backward(float* dx, const float* residual, float* dw, float* db, const float* dy, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t rows, int64_t C, cudaStream_t s) {
  if (rows == 0) return;
  layernorm_dwdb_k<<<column_tiles(C), dim3(kColTile, kRowLanes), 0, s>>>(dw, db, dy, x, mean, rstd, rows, C);
  check_launch("layernorm_backward (dw, db)");
  layernorm_dx_k<<<rows_grid(rows, "layernorm_backward"), kThreads, 0, s>>>(dx, residual, dy, x, w, mean, rstd, C);
  check_launch("layernorm_backward (dx)");
}
void log_softmax_forward(float* y, const float* x, int64_t rows, int64_t C, cudaStream_t s) {
  if (rows == 0) return;
  log_softmax_forward_k<<<rows_grid(rows, "log_softmax_forward"), kThreads, 0, s>>>(y, x, C);
  check_launch("log_softmax_forward");
}
void row_logsumexp(float* lse, const float* x, int64_t rows, int64_t C, cudaStream_t s) {
  if (rows == 0) return;
  row_logsumexp_k<<<rows_grid(rows, "row_logsumexp"), kThreads, 0, s>>>(lse, x, C);
  check_launch("row_logsumexp");
}
void log_softmax_backward(float* dx, const float* dy, const float* y, int64_t rows, int64_t C, cudaStream_t s) {
  if (rows == 0) return;
  log_softmax_backward_k<<<rows_grid(rows, "log_softmax_backward"), kThreads, 0, s>>>(dx, dy, y, C);
  check_launch("log_softmax_backward");
}
void causal_softmax_forward(float* P, CausalRows g, float* row_max, float* row_inv, cudaStream_t s) {
  if (g.planes * g.rows * g.T == 0) return;
  causal_softmax_forward_k<<<rows_grid(g.planes * g.rows, "causal_softmax_forward"), kThreads, 0, s>>>(
      P, g, row_max, row_inv, false, DType::f32);
  check_launch("causal_softmax_forward");
}
void causal_softmax_recompute(float* P, CausalRows g, const float* row_max, const float* row_inv, cudaStream_t s) {
  if (g.planes * g.rows * g.T == 0) return;
  causal_softmax_recompute_k<<<rows_grid(g.planes * g.rows, "causal_softmax_recompute"), kThreads, 0, s>>>(
      P, g, row_max, row_inv);
  check_launch("causal_softmax_recompute");
}
void causal_softmax_flash(float* P, CausalRows g, float* row_max, float* row_inv, DType dtype, cudaStream_t s) {
  if (g.planes * g.rows * g.T == 0) return;
  causal_softmax_forward_k<<<rows_grid(g.planes * g.rows, "causal_softmax_flash"), kThreads, 0, s>>>(
      P, g, row_max, row_inv, true, dtype);
  check_launch("causal_softmax_flash");
}
void attention_rescale(float* y, const float* row_inv, int64_t B, int64_t T, int64_t H, int64_t hd, int64_t inv_stride,
                       DType dtype, cudaStream_t s) {
  if (B * T * H * hd == 0) return;
  attention_rescale_k<<<blocks_for(B * T * H * hd), kThreads, 0, s>>>(y, row_inv, B, T, H, hd, inv_stride, dtype);
  check_launch("attention_rescale");
}
void causal_softmax_normalize(float* P, CausalRows g, const float* row_inv, DType dtype, cudaStream_t s) {
  if (g.planes * g.rows * g.T == 0) return;
  causal_softmax_normalize_k<<<rows_grid(g.planes * g.rows, "causal_softmax_normalize"), kThreads, 0, s>>>(
      P, g, row_inv, dtype);
  check_launch("causal_softmax_normalize");
}
void causal_softmax_backward(float* dP, const float* P, CausalRows g, float scale, cudaStream_t s) {
  if (g.planes * g.rows * g.T == 0) return;
  causal_softmax_backward_k<<<rows_grid(g.planes * g.rows, "causal_softmax_backward"), kThreads, 0, s>>>(dP, P, g,
                                                                                                         scale);
  check_launch("causal_softmax_backward");
}
void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t rows, int64_t C, float eps,
                     cudaStream_t s, const float* residual, float* sum, DType dtype) {
  if (rows == 0) return;
  rmsnorm_forward_k<<<rows_grid(rows, "rmsnorm_forward"), kThreads, 0, s>>>(y, rstd, x, w, C, eps, residual, sum,
                                                                            dtype);
  check_launch("rmsnorm_forward");
}
void rmsnorm_backward(float* dx, const float* residual, float* dw, const float* dy, const float* x, const float* w,
                      const float* rstd, int64_t rows, int64_t C, cudaStream_t s) {
  if (rows == 0 || C == 0) return;
  rmsnorm_dw_k<<<column_tiles(C), dim3(kColTile, kRowLanes), 0, s>>>(dw, dy, x, rstd, rows, C);
  check_launch("rmsnorm_backward (dw)");
  if (!dx) return;
  rmsnorm_dx_k<<<rows_grid(rows, "rmsnorm_backward"), kThreads, 0, s>>>(dx, residual, dy, x, w, rstd, C);
  check_launch("rmsnorm_backward (dx)");
}
void attention_softmax_forward(float* P, const float* bias, const int32_t* key_valid, bool causal, int64_t B, int64_t H,
                               int64_t Tq, int64_t Tk, cudaStream_t s) {
  if (B * H * Tq == 0 || Tk == 0) return;
  attention_softmax_forward_k<<<rows_grid(B * H * Tq, "attention_softmax_forward"), kThreads, 0, s>>>(
      P, bias, key_valid, causal, H, Tq, Tk);
  check_launch("attention_softmax_forward");
}
void softmax_backward(float* dP, const float* P, int64_t rows, int64_t Tk, cudaStream_t s) {
  if (rows == 0 || Tk == 0) return;
  softmax_backward_k<<<rows_grid(rows, "softmax_backward"), kThreads, 0, s>>>(dP, P, Tk);
  check_launch("softmax_backward");
}
void relative_bias_forward(float* bias, const float* table, const int32_t* bucket, int64_t H, int64_t Tq, int64_t Tk,
                           cudaStream_t s) {
  if (H * Tq * Tk == 0) return;
  relative_bias_forward_k<<<blocks_for(H * Tq * Tk), kThreads, 0, s>>>(bias, table, bucket, H, Tq, Tk);
  check_launch("relative_bias_forward");
}
void relative_bias_backward(float* dtable, const float* dS, const int32_t* bucket, int64_t B, int64_t H, int64_t Tq,
                            int64_t Tk, cudaStream_t s) {
  if (H * Tq * Tk == 0) return;
  relative_bias_backward_k<<<blocks_for(H * Tq * Tk), kThreads, 0, s>>>(dtable, dS, bucket, B, H, Tq, Tk);
  check_launch("relative_bias_backward");
}

}  // namespace fsdp::cuda::launch
