#pragma once
// Element types and the f32 <-> bf16/f16 conversions every layer above relies on.
// Conversions round to nearest, ties to even; NaN stays NaN (quiet), inf stays inf,
// f16 subnormals are produced and read exactly, overflow goes to inf as IEEE says.
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace fsdp {

enum class DType : uint8_t { f32, bf16, f16, f64, i32, i64, u8 };

size_t dtype_bytes(DType dtype);
std::string_view dtype_name(DType dtype);
DType parse_dtype(std::string_view name);  // throws Error naming the bad value

// Inline so loops over arrays (convert, the collective reductions) vectorise.
namespace detail {
inline uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }
inline float float_of(uint32_t u) { return std::bit_cast<float>(u); }

}  // namespace detail

inline uint16_t f32_to_bf16(float value) {
  uint32_t u = detail::bits_of(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  // Round to nearest even: add 0x7fff plus the lowest kept bit; a carry into the exponent
  // correctly rounds the largest finite values up to inf.
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_to_f32(uint16_t bits) { return detail::float_of(static_cast<uint32_t>(bits) << 16); }

inline uint16_t f32_to_f16(float value) {
  uint32_t u = detail::bits_of(value);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  int32_t exp = static_cast<int32_t>(abs >> 23) - 127;
  if (exp >= -14) {  // normal f16
    uint32_t mant = abs & 0x7fffffu;
    uint32_t h = (static_cast<uint32_t>(exp + 15) << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h += 1;  // carry may bump exponent: fine
    return static_cast<uint16_t>(sign | h);
  }
  if (exp < -25) return static_cast<uint16_t>(sign);  // below half the smallest subnormal: zero
  // Subnormal f16: value = m * 2^-24 with m < 1024.
  uint32_t mant = (abs & 0x7fffffu) | 0x800000u;  // implicit 1
  int shift = -exp - 14 + 13;                     // 14..24 + ...
  uint32_t h = mant >> shift;
  uint32_t rest = mant & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u))) h += 1;
  return static_cast<uint16_t>(sign | h);
}

inline float f16_to_f32(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1fu;
  uint32_t mant = bits & 0x3ffu;
  if (exp == 0x1f) return detail::float_of(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {
    if (mant == 0) return detail::float_of(sign);
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  return detail::float_of(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Element i of an array of any dtype, through double (exact for every value of every type but
// large i64): for checks and references, not hot loops. Integers store truncated, u8 wraps.
double load_element(const void* p, DType dtype, size_t i);
void store_element(void* p, DType dtype, size_t i, double value);

// dst[i] = convert(src[i]) for count elements; any pair of the float types (f32, bf16, f16, f64).
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t count);

}  // namespace fsdp
