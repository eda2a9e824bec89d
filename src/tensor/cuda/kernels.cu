// The CUDA kernels of CudaKernels (launch.h). Elementwise work uses grid-stride loops; row-wise
// work (layernorm, RMS norm, softmaxes) one block per row; column sums (bias and norm weight
// grads) a block per 32 columns whose row lanes split the rows ("Column sums" below), in a
// fixed order: deterministic (no atomics), not the CPU's row order (within tolerance of it).
// Scatters with duplicates (embedding and relative-bias grads) use atomics. Reductions to a host
// value are two deterministic passes (per-block partials, then one block over the partials).
// The per-element math shared with the host (GELU, dropout's Philox, bf16/f16 rounding,
// optimizer updates) is tensor/kernel_math.h.
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "tensor/cuda/launch.h"
#include "tensor/error.h"
#include "tensor/kernel_math.h"

namespace fsdp::cuda::launch {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

int blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  return static_cast<int>(b < kMaxBlocks ? b : kMaxBlocks);
}

void check_launch(const char* kernel) {
  cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess)
    throw Error(std::string("cuda: ") + kernel + " launch: " + cudaGetErrorString(rc) + " (kernels.cu)");
}

__device__ inline int64_t gtid() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t gstride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// Block-wide reductions (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
template <class T, class Op>
__device__ T block_reduce(T v, Op op) {
  __shared__ T warp_vals[32];
  __shared__ T result;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_vals[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int nwarps = (blockDim.x + 31) >> 5;
    v = lane < nwarps ? warp_vals[lane] : warp_vals[0];
    if (lane >= nwarps) v = T{};
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
    if (lane == 0) result = v;
  }
  __syncthreads();
  T r = result;
  __syncthreads();  // result and warp_vals may be reused by the next call
  return r;
}
struct Sum {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
__device__ float block_max(float v) {
  // block_reduce's zero padding would be wrong for max: pad with -inf instead.
  __shared__ float warp_vals[32];
  __shared__ float result;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_vals[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int nwarps = (blockDim.x + 31) >> 5;
    v = lane < nwarps ? warp_vals[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
    if (lane == 0) result = v;
  }
  __syncthreads();
  float r = result;
  __syncthreads();
  return r;
}

// ---- Column sums (bias, layernorm and RMS norm weight gradients).
// A column sum over B*T rows is a long dependent chain per column: one thread per column (as
// these kernels were first written) keeps a handful of loads in flight per SM, fills a few SMs
// for d_model columns, and waited on memory latency rows times (milliseconds per call at 8192
// rows, about a hundred calls per step of a 16-layer model). Here a block owns kColTile adjacent
// columns (threadIdx.x: coalesced rows) and kRowLanes row lanes (threadIdx.y); lane y sums rows
// y, y + kRowLanes, ... in order, and the lanes' partials meet in a fixed tree: the same bits in
// every run.
constexpr int kColTile = 32;
constexpr int kRowLanes = 32;

// This thread's column; past the last column in the last tile's spare threads.
__device__ inline int64_t tile_column() { return static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x; }
int column_tiles(int64_t cols) {
  const int64_t tiles = (cols + kColTile - 1) / kColTile;
  if (tiles > 0x7fffffff) throw Error("cuda: column sums: too many columns for one grid");
  return static_cast<int>(tiles);
}
// The sum over the row lanes of v, added in a fixed tree; valid in lane threadIdx.y == 0. Every
// thread of the block must call it (it synchronises the block).
__device__ float sum_row_lanes(float v) {
  __shared__ float part[kRowLanes][kColTile + 1];  // +1: no bank conflicts down a column
  part[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  for (int half = kRowLanes / 2; half > 0; half >>= 1) {
    if (static_cast<int>(threadIdx.y) < half) part[threadIdx.y][threadIdx.x] += part[threadIdx.y + half][threadIdx.x];
    __syncthreads();
  }
  const float r = part[0][threadIdx.x];
  __syncthreads();  // part may be reused by the next call
  return r;
}

// ---- Linear / conv helpers.
// Y[r, :] = b, a block row of columns per grid row (no per-element index division).
__global__ void bias_rows_k(float* Y, const float* b, int64_t rows, int64_t out) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    float* yr = Y + r * out;
    for (int64_t c = gtid(); c < out; c += gstride()) yr[c] = b[c];
  }
}
// db[c] += sum over r of dY[r, c].
__global__ void col_sum_add_k(float* db, const float* dY, int64_t rows, int64_t out) {
  const int64_t c = tile_column();
  float acc = 0.0f;
  if (c < out) {
#pragma unroll 4
    for (int64_t r = threadIdx.y; r < rows; r += kRowLanes) acc += dY[r * out + c];
  }
  acc = sum_row_lanes(acc);
  if (threadIdx.y == 0 && c < out) db[c] += acc;
}
__global__ void im2col_k(const float* x, float* col, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K, int64_t pad,
                         int64_t OH, int64_t OW) {
  const int64_t P = OH * OW, ld = B * P, total = C * K * K * ld;
  for (int64_t i = gtid(); i < total; i += gstride()) {
    int64_t row = i / ld, colj = i % ld;
    int64_t b = colj / P, p = colj % P, oh = p / OW, ow = p % OW;
    int64_t kw = row % K, kh = (row / K) % K, c = row / (K * K);
    int64_t ih = oh + kh - pad, iw = ow + kw - pad;
    col[i] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? x[((b * C + c) * H + ih) * W + iw] : 0.0f;
  }
}
// Gather form of col2im: each dx element sums its column entries (no atomics; overwrites dx).
__global__ void col2im_k(const float* dcol, float* dx, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K,
                         int64_t pad, int64_t OH, int64_t OW) {
  const int64_t P = OH * OW, ld = B * P, total = B * C * H * W;
  for (int64_t i = gtid(); i < total; i += gstride()) {
    int64_t iw = i % W, ih = (i / W) % H, c = (i / (W * H)) % C, b = i / (W * H * C);
    float acc = 0.0f;
    for (int64_t kh = 0; kh < K; ++kh) {
      int64_t oh = ih - kh + pad;
      if (oh < 0 || oh >= OH) continue;
      for (int64_t kw = 0; kw < K; ++kw) {
        int64_t ow = iw - kw + pad;
        if (ow < 0 || ow >= OW) continue;
        acc += dcol[((c * K + kh) * K + kw) * ld + b * P + oh * OW + ow];
      }
    }
    dx[i] = acc;
  }
}
__global__ void conv_bias_permute_k(float* y, const float* ybuf, const float* bias, int64_t B, int64_t out, int64_t P) {
  for (int64_t i = gtid(); i < B * out * P; i += gstride()) {
    int64_t p = i % P, o = (i / P) % out, b = i / (P * out);
    y[i] = ybuf[o * B * P + b * P + p] + bias[o];
  }
}
__global__ void conv_permute_k(float* dyt, const float* dy, int64_t B, int64_t out, int64_t P) {
  for (int64_t i = gtid(); i < B * out * P; i += gstride()) {
    int64_t p = i % P, o = (i / P) % out, b = i / (P * out);
    dyt[o * B * P + b * P + p] = dy[i];
  }
}
// db[o] += sum of row o of dyt (out, B*P): one block per o.
__global__ void row_sum_add_k(float* db, const float* dyt, int64_t cols) {
  const float* row = dyt + static_cast<int64_t>(blockIdx.x) * cols;
  float acc = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) acc += row[j];
  acc = block_reduce(acc, Sum{});
  if (threadIdx.x == 0) db[blockIdx.x] += acc;
}

