#include "tensor/dtype.h"

#include <cmath>
#include <cstring>
#include <string>

#include "tensor/error.h"

namespace fsdp {

size_t dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::bf16:
    case DType::f16: return 2;
    case DType::f64: return 8;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  for (DType d : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i32, DType::i64, DType::u8}) {
    if (dtype_name(d) == name) return d;
  }
  throw Error("unknown dtype '" + std::string(name) + "' (expected f32, bf16, f16, f64, i32, i64 or u8)");
}

double load_element(const void* p, DType d, size_t i) {
  switch (d) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::f64: return static_cast<const double*>(p)[i];
    case DType::i32: return static_cast<const int32_t*>(p)[i];
    case DType::i64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::u8: return static_cast<const uint8_t*>(p)[i];
  }
  return 0.0;
}

void store_element(void* p, DType d, size_t i, double v) {
  switch (d) {
    case DType::f32: static_cast<float*>(p)[i] = static_cast<float>(v); return;
    case DType::bf16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(static_cast<float>(v)); return;
    case DType::f16: static_cast<uint16_t*>(p)[i] = f32_to_f16(static_cast<float>(v)); return;
    case DType::f64: static_cast<double*>(p)[i] = v; return;
    case DType::i32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); return;
    case DType::i64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); return;
    case DType::u8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(static_cast<int64_t>(v) & 0xff); return;
  }
}

namespace {
bool is_float(DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16 || d == DType::f64; }

// dst[i] = F(src[i]): a direct call of an inline function, so the loop vectorises.
template <class S, class D, D (*F)(S)>
void map_n(const void* src, void* dst, size_t count) {
  const auto* s = static_cast<const S*>(src);
  auto* d = static_cast<D*>(dst);
  for (size_t i = 0; i < count; ++i) d[i] = F(s[i]);
}
}  // namespace

void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t count) {
  // The hot pairs (f32 <-> half types) get tight loops; the rest go through double, which is
  // exact for every value of the narrower types (f64 -> f32 -> half double-rounds, acceptable
  // for the f64 reference paths that use it).
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, count * dtype_bytes(src_dtype));
    return;
  }
  if (src_dtype == DType::f32 && dst_dtype == DType::bf16) return map_n<float, uint16_t, f32_to_bf16>(src, dst, count);
  if (src_dtype == DType::bf16 && dst_dtype == DType::f32) return map_n<uint16_t, float, bf16_to_f32>(src, dst, count);
  if (src_dtype == DType::f32 && dst_dtype == DType::f16) return map_n<float, uint16_t, f32_to_f16>(src, dst, count);
  if (src_dtype == DType::f16 && dst_dtype == DType::f32) return map_n<uint16_t, float, f16_to_f32>(src, dst, count);
  for (DType d : {src_dtype, dst_dtype})
    if (!is_float(d)) throw Error("convert: " + std::string(dtype_name(d)) + " is not a float type");
  for (size_t i = 0; i < count; ++i) store_element(dst, dst_dtype, i, load_element(src, src_dtype, i));
}

}  // namespace fsdp
