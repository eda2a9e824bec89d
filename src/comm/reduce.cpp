#include "comm/reduce.h"

#include <algorithm>
#include <cstdint>

namespace fsdp {

namespace {

template <class T>
void reduce_typed(T* dst, const T* src, size_t count, ReduceOp op) {
  switch (op) {
    case ReduceOp::max:
      for (size_t i = 0; i < count; ++i) dst[i] = std::max(dst[i], src[i]);
      return;
    case ReduceOp::min:
      for (size_t i = 0; i < count; ++i) dst[i] = std::min(dst[i], src[i]);
      return;
    default:
#pragma omp simd
      for (size_t i = 0; i < count; ++i) dst[i] = dst[i] + src[i];
  }
}

template <class T>
void reduce_many_typed(T* dst, const T* const* srcs, size_t n, size_t count, ReduceOp op) {
  constexpr size_t kBlock = 1024;  // keep the running block in L1 while streaming n inputs
  for (size_t b = 0; b < count; b += kBlock) {
    size_t len = std::min(kBlock, count - b);
    T acc[kBlock];
    std::copy_n(srcs[0] + b, len, acc);
    for (size_t j = 1; j < n; ++j) reduce_typed(acc, srcs[j] + b, len, op);
    std::copy_n(acc, len, dst + b);
  }
}

// Half types: widen a block to f32, accumulate every input, round once.
template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
void reduce_many_half(uint16_t* dst, const uint16_t* const* srcs, size_t n, size_t count, ReduceOp op) {
  constexpr size_t kBlock = 1024;
  float acc[kBlock], tmp[kBlock];
  for (size_t b = 0; b < count; b += kBlock) {
    size_t len = std::min(kBlock, count - b);
    for (size_t i = 0; i < len; ++i) acc[i] = Load(srcs[0][b + i]);
    for (size_t j = 1; j < n; ++j) {
      for (size_t i = 0; i < len; ++i) tmp[i] = Load(srcs[j][b + i]);
      reduce_typed(acc, tmp, len, op);
    }
    for (size_t i = 0; i < len; ++i) dst[b + i] = Store(acc[i]);
  }
}

// avg's division; integers truncate (u8 through int, as d[i] / divisor promotes it).
template <class T>
void divide(T* d, size_t count, int divisor) {
  for (size_t i = 0; i < count; ++i) d[i] = static_cast<T>(d[i] / divisor);
}

template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
void divide_half(uint16_t* d, size_t count, int divisor) {
  for (size_t i = 0; i < count; ++i) d[i] = Store(Load(d[i]) / static_cast<float>(divisor));
}

}  // namespace

void reduce_many(void* dst, const void* const* srcs, size_t n, size_t count, DType dtype, ReduceOp op) {
  if (n == 0 || count == 0) return;
  switch (dtype) {
    case DType::f32:
      return reduce_many_typed(static_cast<float*>(dst), reinterpret_cast<const float* const*>(srcs), n, count, op);
    case DType::f64:
      return reduce_many_typed(static_cast<double*>(dst), reinterpret_cast<const double* const*>(srcs), n, count, op);
    case DType::i32:
      return reduce_many_typed(static_cast<int32_t*>(dst), reinterpret_cast<const int32_t* const*>(srcs), n, count, op);
    case DType::i64:
      return reduce_many_typed(static_cast<int64_t*>(dst), reinterpret_cast<const int64_t* const*>(srcs), n, count, op);
    case DType::u8:
      return reduce_many_typed(static_cast<uint8_t*>(dst), reinterpret_cast<const uint8_t* const*>(srcs), n, count, op);
    case DType::bf16:
      return reduce_many_half<bf16_to_f32, f32_to_bf16>(static_cast<uint16_t*>(dst),
                                                        reinterpret_cast<const uint16_t* const*>(srcs), n, count, op);
    case DType::f16:
      return reduce_many_half<f16_to_f32, f32_to_f16>(static_cast<uint16_t*>(dst),
                                                      reinterpret_cast<const uint16_t* const*>(srcs), n, count, op);
  }
}

void reduce_into(void* dst, const void* src, size_t count, DType dtype, ReduceOp op) {
  const void* srcs[2] = {dst, src};
  reduce_many(dst, srcs, 2, count, dtype, op);
}

void scale_for_avg(void* dst, size_t count, DType dtype, int divisor) {
  switch (dtype) {
    case DType::f32: return divide(static_cast<float*>(dst), count, divisor);
    case DType::f64: return divide(static_cast<double*>(dst), count, divisor);
    case DType::i32: return divide(static_cast<int32_t*>(dst), count, divisor);
    case DType::i64: return divide(static_cast<int64_t*>(dst), count, divisor);
    case DType::u8: return divide(static_cast<uint8_t*>(dst), count, divisor);
    case DType::bf16: return divide_half<bf16_to_f32, f32_to_bf16>(static_cast<uint16_t*>(dst), count, divisor);
    case DType::f16: return divide_half<f16_to_f32, f32_to_f16>(static_cast<uint16_t*>(dst), count, divisor);
  }
}

}  // namespace fsdp