// ---- Elementwise.
// One element of `op`: a and b its inputs (b only where the op has a second), y the old output
// (add_inplace only).
__device__ inline float apply(Unary op, float a, float b, float y) {
  switch (op) {
    case Unary::relu_forward: return a < 0.0f ? 0.0f : a;  // as ops::relu_forward: NaN stays
    case Unary::relu_backward: return b <= 0.0f ? 0.0f : a;
    case Unary::gelu_forward: return kmath::gelu_forward(a);
    case Unary::gelu_backward: return kmath::gelu_backward(a, b);
    case Unary::gelu_tanh_forward: return kmath::gelu_tanh_forward(a);
    case Unary::gelu_tanh_backward: return kmath::gelu_tanh_backward(a, b);
    case Unary::add: return a + b;
    case Unary::add_inplace: return y + a;
    case Unary::mul: return a * b;
  }
  return a;
}
__host__ __device__ inline bool reads_b(Unary op) {
  return op == Unary::relu_backward || op == Unary::gelu_backward || op == Unary::gelu_tanh_backward ||
         op == Unary::add || op == Unary::mul;
}
// Four elements a thread with 16-byte accesses (all of y, a and b aligned to 16 bytes): the
// element-wise kernels (residual adds, GELU) were 10.1% of the H200 step, at memory speed.
__global__ void elementwise_quads_k(Unary op, float* y, const float* a, const float* b, int64_t quads) {
  const bool with_b = reads_b(op), with_y = op == Unary::add_inplace;
  for (int64_t q = gtid(); q < quads; q += gstride()) {
    const float4 av = reinterpret_cast<const float4*>(a)[q];
    const float4 bv = with_b ? reinterpret_cast<const float4*>(b)[q] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float4 yv = with_y ? reinterpret_cast<const float4*>(y)[q] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    reinterpret_cast<float4*>(y)[q] = make_float4(apply(op, av.x, bv.x, yv.x), apply(op, av.y, bv.y, yv.y),
                                                  apply(op, av.z, bv.z, yv.z), apply(op, av.w, bv.w, yv.w));
  }
}
__global__ void elementwise_k(Unary op, float* y, const float* a, const float* b, int64_t n) {
  const bool with_b = reads_b(op), with_y = op == Unary::add_inplace;
  for (int64_t i = gtid(); i < n; i += gstride()) y[i] = apply(op, a[i], with_b ? b[i] : 0.0f, with_y ? y[i] : 0.0f);
}
__global__ void scale_k(float* x, float f, int64_t n) {
  for (int64_t i = gtid(); i < n; i += gstride()) x[i] *= f;
}
__global__ void fill_k(float* x, float v, int64_t n) {
  for (int64_t i = gtid(); i < n; i += gstride()) x[i] = v;
}
__global__ void dropout_k(float* y, float* mask, const float* x, int64_t B, int64_t per_sample, float p, float scale,
                          uint64_t key, uint64_t stream, int64_t sample_offset) {
  for (int64_t i = gtid(); i < B * per_sample; i += gstride()) {
    int64_t n = i / per_sample, j = i % per_sample;
    float u = kmath::philox_uniform(key, stream, kmath::dropout_counter(sample_offset, n, per_sample, j));
    float m = kmath::dropout_mask(u, p, scale);
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

// ---- Normalisation and softmax (one block per row).
__global__ void layernorm_forward_k(float* y, float* mean, float* rstd, const float* x, const float* w, const float* b,
                                    int64_t C, float eps) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * C;
  float* yr = y + r * C;
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += xr[c];
  const float m = block_reduce(s, Sum{}) / static_cast<float>(C);
  float v = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) v += (xr[c] - m) * (xr[c] - m);
  const float var = block_reduce(v, Sum{}) / static_cast<float>(C);
  const float rs = 1.0f / sqrtf(var + eps);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) yr[c] = (xr[c] - m) * rs * w[c] + b[c];
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
__global__ void log_softmax_forward_k(float* y, const float* x, int64_t C) {
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * C;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * C;
  float mx = -INFINITY;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) mx = fmaxf(mx, xr[c]);
  mx = block_max(mx);
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += expf(xr[c] - mx);
  const float lse = mx + logf(block_reduce(s, Sum{}));
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) yr[c] = xr[c] - lse;
}
__global__ void log_softmax_backward_k(float* dx, const float* dy, const float* y, int64_t C) {
  const int64_t off = static_cast<int64_t>(blockIdx.x) * C;
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += dy[off + c];
  const float sum = block_reduce(s, Sum{});
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dx[off + c] = dy[off + c] - expf(y[off + c]) * sum;
}
// One block per (plane, row r) of CausalRows g: query row i = row0 + r keeps j <= i.
__global__ void causal_softmax_forward_k(float* P, CausalRows g, float* row_max, float* row_inv) {
  const int64_t row = blockIdx.x, i = g.row0 + row % g.rows, T = g.T;
  float* pr = P + row * T;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) mx = fmaxf(mx, pr[j]);
  mx = block_max(mx);
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
    float e = expf(pr[j] - mx);
    pr[j] = e;
    s += e;
  }
  const float inv = 1.0f / block_reduce(s, Sum{});
  for (int64_t j = threadIdx.x; j < T; j += blockDim.x) pr[j] = j <= i ? pr[j] * inv : 0.0f;
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
__global__ void rmsnorm_forward_k(float* y, float* rstd, const float* x, const float* w, int64_t C, float eps) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * C;
  float* yr = y + r * C;
  double ss = 0.0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) ss += static_cast<double>(xr[c]) * xr[c];
  const float var = static_cast<float>(block_reduce(ss, Sum{}) / static_cast<double>(C));
  const float rs = 1.0f / sqrtf(var + eps);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) yr[c] = w[c] * (xr[c] * rs);
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

