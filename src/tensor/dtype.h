#pragma once
// Element types and the f32 <-> bf16/f16 conversions every layer above relies on.
// Conversions round to nearest, ties to even; NaN stays NaN (quiet), inf stays inf,
// f16 subnormals are produced and read exactly, overflow goes to inf as IEEE says.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "tensor/half_math.h"

namespace fsdp {

enum class DType : uint8_t { f32, bf16, f16, f64, i32, i64, u8 };

size_t dtype_bytes(DType dtype);
std::string_view dtype_name(DType dtype);
DType parse_dtype(std::string_view name);  // throws Error naming the bad value

// Round to nearest even, as torch's .to(); one definition with the CUDA kernels (half_math.h).
using kmath::bf16_to_f32;
using kmath::f16_to_f32;
using kmath::f32_to_bf16;
using kmath::f32_to_f16;

// Element i of an array of any dtype, through double (exact for every value of every type but
// large i64): for checks and references, not hot loops. Integers store truncated, u8 wraps.
double load_element(const void* p, DType dtype, size_t i);
void store_element(void* p, DType dtype, size_t i, double value);

// dst[i] = convert(src[i]) for count elements; any pair of the float types (f32, bf16, f16, f64).
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t count);

}  // namespace fsdp
