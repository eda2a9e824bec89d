// CudaKernels' element-wise ops (the Unary table, 16-byte quads where aligned), scale, fill, dropout (launch.h;
// kernels_common.cuh: what they share).
#include "tensor/cuda/kernels_common.cuh"

namespace fsdp::cuda::launch {
namespace {

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
    case Unary::silu_forward: return kmath::silu_forward(a);
    case Unary::silu_backward: return kmath::silu_backward(a, b);
    case Unary::add: return a + b;
    case Unary::add_inplace: return y + a;
    case Unary::mul: return a * b;
  }
  return a;
}
__host__ __device__ inline bool reads_b(Unary op) {
  return op == Unary::relu_backward || op == Unary::gelu_backward || op == Unary::gelu_tanh_backward ||
         op == Unary::silu_backward || op == Unary::add || op == Unary::mul;
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
__global__ void dropout_k(float* y, uint8_t* keep, const float* x, int64_t B, int64_t per_sample, float p, float scale,
                          uint64_t key, uint64_t stream, int64_t sample_offset) {
  for (int64_t i = gtid(); i < B * per_sample; i += gstride()) {
    int64_t n = i / per_sample, j = i % per_sample;
    float u = kmath::philox_uniform(key, stream, kmath::dropout_counter(sample_offset, n, per_sample, j));
    float m = kmath::dropout_mask(u, p, scale);
    keep[i] = m != 0.0f ? 1 : 0;
    y[i] = x[i] * m;
  }
}
__global__ void dropout_backward_k(float* dx, const float* dy, const uint8_t* keep, float scale, int64_t n) {
  for (int64_t i = gtid(); i < n; i += gstride()) dx[i] = dy[i] * (keep[i] ? scale : 0.0f);
}

}  // namespace

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
void dropout_forward(float* y, uint8_t* keep, const float* x, int64_t B, int64_t per_sample, float p, uint64_t key,
                     uint64_t stream, int64_t sample_offset, cudaStream_t s) {
  if (B * per_sample == 0) return;
  const float scale = kmath::dropout_scale(p);  // as the host's
  dropout_k<<<blocks_for(B * per_sample), kThreads, 0, s>>>(y, keep, x, B, per_sample, p, scale, key, stream,
                                                            sample_offset);
  check_launch("dropout_forward");
}
void dropout_backward(float* dx, const float* dy, const uint8_t* keep, float p, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  dropout_backward_k<<<blocks_for(n), kThreads, 0, s>>>(dx, dy, keep, kmath::dropout_scale(p), n);
  check_launch("dropout_backward");
}

}  // namespace fsdp::cuda::launch
