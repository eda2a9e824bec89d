// CudaKernels' losses and reductions to a host value: NLL and cross-entropy, sum of squares, the non-finite count
// (per-block partials, then one block over them) (launch.h; kernels_common.cuh: what they share).
#include "tensor/cuda/kernels_common.cuh"

namespace fsdp::cuda::launch {
namespace {

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
// lse not null: logp holds logits and the log-probability of the target is logits - lse (the
// argmax is the logits', as the CPU's cross_entropy_sum).
__global__ void nll_partial_k(const float* logp, const int32_t* targets, int64_t rows, int64_t C, double* partials,
                              long long* partial_hits, const float* lse) {
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
      s -= static_cast<double>(lse ? __fsub_rn(row[targets[r]], lse[r]) : row[targets[r]]);
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
// lse not null: logp holds the logits (d may be them: each element is read before it is written).
__global__ void cross_entropy_backward_k(float* d, const float* logp, const int32_t* targets, int64_t rows, int64_t C,
                                         float inv_n, const float* lse) {
  for (int64_t i = gtid(); i < rows * C; i += gstride()) {
    const int32_t t = targets[i / C];
    if (t < 0) {  // ignored row: zero gradient
      d[i] = 0.0f;
      continue;
    }
    const float lp = lse ? __fsub_rn(logp[i], lse[i / C]) : logp[i];
    float v = __fmul_rn(expf(lp), inv_n);
    if ((i % C) == t) v = __fsub_rn(v, inv_n);
    d[i] = v;
  }
}

}  // namespace

void nll_sum(const float* logp, const int32_t* targets, int64_t rows, int64_t C, double* partials,
             long long* partial_hits, double* result, long long* hits, cudaStream_t s, const float* lse) {
  nll_partial_k<<<kReduceBlocks, kThreads, 0, s>>>(logp, targets, rows, C, partials, partial_hits, lse);
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
                            cudaStream_t s, const float* lse) {
  if (rows * C == 0) return;
  cross_entropy_backward_k<<<blocks_for(rows * C), kThreads, 0, s>>>(d, logp, targets, rows, C, inv_n, lse);
  check_launch("cross_entropy_backward");
}

}  // namespace fsdp::cuda::launch
