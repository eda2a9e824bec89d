#pragma once
// Element types and the f32 <-> bf16/f16 conversions every layer above relies on.
// Conversions round to nearest, ties to even; NaN stays NaN (quiet), inf stays inf,
// f16 subnormals are produced and read exactly, overflow goes to inf as IEEE says.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace fsdp {

enum class DType : uint8_t { f32, bf16, f16, f64, i32, i64, u8 };

size_t dtype_bytes(DType dtype);
std::string_view dtype_name(DType dtype);
DType parse_dtype(std::string_view name);  // throws Error naming the bad value

uint16_t f32_to_bf16(float value);
float bf16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float value);
float f16_to_f32(uint16_t bits);

// dst[i] = convert(src[i]) for count elements; any pair of the float types (f32, bf16, f16, f64).
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t count);

}  // namespace fsdp