// ---- Pooling and embeddings.
__global__ void maxpool2_forward_k(float* y, int32_t* argmax, const float* x, int64_t planes, int64_t H, int64_t W) {
  const int64_t OH = H / 2, OW = W / 2;
  for (int64_t i = gtid(); i < planes * OH * OW; i += gstride()) {
    int64_t ow = i % OW, oh = (i / OW) % OH, p = i / (OW * OH);
    const float* xp = x + p * H * W;
    int64_t best = (2 * oh) * W + 2 * ow;
    const int64_t cand[3] = {best + 1, best + W, best + W + 1};
    for (int64_t k : cand) {
      if (xp[k] > xp[best] || isnan(xp[k])) best = k;
    }
    y[i] = xp[best];
    argmax[i] = static_cast<int32_t>(best);
  }
}
// Windows do not overlap: each dx element gets at most one dy, so a scatter after a zero fill.
__global__ void maxpool2_backward_k(float* dx, const float* dy, const int32_t* argmax, int64_t planes, int64_t H,
                                    int64_t W) {
  const int64_t OH = H / 2, OW = W / 2;
  for (int64_t i = gtid(); i < planes * OH * OW; i += gstride()) {
    int64_t p = i / (OH * OW);
    dx[p * H * W + argmax[i]] += dy[i];
  }
}
__global__ void embedding_forward_k(float* y, const int32_t* tokens, const float* wte, const float* wpe, int64_t B,
                                    int64_t T, int64_t C) {
  for (int64_t i = gtid(); i < B * T * C; i += gstride()) {
    int64_t c = i % C, bt = i / C, t = bt % T;
    const float te = wte[static_cast<int64_t>(tokens[bt]) * C + c];
    y[i] = wpe ? te + wpe[t * C + c] : te;  // wpe null: no position term (T5)
  }
}
__global__ void embedding_backward_k(float* dwte, float* dwpe, const float* dy, const int32_t* tokens, int64_t B,
                                     int64_t T, int64_t C) {
  for (int64_t i = gtid(); i < B * T * C; i += gstride()) {
    int64_t c = i % C, bt = i / C, t = bt % T;
    atomicAdd(&dwte[static_cast<int64_t>(tokens[bt]) * C + c], dy[i]);
    if (dwpe) atomicAdd(&dwpe[t * C + c], dy[i]);
  }
}

