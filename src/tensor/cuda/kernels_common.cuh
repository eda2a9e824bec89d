#pragma once
// What the kernels_*.cu files share (launch.h's launchers, compiled by nvcc): launch shapes,
// the launch check, grid-stride indices, block-wide reductions and the column-sum tiling.
// Everything here is internal to one translation unit (an anonymous namespace).
//
// Elementwise work uses grid-stride loops; row-wise work (layernorm, RMS norm, softmaxes) one
// block per row; column sums (bias and norm weight grads) a block per 32 columns whose row lanes
// split the rows ("Column sums" below), in a fixed order: deterministic (no atomics), not the
// CPU's row order (within tolerance of it). Scatters with duplicates (embedding and relative-bias
// grads) use atomics. Reductions to a host value are two deterministic passes (per-block
// partials, then one block over the partials). The per-element math shared with the host (GELU,
// dropout's Philox, bf16/f16 rounding, optimizer updates) is tensor/kernel_math.h.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "tensor/cuda/launch.h"
#include "tensor/error.h"
#include "tensor/kernel_math.h"

namespace fsdp::cuda::launch {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

inline int blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  return static_cast<int>(b < kMaxBlocks ? b : kMaxBlocks);
}

inline void check_launch(const char* kernel) {
  cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess)
    throw Error(std::string("cuda: ") + kernel + " launch: " + cudaGetErrorString(rc) + " (kernels_*.cu)");
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
inline int column_tiles(int64_t cols) {
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

inline bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

inline int rows_grid(int64_t rows, const char* what) {
  if (rows > 0x7fffffff) throw Error(std::string("cuda: ") + what + ": too many rows for one grid");
  return static_cast<int>(rows);
}

}  // namespace
}  // namespace fsdp::cuda::launch
