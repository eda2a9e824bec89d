#pragma once
// f32 <-> bf16 / f16 conversions, written once for the host (tensor/dtype.h's f32_to_bf16 & co.,
// used by convert, the collectives' reductions and the CPU kernels) and the CUDA kernels
// (kernel_math.h), so both give the same bits. Inline so host loops over arrays vectorise.
#include <cstdint>
#include <cstring>

// The one preprocessor switch of the CUDA part of tensor/ (with kernel_math.h's add_unfused):
// FSDP_HD marks functions for both the host and the device when nvcc compiles.
#ifndef FSDP_HD
#ifdef __CUDACC__
#define FSDP_HD __host__ __device__
#else
#define FSDP_HD
#endif
#endif

namespace fsdp::kmath {

FSDP_HD inline uint32_t bits_of(float f) {
  uint32_t u = 0;
  memcpy(&u, &f, sizeof u);
  return u;
}
FSDP_HD inline float float_of(uint32_t u) {
  float f = 0.0f;
  memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest even, NaN stays NaN (quiet), overflow goes to inf; as torch's .to().
FSDP_HD inline uint16_t f32_to_bf16(float value) {
  uint32_t u = bits_of(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

FSDP_HD inline float bf16_to_f32(uint16_t bits) { return float_of(static_cast<uint32_t>(bits) << 16); }

// To TF32 (10 mantissa bits) nearest, ties to even, kept in an f32; inf and NaN pass. The GPU's
// tensor cores do not round so (cuBLAS's FAST_TF32 on raw f32 operands differed from this by
// 1.3e-3 relative on an H200): train.matmul_precision high rounds its operands with this first.
FSDP_HD inline float round_to_tf32(float x) {
  uint32_t u = bits_of(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;  // inf, NaN
  u += 0x0fffu + ((u >> 13) & 1u);                 // to nearest, ties to even, at bit 13
  return float_of(u & 0xffffe000u);
}

FSDP_HD inline uint16_t f32_to_f16(float value) {
  uint32_t u = bits_of(value);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  int32_t exp = static_cast<int32_t>(abs >> 23) - 127;
  if (exp >= -14) {  // normal f16
    uint32_t mant = abs & 0x7fffffu;
    uint32_t h = (static_cast<uint32_t>(exp + 15) << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h += 1;
    return static_cast<uint16_t>(sign | h);
  }
  if (exp < -25) return static_cast<uint16_t>(sign);  // below half the smallest subnormal: zero
  uint32_t mant = (abs & 0x7fffffu) | 0x800000u;      // subnormal f16: m * 2^-24, m < 1024
  int shift = -exp - 14 + 13;
  uint32_t h = mant >> shift;
  uint32_t rest = mant & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u))) h += 1;
  return static_cast<uint16_t>(sign | h);
}

FSDP_HD inline float f16_to_f32(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1fu;
  uint32_t mant = bits & 0x3ffu;
  if (exp == 0x1f) return float_of(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {
    if (mant == 0) return float_of(sign);
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // exact: mant * 2^-24 (dtype.h's ldexp)
    return sign ? -v : v;
  }
  return float_of(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace fsdp::kmath