// ---- Losses and reductions (grid of kReduceBlocks, then one block over the partials).
// A warp per row (rows strided over the grid's warps), its lanes reading the row's columns side
// by side (coalesced), each keeping its first maximum; the lanes' candidates meet by shuffles
// (larger value, then smaller column). The CPU's std::max_element compares row[best] < row[c]
// from best = 0, so a NaN never wins unless it is row[0], which then stays: the same here. (One
// thread per row, as first written, read 32 rows' columns apart in every load and waited on
// each: milliseconds per step at T5's 32128-token vocabulary.)
constexpr int64_t kNoColumn = INT64_MAX;
__device__ inline void better_of(float& bv, int64_t& bi, float ov, int64_t oi) {
  if (oi != kNoColumn && (bi == kNoColumn || ov > bv || (ov == bv && oi < bi))) {
    bv = ov;
    bi = oi;
  }
}
__global__ void nll_partial_k(const float* logp, const int32_t* targets, int64_t rows, int64_t C, double* partials,
                              long long* partial_hits) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t warp = gtid() / 32, warps = gstride() / 32;
  double s = 0.0;
  long long hits = 0;
  for (int64_t r = warp; r < rows; r += warps) {  // warp-uniform: every lane takes part in the shuffles
    if (targets[r] < 0) continue;                 // ignored row (kernels.h)
    const float* row = logp + r * C;
    float bv = -INFINITY;
    int64_t bi = kNoColumn;
    for (int64_t c = lane; c < C; c += 32) {
      const float v = row[c];
      if (!isnan(v) && (bi == kNoColumn || v > bv)) {  // columns rise along a lane: the first maximum
        bv = v;
        bi = c;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_down_sync(0xffffffffu, bv, o);
      const long long oi = __shfl_down_sync(0xffffffffu, static_cast<long long>(bi), o);
      better_of(bv, bi, ov, oi);
    }
    if (lane == 0) {
      const int64_t best = isnan(row[0]) ? 0 : (bi == kNoColumn ? 0 : bi);
      s -= static_cast<double>(row[targets[r]]);
      hits += best == targets[r];
    }
  }
  s = block_reduce(s, Sum{});
  hits = block_reduce(hits, Sum{});
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = s;
    partial_hits[blockIdx.x] = hits;
  }
}
__global__ void sum_squares_partial_k(const float* x, int64_t n, double* partials) {
  double s = 0.0;
  for (int64_t i = gtid(); i < n; i += gstride()) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  s = block_reduce(s, Sum{});
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}
__global__ void nonfinite_partial_k(const float* x, int64_t n, long long* partial_hits) {
  long long k = 0;
  for (int64_t i = gtid(); i < n; i += gstride()) k += isfinite(x[i]) ? 0 : 1;
  k = block_reduce(k, Sum{});
  if (threadIdx.x == 0) partial_hits[blockIdx.x] = k;
}
// One block: result = sum of partials (null pointers skipped).
__global__ void finish_k(const double* partials, double* result, const long long* partial_hits, long long* hits) {
  double s = 0.0;
  long long h = 0;
  for (int i = threadIdx.x; i < kReduceBlocks; i += blockDim.x) {
    if (partials) s += partials[i];
    if (partial_hits) h += partial_hits[i];
  }
  s = block_reduce(s, Sum{});
  h = block_reduce(h, Sum{});
  if (threadIdx.x == 0) {
    if (result) *result = s;
    if (hits) *hits = h;
  }
}
// A negative (ignored) target matches no column: its row is all zeros.
__global__ void nll_backward_k(float* d, const int32_t* targets, int64_t rows, int64_t C, float g) {
  for (int64_t i = gtid(); i < rows * C; i += gstride()) d[i] = (i % C) == targets[i / C] ? g : 0.0f;
}
// As the CPU: d = exp(logp) * inv_n, then d[t] -= inv_n (two roundings: __fmul_rn/__fsub_rn).
__global__ void cross_entropy_backward_k(float* d, const float* logp, const int32_t* targets, int64_t rows, int64_t C,
                                         float inv_n) {
  for (int64_t i = gtid(); i < rows * C; i += gstride()) {
    const int32_t t = targets[i / C];
    if (t < 0) {  // ignored row: zero gradient
      d[i] = 0.0f;
      continue;
    }
    float v = __fmul_rn(expf(logp[i]), inv_n);
    if ((i % C) == t) v = __fsub_rn(v, inv_n);
    d[i] = v;
  }
}

