#include "mpi/mpi_reduce.h"

#include <algorithm>
#include <bit>
#include <cstdint>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "comm/reduce.h"

namespace fsdp {

namespace {

constexpr size_t kBlock = 1024;  // the f32 accumulator block stays in L1 while n inputs stream

struct Bf16 {
  static void load(float* acc, const uint16_t* src, size_t len) {
    for (size_t i = 0; i < len; ++i) acc[i] = std::bit_cast<float>(static_cast<uint32_t>(src[i]) << 16);
  }
  static void store(uint16_t* dst, const float* acc, size_t len) {
    for (size_t i = 0; i < len; ++i) {
      // Round to nearest even; NaN stays a quiet NaN (as f32_to_bf16, branch-free).
      const uint32_t u = std::bit_cast<uint32_t>(acc[i]);
      const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
      const uint32_t nan = (u >> 16) | 0x40u;
      dst[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
    }
  }
};

struct F16 {
  static void load(float* acc, const uint16_t* src, size_t len) {
    size_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= len; i += 8)
      _mm256_storeu_ps(acc + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
    for (; i < len; ++i) acc[i] = f16_to_f32(src[i]);
  }
  static void store(uint16_t* dst, const float* acc, size_t len) {
    size_t i = 0;
#if defined(__F16C__)
    // IEEE round to nearest even, subnormals, inf and quiet NaN exactly as f32_to_f16.
    for (; i + 8 <= len; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(acc + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; i < len; ++i) dst[i] = f32_to_f16(acc[i]);
  }
};

template <class Half>
void scale_half(uint16_t* dst, size_t count, float divisor) {
  alignas(64) float acc[kBlock];
  for (size_t b = 0; b < count; b += kBlock) {
    const size_t len = std::min(kBlock, count - b);
    Half::load(acc, dst + b, len);
    for (size_t i = 0; i < len; ++i) acc[i] = acc[i] / divisor;
    Half::store(dst + b, acc, len);
  }
}

template <class Half>
void reduce_half(uint16_t* dst, const uint16_t* const* srcs, size_t n, size_t count, ReduceOp op) {
  alignas(64) float acc[kBlock];
  alignas(64) float tmp[kBlock];
  for (size_t b = 0; b < count; b += kBlock) {
    const size_t len = std::min(kBlock, count - b);
    Half::load(acc, srcs[0] + b, len);
    for (size_t j = 1; j < n; ++j) {
      Half::load(tmp, srcs[j] + b, len);
      switch (op) {  // the same expressions as reduce.cpp, so results agree bit for bit
        case ReduceOp::max:
          for (size_t i = 0; i < len; ++i) acc[i] = std::max(acc[i], tmp[i]);
          break;
        case ReduceOp::min:
          for (size_t i = 0; i < len; ++i) acc[i] = std::min(acc[i], tmp[i]);
          break;
        default:
          for (size_t i = 0; i < len; ++i) acc[i] = acc[i] + tmp[i];
      }
    }
    if (op == ReduceOp::avg) {
      const float divisor = static_cast<float>(n);
      for (size_t i = 0; i < len; ++i) acc[i] = acc[i] / divisor;
    }
    Half::store(dst + b, acc, len);
  }
}

}  // namespace

void mpi_reduce_many(void* dst, const void* const* srcs, size_t n, size_t count, DType dtype, ReduceOp op) {
  if (n == 0 || count == 0) return;
  auto* d = static_cast<uint16_t*>(dst);
  auto* s = reinterpret_cast<const uint16_t* const*>(srcs);
  switch (dtype) {
    case DType::bf16: return reduce_half<Bf16>(d, s, n, count, op);
    case DType::f16: return reduce_half<F16>(d, s, n, count, op);
    default:
      reduce_many(dst, srcs, n, count, dtype, op);
      if (op == ReduceOp::avg) scale_for_avg(dst, count, dtype, static_cast<int>(n));
  }
}

void mpi_scale_for_avg(void* dst, size_t count, DType dtype, int divisor) {
  switch (dtype) {
    case DType::bf16: return scale_half<Bf16>(static_cast<uint16_t*>(dst), count, static_cast<float>(divisor));
    case DType::f16: return scale_half<F16>(static_cast<uint16_t*>(dst), count, static_cast<float>(divisor));
    default: return scale_for_avg(dst, count, dtype, divisor);
  }
}

}  // namespace fsdp
