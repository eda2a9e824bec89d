// CudaKernels' optimizer updates (AdamW, SGD, Adadelta) and casts and TF32/bf16 rounding of GEMM operands (launch.h;
// kernels_common.cuh: what they share).
#include "tensor/cuda/kernels_common.cuh"

namespace fsdp::cuda::launch {
namespace {

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

// x[i] = widen(narrow(x[i])): compute: param_dtype's rounding of an op's output, in place.
__global__ void round_in_place_k(float* x, DType dtype, int64_t n) {
  for (int64_t i = gtid(); i < n; i += gstride()) x[i] = kmath::round_as(x[i], dtype);
}

}  // namespace

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
void round_in_place(float* x, DType dtype, int64_t n, cudaStream_t s) {
  if (n == 0 || dtype == DType::f32) return;
  if (dtype == DType::bf16 || dtype == DType::f16)
    round_in_place_k<<<blocks_for(n), kThreads, 0, s>>>(x, dtype, n);
  else
    throw Error("cuda: round_to: " + std::string(dtype_name(dtype)) + " is not bf16 or f16");
  check_launch("round_to");
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