// ---- Optimizers and casts.
__global__ void adamw_k(float* p, const float* g, float* m, float* v, int64_t n, AdamWArgs a) {
  for (int64_t i = gtid(); i < n; i += gstride()) {
    float pi = p[i], mi = m[i], vi = v[i];
    kmath::adamw_element(pi, g[i], mi, vi, a);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}
__global__ void sgd_k(float* p, const float* g, float* buf, int64_t n, SgdArgs a) {
  for (int64_t i = gtid(); i < n; i += gstride()) {
    float pi = p[i];
    kmath::sgd_element(pi, g[i], a.has_momentum ? buf + i : nullptr, a);
    p[i] = pi;
  }
}
__global__ void adadelta_k(float* p, const float* g, float* sq, float* acc, int64_t n, AdadeltaArgs a) {
  for (int64_t i = gtid(); i < n; i += gstride()) {
    float pi = p[i], si = sq[i], ai = acc[i];
    kmath::adadelta_element(pi, g[i], si, ai, a);
    p[i] = pi;
    sq[i] = si;
    acc[i] = ai;
  }
}
__device__ inline float load_as_f32(const void* src, DType t, int64_t i) {
  if (t == DType::f32) return static_cast<const float*>(src)[i];
  uint16_t h = static_cast<const uint16_t*>(src)[i];
  return t == DType::bf16 ? kmath::bf16_to_f32(h) : kmath::f16_to_f32(h);
}
__global__ void cast_k(void* dst, DType dt, const void* src, DType st, int64_t n) {
  for (int64_t i = gtid(); i < n; i += gstride()) {
    float f = load_as_f32(src, st, i);  // every bf16/f16 value is exact in f32
    if (dt == DType::f32)
      static_cast<float*>(dst)[i] = f;
    else
      static_cast<uint16_t*>(dst)[i] = dt == DType::bf16 ? kmath::f32_to_bf16(f) : kmath::f32_to_f16(f);
  }
}

// Four elements a thread (16-byte f32 or 8-byte half accesses), each converted as cast_k does:
// cast_k's one element a thread (and its 2-byte accesses) was 10.9% of the H200 step.
__device__ inline uint32_t pack_halves(uint16_t lo, uint16_t hi) {  // lo at the lower address
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}
__device__ inline float half_to_f32(uint16_t h, DType t) {
  return t == DType::bf16 ? kmath::bf16_to_f32(h) : kmath::f16_to_f32(h);
}
__device__ inline uint16_t f32_to_half(float f, DType t) {
  return t == DType::bf16 ? kmath::f32_to_bf16(f) : kmath::f32_to_f16(f);
}
__device__ inline float4 load_quad(const float* p, DType) { return *reinterpret_cast<const float4*>(p); }
__device__ inline float4 load_quad(const uint16_t* p, DType t) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  return make_float4(
      half_to_f32(static_cast<uint16_t>(u.x & 0xFFFFu), t), half_to_f32(static_cast<uint16_t>(u.x >> 16), t),
      half_to_f32(static_cast<uint16_t>(u.y & 0xFFFFu), t), half_to_f32(static_cast<uint16_t>(u.y >> 16), t));
}
__device__ inline void store_quad(float* p, DType, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ inline void store_quad(uint16_t* p, DType t, float4 v) {
  *reinterpret_cast<uint2*>(p) = make_uint2(pack_halves(f32_to_half(v.x, t), f32_to_half(v.y, t)),
                                            pack_halves(f32_to_half(v.z, t), f32_to_half(v.w, t)));
}
template <typename D, typename S>
__global__ void cast_quads_k(D* dst, DType dt, const S* src, DType st, int64_t quads) {
  for (int64_t q = gtid(); q < quads; q += gstride()) store_quad(dst + 4 * q, dt, load_quad(src + 4 * q, st));
}

// matmul_precision's rounding of one element: bf16 bits, or a TF32 value kept in an f32.
__device__ inline void round_to(uint16_t* d, float x) { *d = kmath::f32_to_bf16(x); }
__device__ inline void round_to(float* d, float x) { *d = kmath::round_to_tf32(x); }

// Contiguous operands (most): one index. Otherwise a row per grid row (the division once a row).
template <typename Out>
__global__ void round_contiguous_k(Out* dst, const float* src, int64_t n) {
  for (int64_t i = gtid(); i < n; i += gstride()) round_to(dst + i, src[i]);
}

// Four elements a thread: a 16-byte load, an 8-byte (bf16) or 16-byte (TF32) store, each element
// rounded as round_to does. One element a thread moved 2.75 TB/s on the H200 (53 us a launch,
// 16.6% of the performance model's step at medium): fewer, wider accesses for the same bits.
__device__ inline void round_quad_to(uint16_t* d, float4 v) {
  *reinterpret_cast<uint2*>(d) = make_uint2(pack_halves(kmath::f32_to_bf16(v.x), kmath::f32_to_bf16(v.y)),
                                            pack_halves(kmath::f32_to_bf16(v.z), kmath::f32_to_bf16(v.w)));
}
__device__ inline void round_quad_to(float* d, float4 v) {
  *reinterpret_cast<float4*>(d) = make_float4(kmath::round_to_tf32(v.x), kmath::round_to_tf32(v.y),
                                              kmath::round_to_tf32(v.z), kmath::round_to_tf32(v.w));
}
template <typename Out>
__global__ void round_quads_k(Out* dst, const float* src, int64_t quads) {
  const auto* s = reinterpret_cast<const float4*>(src);
  for (int64_t q = gtid(); q < quads; q += gstride()) round_quad_to(dst + 4 * q, s[q]);
}

bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
template <typename Out>
__global__ void round_rows_k(Out* dst, const float* src, int64_t matrix_rows, int64_t rows, int64_t cols, int64_t ld,
                             int64_t stride) {
  for (int64_t row = blockIdx.y; row < matrix_rows; row += gridDim.y) {
    const float* s = src + (row / rows) * stride + (row % rows) * ld;
    Out* d = dst + row * cols;
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x)
      round_to(d + c, s[c]);
  }
}
template <typename Out>
void launch_round(Out* dst, const float* src, int64_t batch, int64_t rows, int64_t cols, int64_t ld, int64_t stride,
                  cudaStream_t s) {
  if (ld == cols && (batch == 1 || stride == rows * cols)) {
    const int64_t n = batch * rows * cols;
    int64_t done = 0;
    if (aligned_to(src, 4 * sizeof(float)) && aligned_to(dst, 4 * sizeof(Out)) && n >= 4) {
      const int64_t quads = n / 4;
      round_quads_k<<<blocks_for(quads), kThreads, 0, s>>>(dst, src, quads);
      done = 4 * quads;
    }
    if (done < n) round_contiguous_k<<<blocks_for(n - done), kThreads, 0, s>>>(dst + done, src + done, n - done);
    return;
  }
  const int64_t col_blocks = (cols + kThreads - 1) / kThreads, matrix_rows = batch * rows;
  const dim3 grid(static_cast<unsigned>(col_blocks < 8 ? col_blocks : 8),
                  static_cast<unsigned>(matrix_rows < 65535 ? matrix_rows : 65535));
  round_rows_k<<<grid, kThreads, 0, s>>>(dst, src, matrix_rows, rows, cols, ld, stride);
}

int rows_grid(int64_t rows, const char* what) {
  if (rows > 0x7fffffff) throw Error(std::string("cuda: ") + what + ": too many rows for one grid");
  return static_cast<int>(rows);
}

}  // namespace

void bias_rows(float* Y, const float* b, int64_t rows, int64_t out, cudaStream_t s) {
  if (rows * out == 0) return;
  const int64_t col_blocks = (out + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned>(col_blocks < 8 ? col_blocks : 8),
                  static_cast<unsigned>(rows < 65535 ? rows : 65535));
  bias_rows_k<<<grid, kThreads, 0, s>>>(Y, b, rows, out);
  check_launch("bias_rows");
}
void col_sum_add(float* db, const float* dY, int64_t rows, int64_t out, cudaStream_t s) {
  if (out == 0) return;
  col_sum_add_k<<<column_tiles(out), dim3(kColTile, kRowLanes), 0, s>>>(db, dY, rows, out);
  check_launch("col_sum_add");
}
void im2col(const float* x, float* col, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K, int64_t pad, int64_t OH,
            int64_t OW, cudaStream_t s) {
  int64_t n = C * K * K * B * OH * OW;
  if (n == 0) return;
  im2col_k<<<blocks_for(n), kThreads, 0, s>>>(x, col, B, C, H, W, K, pad, OH, OW);
  check_launch("im2col");
}
void col2im(const float* dcol, float* dx, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K, int64_t pad,
            int64_t OH, int64_t OW, cudaStream_t s) {
  int64_t n = B * C * H * W;
  if (n == 0) return;
  col2im_k<<<blocks_for(n), kThreads, 0, s>>>(dcol, dx, B, C, H, W, K, pad, OH, OW);
  check_launch("col2im");
}
void conv_bias_permute(float* y, const float* ybuf, const float* bias, int64_t B, int64_t out, int64_t P,
                       cudaStream_t s) {
  if (B * out * P == 0) return;
  conv_bias_permute_k<<<blocks_for(B * out * P), kThreads, 0, s>>>(y, ybuf, bias, B, out, P);
  check_launch("conv_bias_permute");
}
void conv_grad_permute(float* dyt, float* db, const float* dy, int64_t B, int64_t out, int64_t P, cudaStream_t s) {
  if (B * out * P == 0) return;
  conv_permute_k<<<blocks_for(B * out * P), kThreads, 0, s>>>(dyt, dy, B, out, P);
  check_launch("conv_grad_permute");
  row_sum_add_k<<<rows_grid(out, "conv_grad_permute"), kThreads, 0, s>>>(db, dyt, B * P);
  check_launch("conv_grad_permute (bias sums)");
}

void elementwise(Unary op, float* y, const float* a, const float* b, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  int64_t done = 0;
  if (n >= 4 && aligned_to(y, 16) && aligned_to(a, 16) && (!reads_b(op) || aligned_to(b, 16))) {
    const int64_t quads = n / 4;
    elementwise_quads_k<<<blocks_for(quads), kThreads, 0, s>>>(op, y, a, b, quads);
    done = 4 * quads;
  }
  if (done < n)
    elementwise_k<<<blocks_for(n - done), kThreads, 0, s>>>(op, y + done, a + done, reads_b(op) ? b + done : b,
                                                            n - done);
  check_launch("elementwise");
}
void scale(float* x, float factor, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  scale_k<<<blocks_for(n), kThreads, 0, s>>>(x, factor, n);
  check_launch("scale");
}
void fill(float* x, float value, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  fill_k<<<blocks_for(n), kThreads, 0, s>>>(x, value, n);
  check_launch("fill");
}
void dropout_forward(float* y, float* mask, const float* x, int64_t B, int64_t per_sample, float p, uint64_t key,
                     uint64_t stream, int64_t sample_offset, cudaStream_t s) {
  if (B * per_sample == 0) return;
  const float scale = 1.0f / (1.0f - p);  // as nn/activation.cpp
  dropout_k<<<blocks_for(B * per_sample), kThreads, 0, s>>>(y, mask, x, B, per_sample, p, scale, key, stream,
                                                            sample_offset);
  check_launch("dropout_forward");
}

void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w, const float* b, int64_t rows,
                       int64_t C, float eps, cudaStream_t s) {
  if (rows == 0) return;
  layernorm_forward_k<<<rows_grid(rows, "layernorm_forward"), kThreads, 0, s>>>(y, mean, rstd, x, w, b, C, eps);
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
void log_softmax_backward(float* dx, const float* dy, const float* y, int64_t rows, int64_t C, cudaStream_t s) {
  if (rows == 0) return;
  log_softmax_backward_k<<<rows_grid(rows, "log_softmax_backward"), kThreads, 0, s>>>(dx, dy, y, C);
  check_launch("log_softmax_backward");
}
void causal_softmax_forward(float* P, CausalRows g, float* row_max, float* row_inv, cudaStream_t s) {
  if (g.planes * g.rows * g.T == 0) return;
  causal_softmax_forward_k<<<rows_grid(g.planes * g.rows, "causal_softmax_forward"), kThreads, 0, s>>>(P, g, row_max,
                                                                                                       row_inv);
  check_launch("causal_softmax_forward");
}
void causal_softmax_recompute(float* P, CausalRows g, const float* row_max, const float* row_inv, cudaStream_t s) {
  if (g.planes * g.rows * g.T == 0) return;
  causal_softmax_recompute_k<<<rows_grid(g.planes * g.rows, "causal_softmax_recompute"), kThreads, 0, s>>>(
      P, g, row_max, row_inv);
  check_launch("causal_softmax_recompute");
}
void causal_softmax_backward(float* dP, const float* P, CausalRows g, float scale, cudaStream_t s) {
  if (g.planes * g.rows * g.T == 0) return;
  causal_softmax_backward_k<<<rows_grid(g.planes * g.rows, "causal_softmax_backward"), kThreads, 0, s>>>(dP, P, g,
                                                                                                         scale);
  check_launch("causal_softmax_backward");
}
void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t rows, int64_t C, float eps,
                     cudaStream_t s) {
  if (rows == 0) return;
  rmsnorm_forward_k<<<rows_grid(rows, "rmsnorm_forward"), kThreads, 0, s>>>(y, rstd, x, w, C, eps);
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
void maxpool2_forward(float* y, int32_t* argmax, const float* x, int64_t planes, int64_t H, int64_t W, cudaStream_t s) {
  int64_t n = planes * (H / 2) * (W / 2);
  if (n == 0) return;
  maxpool2_forward_k<<<blocks_for(n), kThreads, 0, s>>>(y, argmax, x, planes, H, W);
  check_launch("maxpool2_forward");
}
void maxpool2_backward(float* dx, const float* dy, const int32_t* argmax, int64_t planes, int64_t H, int64_t W,
                       cudaStream_t s) {
  if (planes * H * W == 0) return;
  fill(dx, 0.0f, planes * H * W, s);
  int64_t n = planes * (H / 2) * (W / 2);
  if (n == 0) return;
  maxpool2_backward_k<<<blocks_for(n), kThreads, 0, s>>>(dx, dy, argmax, planes, H, W);
  check_launch("maxpool2_backward");
}
void embedding_forward(float* y, const int32_t* tokens, const float* wte, const float* wpe, int64_t B, int64_t T,
                       int64_t C, cudaStream_t s) {
  if (B * T * C == 0) return;
  embedding_forward_k<<<blocks_for(B * T * C), kThreads, 0, s>>>(y, tokens, wte, wpe, B, T, C);
  check_launch("embedding_forward");
}
void embedding_backward(float* dwte, float* dwpe, const float* dy, const int32_t* tokens, int64_t B, int64_t T,
                        int64_t C, cudaStream_t s) {
  if (B * T * C == 0) return;
  embedding_backward_k<<<blocks_for(B * T * C), kThreads, 0, s>>>(dwte, dwpe, dy, tokens, B, T, C);
  check_launch("embedding_backward");
}

void nll_sum(const float* logp, const int32_t* targets, int64_t rows, int64_t C, double* partials,
             long long* partial_hits, double* result, long long* hits, cudaStream_t s) {
  nll_partial_k<<<kReduceBlocks, kThreads, 0, s>>>(logp, targets, rows, C, partials, partial_hits);
  check_launch("nll_sum");
  finish_k<<<1, kThreads, 0, s>>>(partials, result, partial_hits, hits);
  check_launch("nll_sum (finish)");
}
void sum_squares(const float* x, int64_t n, double* partials, double* result, cudaStream_t s) {
  sum_squares_partial_k<<<kReduceBlocks, kThreads, 0, s>>>(x, n, partials);
  check_launch("sum_squares");
  finish_k<<<1, kThreads, 0, s>>>(partials, result, nullptr, nullptr);
  check_launch("sum_squares (finish)");
}
void count_nonfinite(const float* x, int64_t n, long long* partial_hits, long long* hits, cudaStream_t s) {
  nonfinite_partial_k<<<kReduceBlocks, kThreads, 0, s>>>(x, n, partial_hits);
  check_launch("all_finite");
  finish_k<<<1, kThreads, 0, s>>>(nullptr, nullptr, partial_hits, hits);
  check_launch("all_finite (finish)");
}
void nll_backward(float* d, const int32_t* targets, int64_t rows, int64_t C, float g, cudaStream_t s) {
  if (rows * C == 0) return;
  nll_backward_k<<<blocks_for(rows * C), kThreads, 0, s>>>(d, targets, rows, C, g);
  check_launch("nll_backward");
}
void cross_entropy_backward(float* d, const float* logp, const int32_t* targets, int64_t rows, int64_t C, float inv_n,
                            cudaStream_t s) {
  if (rows * C == 0) return;
  cross_entropy_backward_k<<<blocks_for(rows * C), kThreads, 0, s>>>(d, logp, targets, rows, C, inv_n);
  check_launch("cross_entropy_backward");
}

void adamw_step(float* p, const float* g, float* exp_avg, float* exp_avg_sq, int64_t n, const AdamWArgs& a,
                cudaStream_t s) {
  if (n == 0) return;
  adamw_k<<<blocks_for(n), kThreads, 0, s>>>(p, g, exp_avg, exp_avg_sq, n, a);
  check_launch("adamw_step");
}
void sgd_step(float* p, const float* g, float* momentum_buffer, int64_t n, const SgdArgs& a, cudaStream_t s) {
  if (n == 0) return;
  sgd_k<<<blocks_for(n), kThreads, 0, s>>>(p, g, momentum_buffer, n, a);
  check_launch("sgd_step");
}
void adadelta_step(float* p, const float* g, float* square_avg, float* acc_delta, int64_t n, const AdadeltaArgs& a,
                   cudaStream_t s) {
  if (n == 0) return;
  adadelta_k<<<blocks_for(n), kThreads, 0, s>>>(p, g, square_avg, acc_delta, n, a);
  check_launch("adadelta_step");
}
void round_packed(void* dst, MatmulPrecision p, const float* src, int64_t batch, int64_t rows, int64_t cols, int64_t ld,
                  int64_t stride, cudaStream_t s) {
  if (batch * rows * cols == 0) return;
  if (p == MatmulPrecision::medium)
    launch_round(static_cast<uint16_t*>(dst), src, batch, rows, cols, ld, stride, s);
  else if (p == MatmulPrecision::high)
    launch_round(static_cast<float*>(dst), src, batch, rows, cols, ld, stride, s);
  else
    throw Error("cuda: round_packed: matmul precision highest keeps its operands");
  check_launch("round_packed");
}
void cast(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  for (DType t : {dst_dtype, src_dtype}) {
    if (t != DType::f32 && t != DType::bf16 && t != DType::f16)
      throw Error("cuda: cast: " + std::string(dtype_name(t)) + " is not f32, bf16 or f16");
  }
  if (dst_dtype == src_dtype) {
    cudaError_t rc =
        cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * dtype_bytes(src_dtype), cudaMemcpyDeviceToDevice, s);
    if (rc != cudaSuccess) throw Error(std::string("cuda: cudaMemcpyAsync: ") + cudaGetErrorString(rc) + " (cast)");
    return;
  }
  int64_t done = 0;
  const size_t dst_quad = 4 * dtype_bytes(dst_dtype), src_quad = 4 * dtype_bytes(src_dtype);
  if (n >= 4 && aligned_to(dst, dst_quad) && aligned_to(src, src_quad)) {
    const int64_t quads = n / 4;
    const int blocks = blocks_for(quads);
    if (dst_dtype == DType::f32)  // from a half type
      cast_quads_k<<<blocks, kThreads, 0, s>>>(static_cast<float*>(dst), dst_dtype, static_cast<const uint16_t*>(src),
                                               src_dtype, quads);
    else if (src_dtype == DType::f32)
      cast_quads_k<<<blocks, kThreads, 0, s>>>(static_cast<uint16_t*>(dst), dst_dtype, static_cast<const float*>(src),
                                               src_dtype, quads);
    else  // bf16 <-> f16
      cast_quads_k<<<blocks, kThreads, 0, s>>>(static_cast<uint16_t*>(dst), dst_dtype,
                                               static_cast<const uint16_t*>(src), src_dtype, quads);
    done = 4 * quads;
  }
  if (done < n) {
    const size_t skip_dst = static_cast<size_t>(done) * dtype_bytes(dst_dtype);
    const size_t skip_src = static_cast<size_t>(done) * dtype_bytes(src_dtype);
    cast_k<<<blocks_for(n - done), kThreads, 0, s>>>(static_cast<char*>(dst) + skip_dst, dst_dtype,
                                                     static_cast<const char*>(src) + skip_src, src_dtype, n - done);
  }
  check_launch("cast");
}

}  // namespace fsdp::cuda::launch
