#define BOOST_TEST_MODULE tensor
#include <boost/test/unit_test.hpp>

#include <omp.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "models/llama/llama.h"
#include "models/t5/t5_buckets.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/kernels.h"
#include "tensor/memory.h"
#include "tensor/ops.h"
#include "tensor/rng.h"
#include "tensor/tensor.h"

using namespace fsdp;

namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
bool signbit_of(float f) { return (bits(f) >> 31) != 0; }

bool f16_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool bf16_is_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }

// Independent f16 decoder: sign * mant * 2^(exp - 25) style arithmetic in double.
double f16_reference_value(uint16_t h) {
  int sign = (h >> 15) & 1;
  int exp = (h >> 10) & 0x1f;
  int mant = h & 0x3ff;
  double v;
  if (exp == 0x1f)
    v = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (exp == 0)
    v = std::ldexp(static_cast<double>(mant), -24);
  else
    v = std::ldexp(static_cast<double>(1024 + mant), exp - 25);
  return sign ? -v : v;
}

// Correctly rounded (nearest, ties to even) f16 value of a finite float, computed in double.
double f16_reference_round(float x) {
  double a = std::fabs(static_cast<double>(x));
  double r;
  if (a >= 65520.0) {
    r = std::numeric_limits<double>::infinity();
  } else if (a < std::ldexp(1.0, -14)) {
    r = std::nearbyint(std::ldexp(a, 24)) * std::ldexp(1.0, -24);  // subnormal grid 2^-24
  } else {
    int e;
    std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): ulp = 2^(e - 11)
    double ulp = std::ldexp(1.0, e - 11);
    r = std::nearbyint(a / ulp) * ulp;
    if (r >= 65520.0) r = std::numeric_limits<double>::infinity();
  }
  return std::signbit(x) ? -r : r;
}

// Correctly rounded bf16 value of a finite float, computed in double (2^-7 relative grid).
double bf16_reference_round(float x) {
  double a = std::fabs(static_cast<double>(x));
  double r;
  if (a == 0.0) {
    r = 0.0;
  } else {
    int e;
    std::frexp(a, &e);
    // f32 subnormals share bf16's subnormal grid 2^-133 (bf16 min exponent = f32's).
    int ulp_exp = std::max(e - 8, -133);
    double ulp = std::ldexp(1.0, ulp_exp);
    r = std::nearbyint(a / ulp) * ulp;
    if (r >= std::ldexp(1.0, 128)) r = std::numeric_limits<double>::infinity();
  }
  return std::signbit(x) ? -r : r;
}

double naive_dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

std::vector<float> random_vec(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(dtype)

BOOST_AUTO_TEST_CASE(names_bytes_and_parse) {
  BOOST_TEST(dtype_bytes(DType::f32) == 4u);
  BOOST_TEST(dtype_bytes(DType::bf16) == 2u);
  BOOST_TEST(dtype_bytes(DType::f16) == 2u);
  BOOST_TEST(dtype_bytes(DType::f64) == 8u);
  BOOST_TEST(dtype_bytes(DType::i32) == 4u);
  BOOST_TEST(dtype_bytes(DType::i64) == 8u);
  BOOST_TEST(dtype_bytes(DType::u8) == 1u);
  for (DType d : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i32, DType::i64, DType::u8})
    BOOST_TEST((parse_dtype(dtype_name(d)) == d));
  BOOST_TEST(dtype_name(DType::bf16) == "bf16");
  BOOST_CHECK_THROW(parse_dtype("float32"), Error);
  BOOST_CHECK_THROW(parse_dtype(""), Error);
  BOOST_CHECK_THROW(parse_dtype("F32"), Error);
  BOOST_CHECK_THROW(parse_dtype("bf16 "), Error);
  try {
    parse_dtype("fp8");
    BOOST_FAIL("no throw");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()).find("fp8") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(bf16_ties_to_even) {
  // ulp at 1.0 is 2^-7; 2^-8 is exactly half an ulp.
  BOOST_TEST(f32_to_bf16(1.0f) == 0x3f80);
  BOOST_TEST(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);      // tie -> even (down)
  BOOST_TEST(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);  // tie -> even (up) = 1 + 2^-6
  BOOST_TEST(bf16_to_f32(0x3f82) == 1.0f + std::ldexp(1.0f, -6));
  BOOST_TEST(f32_to_bf16(1.0f + 5 * std::ldexp(1.0f, -8)) == 0x3f82);  // 1+5/256 tie: 0x3f82 even
  BOOST_TEST(f32_to_bf16(1.0f + 7 * std::ldexp(1.0f, -8)) == 0x3f84);  // 1+7/256 tie: up to 0x3f84
  // Just above / below a tie.
  BOOST_TEST(f32_to_bf16(from_bits(0x3f808001u)) == 0x3f81);
  BOOST_TEST(f32_to_bf16(from_bits(0x3f807fffu)) == 0x3f80);
  BOOST_TEST(f32_to_bf16(from_bits(0x3f818000u)) == 0x3f82);
  BOOST_TEST(f32_to_bf16(from_bits(0x3f817fffu)) == 0x3f81);
  // Negative mirror.
  BOOST_TEST(f32_to_bf16(-(1.0f + std::ldexp(1.0f, -8))) == 0xbf80);
  BOOST_TEST(f32_to_bf16(-(1.0f + 3 * std::ldexp(1.0f, -8))) == 0xbf82);
  // A carry out of the mantissa bumps the exponent: 0x3fff8000 is a tie above odd 0x3fff -> 2.0.
  BOOST_TEST(f32_to_bf16(from_bits(0x3fff8000u)) == 0x4000);
  BOOST_TEST(f32_to_bf16(from_bits(0x3ffe8000u)) == 0x3ffe);
}

BOOST_AUTO_TEST_CASE(bf16_specials) {
  const float inf = std::numeric_limits<float>::infinity();
  BOOST_TEST(f32_to_bf16(inf) == 0x7f80);
  BOOST_TEST(f32_to_bf16(-inf) == 0xff80);
  BOOST_TEST(std::isinf(bf16_to_f32(0x7f80)));
  BOOST_TEST(bf16_to_f32(0xff80) == -inf);
  // Largest finite f32 rounds up to inf; so does the exact tie above bf16's max finite (odd).
  BOOST_TEST(f32_to_bf16(std::numeric_limits<float>::max()) == 0x7f80);
  BOOST_TEST(f32_to_bf16(-std::numeric_limits<float>::max()) == 0xff80);
  BOOST_TEST(f32_to_bf16(from_bits(0x7f7f8000u)) == 0x7f80);
  BOOST_TEST(f32_to_bf16(from_bits(0x7f7f7fffu)) == 0x7f7f);
  // Signed zero.
  BOOST_TEST(f32_to_bf16(0.0f) == 0x0000);
  BOOST_TEST(f32_to_bf16(-0.0f) == 0x8000);
  BOOST_TEST(signbit_of(bf16_to_f32(0x8000)));
  BOOST_TEST(bf16_to_f32(0x8000) == 0.0f);
  // NaNs: quiet NaN, signalling NaN (payload only in the low bits), negative NaN.
  for (uint32_t nan_bits :
       {0x7fc00000u, 0x7f800001u, 0x7f800100u, 0xffc00000u, 0xff800001u, 0x7fffffffu, 0x7fa00000u}) {
    uint16_t h = f32_to_bf16(from_bits(nan_bits));
    BOOST_TEST(bf16_is_nan(h), "nan " << std::hex << nan_bits << " -> " << h);
    BOOST_TEST((h & 0x40u) != 0u, "quiet bit for " << std::hex << nan_bits);
    BOOST_TEST((h >> 15) == (nan_bits >> 31), "sign of nan " << std::hex << nan_bits);
    BOOST_TEST(std::isnan(bf16_to_f32(h)));
  }
  // Subnormal f32 inputs round on the same grid.
  BOOST_TEST(f32_to_bf16(from_bits(0x00000001u)) == 0x0000);
  BOOST_TEST(f32_to_bf16(from_bits(0x00008000u)) == 0x0000);  // tie -> even 0
  BOOST_TEST(f32_to_bf16(from_bits(0x00018000u)) == 0x0002);  // tie -> even 2
  BOOST_TEST(f32_to_bf16(from_bits(0x00010000u)) == 0x0001);
}

BOOST_AUTO_TEST_CASE(bf16_all_patterns_round_trip) {
  int nans = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    uint16_t h = static_cast<uint16_t>(b);
    float f = bf16_to_f32(h);
    // Decoding is exactly the top half of the f32 bits.
    BOOST_TEST_REQUIRE(bits(f) == (b << 16));
    uint16_t back = f32_to_bf16(f);
    if (bf16_is_nan(h)) {
      ++nans;
      BOOST_TEST_REQUIRE(bf16_is_nan(back));
      BOOST_TEST_REQUIRE((back >> 15) == (h >> 15));
    } else {
      BOOST_TEST_REQUIRE(back == h, "bf16 " << std::hex << b << " -> " << back);
    }
  }
  BOOST_TEST(nans == 2 * 127);
}

BOOST_AUTO_TEST_CASE(bf16_matches_reference_rounding) {
  std::mt19937 gen(7);
  for (int i = 0; i < 1 << 20; ++i) {
    uint32_t u = gen();
    // Bias half of the draws onto exact ties and near-ties.
    if (i & 1) u = (u & 0xffff0000u) | (0x8000u + static_cast<uint32_t>(static_cast<int>(i % 5) - 2));
    float x = from_bits(u);
    if (std::isnan(x)) continue;
    double got = bf16_to_f32(f32_to_bf16(x));
    double want = bf16_reference_round(x);
    BOOST_TEST_REQUIRE(got == want, "x bits " << std::hex << u << " got " << got << " want " << want);
    BOOST_TEST_REQUIRE(std::signbit(got) == std::signbit(x));
  }
}

BOOST_AUTO_TEST_CASE(f16_specific_values) {
  const float inf = std::numeric_limits<float>::infinity();
  BOOST_TEST(f32_to_f16(1.0f) == 0x3c00);
  BOOST_TEST(f32_to_f16(-2.0f) == 0xc000);
  BOOST_TEST(f32_to_f16(65504.0f) == 0x7bff);
  BOOST_TEST(f16_to_f32(0x7bff) == 65504.0f);
  BOOST_TEST(f32_to_f16(65519.0f) == 0x7bff);
  BOOST_TEST(f32_to_f16(std::nextafter(65520.0f, 0.0f)) == 0x7bff);
  BOOST_TEST(f32_to_f16(65520.0f) == 0x7c00);  // tie with odd max finite -> inf
  BOOST_TEST(f32_to_f16(-65520.0f) == 0xfc00);
  BOOST_TEST(f32_to_f16(1e6f) == 0x7c00);
  BOOST_TEST(f32_to_f16(std::numeric_limits<float>::max()) == 0x7c00);
  BOOST_TEST(f32_to_f16(inf) == 0x7c00);
  BOOST_TEST(f32_to_f16(-inf) == 0xfc00);
  BOOST_TEST(f16_to_f32(0x7c00) == inf);
  BOOST_TEST(f16_to_f32(0xfc00) == -inf);
  // Signed zero.
  BOOST_TEST(f32_to_f16(0.0f) == 0x0000);
  BOOST_TEST(f32_to_f16(-0.0f) == 0x8000);
  BOOST_TEST(signbit_of(f16_to_f32(0x8000)));
  // Subnormals and the underflow boundary.
  BOOST_TEST(f32_to_f16(std::ldexp(1.0f, -24)) == 0x0001);
  BOOST_TEST(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));
  BOOST_TEST(f32_to_f16(std::ldexp(1.0f, -25)) == 0x0000);   // tie -> even 0
  BOOST_TEST(f32_to_f16(-std::ldexp(1.0f, -25)) == 0x8000);  // keeps the sign
  BOOST_TEST(f32_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)) == 0x0001);
  BOOST_TEST(f32_to_f16(3 * std::ldexp(1.0f, -26)) == 0x0001);  // 0.75 * 2^-24
  BOOST_TEST(f32_to_f16(3 * std::ldexp(1.0f, -25)) == 0x0002);  // 1.5 * 2^-24: tie -> 2
  BOOST_TEST(f32_to_f16(5 * std::ldexp(1.0f, -25)) == 0x0002);  // 2.5 * 2^-24: tie -> 2
  BOOST_TEST(f32_to_f16(std::ldexp(1.0f, -26)) == 0x0000);
  BOOST_TEST(f32_to_f16(std::ldexp(1.0f, -40)) == 0x0000);
  BOOST_TEST(f32_to_f16(from_bits(0x00000001u)) == 0x0000);    // f32 subnormal
  BOOST_TEST(f32_to_f16(std::ldexp(1023.0f, -24)) == 0x03ff);  // largest subnormal
  BOOST_TEST(f32_to_f16(std::ldexp(1023.5f, -24)) == 0x0400);  // tie -> even: smallest normal
  BOOST_TEST(f32_to_f16(std::ldexp(1022.5f, -24)) == 0x03fe);  // tie -> even down
  BOOST_TEST(f32_to_f16(std::ldexp(1.0f, -14)) == 0x0400);
  // Normal ties: ulp at 1 is 2^-10.
  BOOST_TEST(f32_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);
  BOOST_TEST(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
  BOOST_TEST(f32_to_f16(2049.0f) == f32_to_f16(2048.0f));
  BOOST_TEST(f16_to_f32(f32_to_f16(2051.0f)) == 2052.0f);
  BOOST_TEST(f16_to_f32(f32_to_f16(2050.0f)) == 2050.0f);
  // Mantissa carry into the exponent: 2047.5 rounds... ulp at [1024, 2048) is 1: 2047.5 tie -> 2048.
  BOOST_TEST(f16_to_f32(f32_to_f16(2047.5f)) == 2048.0f);
  // NaN stays NaN and is quiet; sign kept.
  for (uint32_t nan_bits : {0x7fc00000u, 0x7f800001u, 0x7f801000u, 0xffc00000u, 0x7fffffffu, 0x7fa00000u}) {
    uint16_t h = f32_to_f16(from_bits(nan_bits));
    BOOST_TEST(f16_is_nan(h), "nan " << std::hex << nan_bits << " -> " << h);
    BOOST_TEST((h & 0x200u) != 0u, "quiet bit for " << std::hex << nan_bits);
    BOOST_TEST((h >> 15) == (nan_bits >> 31));
  }
}

BOOST_AUTO_TEST_CASE(f16_all_subnormals_exact) {
  for (int m = 1; m < 1024; ++m) {
    float v = std::ldexp(static_cast<float>(m), -24);
    BOOST_TEST_REQUIRE(f32_to_f16(v) == m);
    BOOST_TEST_REQUIRE(f32_to_f16(-v) == (0x8000 | m));
    BOOST_TEST_REQUIRE(f16_to_f32(static_cast<uint16_t>(m)) == v);
    BOOST_TEST_REQUIRE(f16_to_f32(static_cast<uint16_t>(0x8000 | m)) == -v);
  }
}

BOOST_AUTO_TEST_CASE(f16_all_patterns_round_trip) {
  int nans = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    uint16_t h = static_cast<uint16_t>(b);
    float f = f16_to_f32(h);
    double ref = f16_reference_value(h);
    if (f16_is_nan(h)) {
      ++nans;
      BOOST_TEST_REQUIRE(std::isnan(f));
      uint16_t back = f32_to_f16(f);
      BOOST_TEST_REQUIRE(f16_is_nan(back));
      BOOST_TEST_REQUIRE((back >> 15) == (h >> 15));
      continue;
    }
    BOOST_TEST_REQUIRE(static_cast<double>(f) == ref, "f16 " << std::hex << b);
    BOOST_TEST_REQUIRE(std::signbit(f) == ((h >> 15) != 0));
    BOOST_TEST_REQUIRE(f32_to_f16(f) == h, "f16 " << std::hex << b << " -> " << f32_to_f16(f));
  }
  BOOST_TEST(nans == 2 * 1023);
}

BOOST_AUTO_TEST_CASE(f16_matches_reference_rounding) {
  // Every midpoint between adjacent positive f16 values (and its neighbours) plus random floats.
  for (uint32_t b = 0; b < 0x7bff; ++b) {
    double lo = f16_reference_value(static_cast<uint16_t>(b));
    double hi = f16_reference_value(static_cast<uint16_t>(b + 1));
    float mid = static_cast<float>((lo + hi) / 2);  // exact in f32
    BOOST_TEST_REQUIRE(static_cast<double>(mid) == (lo + hi) / 2);
    uint16_t want = (b & 1u) ? static_cast<uint16_t>(b + 1) : static_cast<uint16_t>(b);
    BOOST_TEST_REQUIRE(f32_to_f16(mid) == want, "midpoint after " << std::hex << b);
    BOOST_TEST_REQUIRE(f32_to_f16(std::nextafter(mid, 0.0f)) == b);
    BOOST_TEST_REQUIRE(f32_to_f16(std::nextafter(mid, 1e9f)) == b + 1);
    BOOST_TEST_REQUIRE(f32_to_f16(-mid) == (0x8000u | want));
  }
  std::mt19937 gen(11);
  for (int i = 0; i < 1 << 20; ++i) {
    // Exponents concentrated around f16's range.
    uint32_t u = gen();
    uint32_t exp = 127 - 30 + (gen() % 50);
    u = (u & 0x807fffffu) | (exp << 23);
    float x = from_bits(u);
    double got = f16_to_f32(f32_to_f16(x));
    double want = f16_reference_round(x);
    BOOST_TEST_REQUIRE(got == want, "x bits " << std::hex << u << " got " << got << " want " << want);
    BOOST_TEST_REQUIRE(std::signbit(got) == std::signbit(x));
  }
}

BOOST_AUTO_TEST_CASE(convert_all_float_pairs) {
  const double inf = std::numeric_limits<double>::infinity();
  // Exactly representable in every float type.
  const std::vector<double> vals = {0.0,
                                    -0.0,
                                    1.0,
                                    -2.0,
                                    0.5,
                                    3.5,
                                    96.0,
                                    -0.09375,
                                    std::ldexp(1.0, -14),
                                    -1024.0,
                                    inf,
                                    -inf,
                                    std::numeric_limits<double>::quiet_NaN()};
  const size_t n = vals.size();
  const DType types[] = {DType::f32, DType::bf16, DType::f16, DType::f64};
  auto encode = [&](DType d, const std::vector<double>& v) {
    std::vector<unsigned char> buf(v.size() * dtype_bytes(d));
    for (size_t i = 0; i < v.size(); ++i) {
      float f = static_cast<float>(v[i]);
      switch (d) {
        case DType::f32: std::memcpy(buf.data() + 4 * i, &f, 4); break;
        case DType::f64: std::memcpy(buf.data() + 8 * i, &v[i], 8); break;
        case DType::bf16: {
          uint16_t h = f32_to_bf16(f);
          std::memcpy(buf.data() + 2 * i, &h, 2);
          break;
        }
        case DType::f16: {
          uint16_t h = f32_to_f16(f);
          std::memcpy(buf.data() + 2 * i, &h, 2);
          break;
        }
        default: break;
      }
    }
    return buf;
  };
  auto decode = [&](DType d, const std::vector<unsigned char>& buf, size_t i) -> double {
    switch (d) {
      case DType::f32: {
        float f;
        std::memcpy(&f, buf.data() + 4 * i, 4);
        return f;
      }
      case DType::f64: {
        double x;
        std::memcpy(&x, buf.data() + 8 * i, 8);
        return x;
      }
      case DType::bf16: {
        uint16_t h;
        std::memcpy(&h, buf.data() + 2 * i, 2);
        return bf16_to_f32(h);
      }
      case DType::f16: {
        uint16_t h;
        std::memcpy(&h, buf.data() + 2 * i, 2);
        return f16_to_f32(h);
      }
      default: return 0.0;
    }
  };
  for (DType s : types) {
    for (DType d : types) {
      auto src = encode(s, vals);
      std::vector<unsigned char> dst(n * dtype_bytes(d), 0xAB);
      convert(src.data(), s, dst.data(), d, n);
      for (size_t i = 0; i < n; ++i) {
        double got = decode(d, dst, i);
        if (std::isnan(vals[i])) {
          BOOST_TEST(std::isnan(got), dtype_name(s) << "->" << dtype_name(d) << " nan");
        } else {
          BOOST_TEST(got == vals[i], dtype_name(s) << "->" << dtype_name(d) << " [" << i << "]");
          BOOST_TEST(std::signbit(got) == std::signbit(vals[i]), dtype_name(s) << "->" << dtype_name(d));
        }
      }
    }
  }
  // Rounding paths.
  {
    float src[3] = {1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8), 65520.0f};
    uint16_t out[3];
    convert(src, DType::f32, out, DType::bf16, 3);
    BOOST_TEST(out[0] == 0x3f80);
    BOOST_TEST(out[1] == 0x3f82);
    convert(src, DType::f32, out, DType::f16, 3);
    BOOST_TEST(out[0] == 0x3c04);  // f16's ulp at 1 is 2^-10: 1 + 2^-8 is exact
    BOOST_TEST(f16_to_f32(out[0]) == src[0]);
    BOOST_TEST(out[2] == 0x7c00);
  }
  {
    uint16_t h = f32_to_f16(1.0f + std::ldexp(1.0f, -10));  // exact in f16, below half a bf16 ulp -> 1.0
    uint16_t b;
    convert(&h, DType::f16, &b, DType::bf16, 1);
    BOOST_TEST(b == 0x3f80);
    double d = 1.0 + std::ldexp(1.0, -30);
    float f;
    convert(&d, DType::f64, &f, DType::f32, 1);
    BOOST_TEST(f == 1.0f);
    uint16_t bb = 0x3f81;
    double back;
    convert(&bb, DType::bf16, &back, DType::f64, 1);
    BOOST_TEST(back == 1.0 + std::ldexp(1.0, -7));
  }
  int32_t iv[2] = {1, 2};
  float fv[2];
  BOOST_CHECK_THROW(convert(iv, DType::i32, fv, DType::f32, 2), Error);
  BOOST_CHECK_THROW(convert(fv, DType::f32, iv, DType::i32, 2), Error);
}

BOOST_AUTO_TEST_SUITE_END()

// ---------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(memory)

BOOST_AUTO_TEST_CASE(category_names) {
  BOOST_TEST(mem_category_name(MemCategory::params) == "params");
  BOOST_TEST(mem_category_name(MemCategory::grads) == "grads");
  BOOST_TEST(mem_category_name(MemCategory::optim) == "optim");
  BOOST_TEST(mem_category_name(MemCategory::gathered) == "gathered");
  BOOST_TEST(mem_category_name(MemCategory::activations) == "activations");
  BOOST_TEST(mem_category_name(MemCategory::comm) == "comm");
  BOOST_TEST(mem_category_name(MemCategory::other) == "other");
}

BOOST_AUTO_TEST_CASE(tracker_through_tensors) {
  MemoryTracker tr;
  BOOST_TEST(tr.current_total_bytes() == 0u);
  {
    Tensor a = Tensor::empty({10, 10}, DType::f32, MemCategory::params, &tr);
    BOOST_TEST(tr.current_bytes(MemCategory::params) == 400u);
    BOOST_TEST(tr.peak_bytes(MemCategory::params) == 400u);
    BOOST_TEST(tr.current_total_bytes() == 400u);
    BOOST_TEST(tr.peak_total_bytes() == 400u);
    {
      Tensor copy = a;  // shares the buffer
      Tensor v = a.view({100});
      Tensor v2 = v.view({4, 25});
      BOOST_TEST(copy.raw() == a.raw());
      BOOST_TEST(v2.raw() == a.raw());
      BOOST_TEST(tr.current_total_bytes() == 400u);
      a = Tensor();  // the copies keep it alive
      BOOST_TEST(tr.current_bytes(MemCategory::params) == 400u);
      a = copy;
    }
    BOOST_TEST(tr.current_bytes(MemCategory::params) == 400u);
    Tensor g = a.clone(MemCategory::grads, &tr);
    BOOST_TEST(g.raw() != a.raw());
    BOOST_TEST(tr.current_bytes(MemCategory::grads) == 400u);
    BOOST_TEST(tr.current_total_bytes() == 800u);
    BOOST_TEST(tr.peak_total_bytes() == 800u);
    Tensor h = Tensor::zeros({3, 7}, DType::bf16, MemCategory::activations, &tr);
    BOOST_TEST(tr.current_bytes(MemCategory::activations) == 42u);
    BOOST_TEST(tr.current_total_bytes() == 842u);
    Tensor untracked = Tensor::empty({1000}, DType::f32);  // no tracker: not counted
    Tensor untracked_clone = a.clone();
    BOOST_TEST(tr.current_total_bytes() == 842u);
    g = Tensor();
    BOOST_TEST(tr.current_bytes(MemCategory::grads) == 0u);
    BOOST_TEST(tr.peak_bytes(MemCategory::grads) == 400u);
    BOOST_TEST(tr.current_total_bytes() == 442u);
    BOOST_TEST(tr.peak_total_bytes() == 842u);
    Tensor d = Tensor::empty({5}, DType::f64, MemCategory::optim, &tr);
    BOOST_TEST(tr.current_bytes(MemCategory::optim) == 40u);
    BOOST_TEST(tr.current_total_bytes() == 482u);
    BOOST_TEST(tr.peak_total_bytes() == 842u);  // 482 < 842
  }
  for (size_t c = 0; c < kMemCategoryCount; ++c) BOOST_TEST(tr.current_bytes(static_cast<MemCategory>(c)) == 0u);
  BOOST_TEST(tr.current_total_bytes() == 0u);
  BOOST_TEST(tr.peak_bytes(MemCategory::params) == 400u);
  BOOST_TEST(tr.peak_bytes(MemCategory::activations) == 42u);
  BOOST_TEST(tr.peak_bytes(MemCategory::optim) == 40u);
  BOOST_TEST(tr.peak_bytes(MemCategory::comm) == 0u);
  BOOST_TEST(tr.peak_total_bytes() == 842u);
}

BOOST_AUTO_TEST_CASE(reset_peaks_starts_a_window) {
  MemoryTracker tr;
  Tensor keep = Tensor::empty({8}, DType::f32, MemCategory::gathered, &tr);  // 32 bytes
  {
    Tensor tmp = Tensor::empty({100}, DType::f32, MemCategory::gathered, &tr);
    Tensor tmp2 = Tensor::empty({50}, DType::f32, MemCategory::comm, &tr);
  }
  BOOST_TEST(tr.peak_bytes(MemCategory::gathered) == 432u);
  BOOST_TEST(tr.peak_bytes(MemCategory::comm) == 200u);
  BOOST_TEST(tr.peak_total_bytes() == 632u);
  tr.reset_peaks();
  BOOST_TEST(tr.peak_bytes(MemCategory::gathered) == 32u);
  BOOST_TEST(tr.peak_bytes(MemCategory::comm) == 0u);
  BOOST_TEST(tr.peak_total_bytes() == 32u);
  {
    Tensor tmp = Tensor::empty({10}, DType::f32, MemCategory::comm, &tr);
    BOOST_TEST(tr.peak_total_bytes() == 72u);
  }
  BOOST_TEST(tr.peak_bytes(MemCategory::comm) == 40u);
  BOOST_TEST(tr.peak_total_bytes() == 72u);
  BOOST_TEST(tr.current_total_bytes() == 32u);
  // Direct calls.
  MemoryTracker t2;
  t2.on_alloc(MemCategory::other, 10);
  t2.on_alloc(MemCategory::params, 5);
  t2.on_free(MemCategory::other, 10);
  t2.on_alloc(MemCategory::params, 3);
  BOOST_TEST(t2.current_bytes(MemCategory::params) == 8u);
  BOOST_TEST(t2.peak_bytes(MemCategory::other) == 10u);
  BOOST_TEST(t2.peak_total_bytes() == 15u);
  BOOST_TEST(t2.current_total_bytes() == 8u);
}

BOOST_AUTO_TEST_CASE(ensure_reuses_and_reallocates) {
  MemoryTracker tr;
  Tensor t;
  ensure(t, {4, 6}, DType::f32, MemCategory::activations, &tr);
  BOOST_TEST(t.defined());
  void* p = t.raw();
  BOOST_TEST(tr.current_bytes(MemCategory::activations) == 96u);
  ensure(t, {4, 6}, DType::f32, MemCategory::activations, &tr);
  BOOST_TEST(t.raw() == p);  // same shape: same buffer
  BOOST_TEST(tr.current_bytes(MemCategory::activations) == 96u);
  BOOST_TEST(tr.peak_bytes(MemCategory::activations) == 96u);
  ensure(t, {6, 4}, DType::f32, MemCategory::activations, &tr);  // new shape: new buffer
  BOOST_TEST(t.shape() == (Shape{6, 4}));
  BOOST_TEST(tr.current_bytes(MemCategory::activations) == 96u);
  ensure(t, {6, 4}, DType::i32, MemCategory::activations, &tr);  // new dtype
  BOOST_TEST((t.dtype() == DType::i32));
  ensure(t, {2, 4}, DType::i32, MemCategory::activations, &tr);
  BOOST_TEST(tr.current_bytes(MemCategory::activations) == 32u);
  BOOST_TEST(t.matches({2, 4}, DType::i32));
  BOOST_TEST(!t.matches({2, 4}, DType::f32));
  BOOST_TEST(!t.matches({8}, DType::i32));
  BOOST_TEST(!Tensor().matches({}, DType::f32));
}

BOOST_AUTO_TEST_SUITE_END()

// ---------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(tensor)

BOOST_AUTO_TEST_CASE(shapes_and_numel) {
  BOOST_TEST(shape_numel({}) == 1);
  BOOST_TEST(shape_numel({0, 5}) == 0);
  BOOST_TEST(shape_numel({64, 1, 28, 28}) == 50176);
  BOOST_CHECK_THROW(shape_numel({2, -1}), Error);
  BOOST_TEST(shape_str({64, 1, 28, 28}) == "[64, 1, 28, 28]");
  BOOST_TEST(shape_str({}) == "[]");
  BOOST_TEST(shape_str({7}) == "[7]");
  Tensor t = Tensor::empty({2, 3, 4}, DType::f32);
  BOOST_TEST(t.numel() == 24);
  BOOST_TEST(t.ndim() == 3u);
  BOOST_TEST(t.dim(1) == 3);
  BOOST_CHECK_THROW(t.dim(3), std::out_of_range);
  BOOST_TEST(t.bytes() == 96u);
  BOOST_TEST((t.device() == Device::cpu));
  BOOST_TEST(reinterpret_cast<uintptr_t>(t.raw()) % 64 == 0u);
  Tensor b = Tensor::empty({3}, DType::bf16);
  BOOST_TEST(b.bytes() == 6u);
  BOOST_TEST(reinterpret_cast<uintptr_t>(b.raw()) % 64 == 0u);
  Tensor e = Tensor::empty({0}, DType::f32);
  BOOST_TEST(e.defined());
  BOOST_TEST(e.numel() == 0);
  Tensor u;
  BOOST_TEST(!u.defined());
  BOOST_TEST(u.raw() == nullptr);
  BOOST_TEST(u.numel() == 0);
}

BOOST_AUTO_TEST_CASE(typed_access_checks_dtype) {
  Tensor f = Tensor::zeros({5}, DType::f32);
  for (int i = 0; i < 5; ++i) BOOST_TEST(f.f32()[i] == 0.0f);
  BOOST_CHECK_THROW(f.i32(), Error);
  Tensor i = Tensor::zeros({5}, DType::i32);
  BOOST_TEST(i.i32()[4] == 0);
  BOOST_CHECK_THROW(i.f32(), Error);
  BOOST_CHECK_THROW(Tensor::empty({2}, DType::bf16).f32(), Error);
}

BOOST_AUTO_TEST_CASE(views_and_clones) {
  Tensor t = Tensor::empty({2, 6}, DType::f32);
  for (int i = 0; i < 12; ++i) t.f32()[i] = static_cast<float>(i);
  Tensor v = t.view({3, 4});
  BOOST_TEST(v.raw() == t.raw());
  BOOST_TEST(v.shape() == (Shape{3, 4}));
  BOOST_TEST(t.shape() == (Shape{2, 6}));  // original unchanged
  v.f32()[5] = 100.0f;
  BOOST_TEST(t.f32()[5] == 100.0f);
  BOOST_TEST(t.view({12}).numel() == 12);
  BOOST_TEST(t.view({1, 12, 1}).ndim() == 3u);
  BOOST_CHECK_THROW(t.view({5, 2}), Error);
  BOOST_CHECK_THROW(t.view({13}), Error);
  BOOST_CHECK_THROW(t.view({}), Error);
  BOOST_CHECK_THROW(t.view({-2, -6}), Error);
  try {
    t.view({5, 2});
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()).find("[5, 2]") != std::string::npos);
    BOOST_TEST(std::string(e.what()).find("[2, 6]") != std::string::npos);
  }
  Tensor c = t.clone();
  BOOST_TEST(c.raw() != t.raw());
  BOOST_TEST(c.shape() == t.shape());
  BOOST_TEST(std::memcmp(c.raw(), t.raw(), t.bytes()) == 0);
  c.f32()[0] = -1.0f;
  BOOST_TEST(t.f32()[0] == 0.0f);
  t.zero();
  for (int i = 0; i < 12; ++i) BOOST_TEST(v.f32()[i] == 0.0f);
  Tensor ci = Tensor::zeros({3}, DType::i32).clone();
  BOOST_TEST((ci.dtype() == DType::i32));
}

// Buffer::pack holds bf16 (or f16) values of an f32 buffer at half the bytes, charged as such, and
// gives every handle the same f32 values back; reading through any handle unpacks first.
BOOST_AUTO_TEST_CASE(buffer_packs_exact_values_at_half_the_bytes) {
  for (DType held : {DType::bf16, DType::f16}) {
    MemoryTracker mem;
    Tensor t = Tensor::empty({3, 5}, DType::f32, MemCategory::activations, &mem);
    Tensor view = t.view({15});
    // Values of the held dtype (so lossless), with a signed zero, a subnormal of f32 that bf16
    // holds, and infinity.
    const float vals[15] = {0.0f,      -0.0f,      1.0f, -2.5f, 0.15625f, 1024.0f,
                            -32768.0f, 3.0f,       0.5f, 7.0f,  -0.75f,   std::numeric_limits<float>::infinity(),
                            96.0f,     -1.0f / 64, 12.0f};
    std::memcpy(t.f32(), vals, sizeof vals);
    BOOST_TEST(mem.current_bytes(MemCategory::activations) == 60u);
    t.storage()->pack(held);
    BOOST_TEST(t.storage()->packed());
    BOOST_TEST(mem.current_bytes(MemCategory::activations) == 30u);  // the f32 block freed
    BOOST_TEST(mem.peak_bytes(MemCategory::activations) == 90u);     // both during the cast
    t.storage()->pack(held);                                         // packing twice: nothing
    BOOST_TEST(mem.current_bytes(MemCategory::activations) == 30u);
    const float* back = view.f32();  // any handle's access unpacks
    BOOST_TEST(!t.storage()->packed());
    BOOST_TEST(mem.current_bytes(MemCategory::activations) == 60u);
    BOOST_TEST(std::memcmp(back, vals, sizeof vals) == 0);  // bitwise (-0.0 too)
    t.storage()->unpack();                                  // not packed: nothing
    BOOST_TEST(std::memcmp(t.f32(), vals, sizeof vals) == 0);
  }
  // A value the held dtype cannot hold comes back rounded: why the stash packs only what
  // RunCtx::round rounded.
  Tensor u = Tensor::empty({1}, DType::f32);
  u.f32()[0] = 1.0f + 1.0f / 1024;
  u.storage()->pack(DType::bf16);
  BOOST_TEST(u.f32()[0] == 1.0f);
  BOOST_CHECK_THROW(u.storage()->pack(DType::i32), Error);
}

BOOST_AUTO_TEST_SUITE_END()

// ---------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(rng)

BOOST_AUTO_TEST_CASE(philox_known_answers) {
  // Random123's kat_vectors for philox4x32_10: (counter words, key words) -> output.
  // Counter words 0,1 are our counter (low, high), 2,3 the stream; key words the key.
  {
    CounterRng r(0, 0);
    auto b = r.block(0);
    BOOST_TEST(b[0] == 0x6627e8d5u);
    BOOST_TEST(b[1] == 0xe169c58du);
    BOOST_TEST(b[2] == 0xbc57ac4cu);
    BOOST_TEST(b[3] == 0x9b00dbd8u);
  }
  {
    CounterRng r(0xffffffffffffffffull, 0xffffffffffffffffull);
    auto b = r.block(0xffffffffffffffffull);
    BOOST_TEST(b[0] == 0x408f276du);
    BOOST_TEST(b[1] == 0x41c83b0eu);
    BOOST_TEST(b[2] == 0xa20bc7c6u);
    BOOST_TEST(b[3] == 0x6d5451fdu);
  }
  {
    CounterRng r(0x299f31d0a4093822ull, 0x0370734413198a2eull);
    auto b = r.block(0x85a308d3243f6a88ull);
    BOOST_TEST(b[0] == 0xd16cfe09u);
    BOOST_TEST(b[1] == 0x94fdccebu);
    BOOST_TEST(b[2] == 0x5001e420u);
    BOOST_TEST(b[3] == 0x24126ea1u);
  }
}

BOOST_AUTO_TEST_CASE(hash_is_fnv1a) {
  BOOST_TEST(hash_name("") == 0xcbf29ce484222325ull);
  BOOST_TEST(hash_name("a") == 0xaf63dc4c8601ec8cull);
  BOOST_TEST(hash_name("foobar") == 0x85944171f73967e8ull);
  BOOST_TEST(hash_name("fc1.weight") != hash_name("fc1.bias"));
}

BOOST_AUTO_TEST_CASE(values_are_position_independent) {
  CounterRng r(42, hash_name("x"));
  std::vector<float> seq(1000);
  for (int i = 0; i < 1000; ++i) seq[i] = r.uniform(i);
  for (int i : {999, 0, 500, 17, 3}) {
    CounterRng fresh(42, hash_name("x"));
    BOOST_TEST(fresh.uniform(i) == seq[i]);
    BOOST_TEST(fresh.bits64(i) == r.bits64(i));
    BOOST_TEST(fresh.normal(i) == r.normal(i));
  }
  // Different key / stream / counter give different streams.
  BOOST_TEST(CounterRng(42, 1).bits64(0) != CounterRng(43, 1).bits64(0));
  BOOST_TEST(CounterRng(42, 1).bits64(0) != CounterRng(42, 2).bits64(0));
  BOOST_TEST(CounterRng(42, 1).bits64(0) != CounterRng(42, 1).bits64(1));
  // Counter high word matters.
  BOOST_TEST(CounterRng(42, 1).bits64(5) != CounterRng(42, 1).bits64(5 + (1ull << 32)));
  auto b = r.block(7);
  BOOST_TEST(r.bits64(7) == ((static_cast<uint64_t>(b[1]) << 32) | b[0]));
  BOOST_TEST(r.uniform(7) == static_cast<float>(b[0] >> 8) / 16777216.0f);
}

BOOST_AUTO_TEST_CASE(init_slices_match_full_init) {
  const size_t n = 5000;
  std::vector<float> full(n);
  init_uniform(full.data(), n, 0, 7, "layer.weight", -0.25f, 0.75f);
  std::vector<float> fulln(n);
  init_normal(fulln.data(), n, 0, 7, "layer.weight", 1.0f, 0.5f);
  std::mt19937 gen(3);
  for (int trial = 0; trial < 20; ++trial) {
    size_t a = gen() % n, b = gen() % n;
    if (a > b) std::swap(a, b);
    std::vector<float> part(b - a + 1);
    init_uniform(part.data(), b - a, a, 7, "layer.weight", -0.25f, 0.75f);
    for (size_t i = a; i < b; ++i) BOOST_TEST_REQUIRE(part[i - a] == full[i]);
    init_normal(part.data(), b - a, a, 7, "layer.weight", 1.0f, 0.5f);
    for (size_t i = a; i < b; ++i) BOOST_TEST_REQUIRE(part[i - a] == fulln[i]);
  }
  std::vector<float> other(n);
  init_uniform(other.data(), n, 0, 8, "layer.weight", -0.25f, 0.75f);
  BOOST_TEST(other != full);
  init_uniform(other.data(), n, 0, 7, "layer.bias", -0.25f, 0.75f);
  BOOST_TEST(other != full);
  for (float x : full) BOOST_TEST_REQUIRE((x >= -0.25f && x < 0.75f));
}

BOOST_AUTO_TEST_CASE(uniform_statistics) {
  CounterRng r(1234, hash_name("stats"));
  const int n = 100000;
  double sum = 0.0, sq = 0.0;
  float mn = 1.0f, mx = 0.0f;
  for (int i = 0; i < n; ++i) {
    float u = r.uniform(i);
    BOOST_TEST_REQUIRE((u >= 0.0f && u < 1.0f));
    sum += u;
    sq += static_cast<double>(u) * u;
    mn = std::min(mn, u);
    mx = std::max(mx, u);
  }
  double mean = sum / n, var = sq / n - mean * mean;
  BOOST_TEST(std::fabs(mean - 0.5) < 0.005);        // sigma ~ 0.0009
  BOOST_TEST(std::fabs(var - 1.0 / 12.0) < 0.002);  // sigma ~ 0.0003
  BOOST_TEST(mn < 1e-3f);
  BOOST_TEST(mx > 1.0f - 1e-3f);
  // Deciles roughly equal.
  std::vector<int> hist(10, 0);
  for (int i = 0; i < n; ++i) ++hist[static_cast<int>(r.uniform(i) * 10)];
  for (int h : hist) BOOST_TEST(std::abs(h - n / 10) < 600);  // sigma ~ 95
}

BOOST_AUTO_TEST_CASE(normal_statistics) {
  CounterRng r(99, hash_name("normal"));
  const int n = 100000;
  double sum = 0.0, sq = 0.0, cube = 0.0;
  int within1 = 0;
  for (int i = 0; i < n; ++i) {
    double z = r.normal(i);
    BOOST_TEST_REQUIRE(std::isfinite(z));
    sum += z;
    sq += z * z;
    cube += z * z * z;
    within1 += std::fabs(z) < 1.0;
  }
  double mean = sum / n, std = std::sqrt(sq / n - mean * mean);
  BOOST_TEST(std::fabs(mean) < 0.02);        // sigma ~ 0.003
  BOOST_TEST(std::fabs(std - 1.0) < 0.015);  // sigma ~ 0.0022
  BOOST_TEST(std::fabs(cube / n) < 0.05);    // symmetric
  BOOST_TEST(std::fabs(within1 / static_cast<double>(n) - 0.6827) < 0.01);
  std::vector<float> v(n);
  init_normal(v.data(), n, 0, 5, "emb", 3.0f, 2.0f);
  double s2 = 0.0, q2 = 0.0;
  for (float x : v) {
    s2 += x;
    q2 += static_cast<double>(x) * x;
  }
  double m2 = s2 / n;
  BOOST_TEST(std::fabs(m2 - 3.0) < 0.04);
  BOOST_TEST(std::fabs(std::sqrt(q2 / n - m2 * m2) - 2.0) < 0.03);
}

BOOST_AUTO_TEST_SUITE_END()

// ---------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(ops_suite)

BOOST_AUTO_TEST_CASE(gemm_all_transposes) {
  const int64_t M = 7, N = 5, K = 9;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      // Stored A is (M,K) or (K,M); B is (K,N) or (N,K); leading dims padded by 3.
      int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, lda = a_cols + 3;
      int64_t b_rows = tb ? N : K, b_cols = tb ? K : N, ldb = b_cols + 3;
      int64_t ldc = N + 2;
      auto A = random_vec(a_rows * lda, 1 + ta + 2 * tb);
      auto B = random_vec(b_rows * ldb, 11 + ta + 2 * tb);
      auto C = random_vec(M * ldc, 21);
      auto C0 = C;
      const float alpha = 0.75f, beta = -0.5f;
      ops::gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
      for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < ldc; ++j) {
          if (j >= N) {  // padding untouched
            BOOST_TEST_REQUIRE(C[i * ldc + j] == C0[i * ldc + j]);
            continue;
          }
          double s = 0.0;
          for (int64_t k = 0; k < K; ++k) {
            double a = ta ? A[k * lda + i] : A[i * lda + k];
            double b = tb ? B[j * ldb + k] : B[k * ldb + j];
            s += a * b;
          }
          double want = alpha * s + beta * C0[i * ldc + j];
          BOOST_TEST_REQUIRE(std::fabs(C[i * ldc + j] - want) < 1e-5,
                             "ta " << ta << " tb " << tb << " (" << i << "," << j << ")");
        }
      }
    }
  }
  // beta = 0 ignores C's old contents, even NaN.
  std::vector<float> A = {1, 2, 3, 4}, B = {5, 6, 7, 8};
  std::vector<float> C(4, std::numeric_limits<float>::quiet_NaN());
  ops::gemm(false, false, 2, 2, 2, 1.0f, A.data(), 2, B.data(), 2, 0.0f, C.data(), 2);
  BOOST_TEST(C[0] == 19.0f);
  BOOST_TEST(C[1] == 22.0f);
  BOOST_TEST(C[2] == 43.0f);
  BOOST_TEST(C[3] == 50.0f);
}

BOOST_AUTO_TEST_CASE(linear_forward_backward_naive) {
  const int64_t rows = 6, in = 5, out = 4;
  auto X = random_vec(rows * in, 1), W = random_vec(out * in, 2), b = random_vec(out, 3);
  auto dY = random_vec(rows * out, 4);
  std::vector<float> Y(rows * out);
  ops::linear_forward(Y.data(), X.data(), W.data(), b.data(), rows, in, out);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = b[o];
      for (int64_t i = 0; i < in; ++i) s += static_cast<double>(X[r * in + i]) * W[o * in + i];
      BOOST_TEST_REQUIRE(std::fabs(Y[r * out + o] - s) < 1e-5);
    }
  ops::linear_forward(Y.data(), X.data(), W.data(), nullptr, rows, in, out);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0.0;
      for (int64_t i = 0; i < in; ++i) s += static_cast<double>(X[r * in + i]) * W[o * in + i];
      BOOST_TEST_REQUIRE(std::fabs(Y[r * out + o] - s) < 1e-5);
    }
  std::vector<float> dX(rows * in, 123.0f), dW(out * in, 1.0f), db(out, 2.0f);
  ops::linear_backward(dX.data(), dW.data(), db.data(), dY.data(), X.data(), W.data(), rows, in, out);
  for (int64_t o = 0; o < out; ++o) {
    double sb = 2.0;
    for (int64_t r = 0; r < rows; ++r) sb += dY[r * out + o];
    BOOST_TEST(std::fabs(db[o] - sb) < 1e-5);  // accumulated
    for (int64_t i = 0; i < in; ++i) {
      double s = 1.0;
      for (int64_t r = 0; r < rows; ++r) s += static_cast<double>(dY[r * out + o]) * X[r * in + i];
      BOOST_TEST(std::fabs(dW[o * in + i] - s) < 1e-5);
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < in; ++i) {
      double s = 0.0;  // overwritten, not accumulated
      for (int64_t o = 0; o < out; ++o) s += static_cast<double>(dY[r * out + o]) * W[o * in + i];
      BOOST_TEST(std::fabs(dX[r * in + i] - s) < 1e-5);
    }
  // dX may be null.
  ops::linear_backward(nullptr, dW.data(), nullptr, dY.data(), X.data(), W.data(), rows, in, out);
}

BOOST_AUTO_TEST_CASE(im2col_matches_definition_and_col2im_is_adjoint) {
  const int64_t C = 3, H = 6, W = 5, KH = 3, KW = 2;
  for (int64_t pad : {0, 1, 2}) {
    int64_t OH = H + 2 * pad - KH + 1, OW = W + 2 * pad - KW + 1;
    for (int64_t extra : {0, 7}) {  // col_ld larger than OH*OW: images side by side
      int64_t ld = OH * OW + extra;
      auto x = random_vec(C * H * W, 5 + pad);
      std::vector<float> col(C * KH * KW * ld, 99.0f);
      ops::im2col(x.data(), col.data(), C, H, W, KH, KW, pad, OH, OW, ld);
      for (int64_t c = 0; c < C; ++c)
        for (int64_t kh = 0; kh < KH; ++kh)
          for (int64_t kw = 0; kw < KW; ++kw)
            for (int64_t oh = 0; oh < OH; ++oh)
              for (int64_t ow = 0; ow < OW; ++ow) {
                int64_t ih = oh + kh - pad, iw = ow + kw - pad;
                float want = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? x[(c * H + ih) * W + iw] : 0.0f;
                int64_t row = (c * KH + kh) * KW + kw;
                BOOST_TEST_REQUIRE(col[row * ld + oh * OW + ow] == want);
              }
      // Columns past OH*OW untouched.
      for (int64_t row = 0; row < C * KH * KW; ++row)
        for (int64_t j = OH * OW; j < ld; ++j) BOOST_TEST_REQUIRE(col[row * ld + j] == 99.0f);

      // Adjointness: <col2im(c), x> == <c, im2col(x)>.
      auto cvec = random_vec(C * KH * KW * ld, 50 + pad);
      for (int64_t row = 0; row < C * KH * KW; ++row)
        for (int64_t j = OH * OW; j < ld; ++j) cvec[row * ld + j] = 0.0f;
      std::vector<float> img(C * H * W, 0.0f);
      ops::col2im(cvec.data(), img.data(), C, H, W, KH, KW, pad, OH, OW, ld);
      double lhs = naive_dot(img, x);
      double rhs = naive_dot(cvec, col);
      BOOST_TEST(std::fabs(lhs - rhs) < 1e-4 * (1.0 + std::fabs(rhs)), "pad " << pad << " " << lhs << " vs " << rhs);
      // col2im accumulates into the image.
      std::vector<float> img2(C * H * W, 1.0f);
      ops::col2im(cvec.data(), img2.data(), C, H, W, KH, KW, pad, OH, OW, ld);
      for (size_t i = 0; i < img.size(); ++i) BOOST_TEST_REQUIRE(std::fabs(img2[i] - (img[i] + 1.0f)) < 1e-5);
    }
  }
}

BOOST_AUTO_TEST_CASE(maxpool_first_max_and_backward) {
  // One 4x4 plane -> 2x2.
  std::vector<float> x = {
      1, 1, 0,  5,   //
      1, 1, 5,  0,   //
      2, 3, -1, -1,  //
      3, 0, -1, -1,
  };
  std::vector<float> y(4);
  std::vector<int32_t> am(4);
  ops::maxpool2_forward(y.data(), am.data(), x.data(), 1, 4, 4);
  BOOST_TEST(y[0] == 1.0f);
  BOOST_TEST(am[0] == 0);  // all equal: the first (top-left)
  BOOST_TEST(y[1] == 5.0f);
  BOOST_TEST(am[1] == 3);  // (0,3) before (1,2)
  BOOST_TEST(y[2] == 3.0f);
  BOOST_TEST(am[2] == 9);  // (2,1) before (3,0)
  BOOST_TEST(y[3] == -1.0f);
  BOOST_TEST(am[3] == 10);
  std::vector<float> dy = {1, 2, 3, 4}, dx(16, 7.0f);
  ops::maxpool2_backward(dx.data(), dy.data(), am.data(), 1, 4, 4);
  for (int i = 0; i < 16; ++i) {
    float want = i == 0 ? 1.0f : i == 3 ? 2.0f : i == 9 ? 3.0f : i == 10 ? 4.0f : 0.0f;
    BOOST_TEST(dx[i] == want);
  }
  // Odd sizes floor; several planes; NaN propagates.
  std::vector<float> x2(2 * 5 * 3);
  for (size_t i = 0; i < x2.size(); ++i) x2[i] = static_cast<float>((i * 7) % 11);
  x2[15 + 4] = std::numeric_limits<float>::quiet_NaN();  // plane 1, (1,1)
  std::vector<float> y2(2 * 2 * 1);
  std::vector<int32_t> am2(4);
  ops::maxpool2_forward(y2.data(), am2.data(), x2.data(), 2, 5, 3);
  for (int p = 0; p < 2; ++p)
    for (int oh = 0; oh < 2; ++oh) {
      const float* xp = x2.data() + p * 15;
      int best = 2 * oh * 3;
      for (int k : {best + 1, best + 3, best + 4})
        if (xp[k] > xp[best] || std::isnan(xp[k])) best = k;
      BOOST_TEST(am2[p * 2 + oh] == best);
    }
  BOOST_TEST(std::isnan(y2[2]));
  BOOST_TEST(am2[2] == 4);
}

BOOST_AUTO_TEST_CASE(elementwise_ops) {
  std::vector<float> x = {-2.0f, -0.5f, 0.0f, 0.25f, 3.0f};
  std::vector<float> y(5), dx(5), dy = {1, 2, 3, 4, 5};
  ops::relu_forward(y.data(), x.data(), 5);
  BOOST_TEST(y == (std::vector<float>{0, 0, 0, 0.25f, 3.0f}));
  ops::relu_backward(dx.data(), dy.data(), y.data(), 5);
  BOOST_TEST(dx == (std::vector<float>{0, 0, 0, 4, 5}));
  {
    // torch.relu: NaN stays NaN, -0 stays -0, +-inf clamp as numbers; its backward passes the
    // gradient where the output is not <= 0 (NaN included). Values printed by torch 1.13.
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    std::vector<float> xs = {nan, -0.0f, -1.0f, 2.0f, inf, -inf}, ys(6), ds(6), ones(6, 1.0f);
    ops::relu_forward(ys.data(), xs.data(), 6);
    BOOST_TEST(std::isnan(ys[0]));
    BOOST_TEST((ys[1] == 0.0f && std::signbit(ys[1])));
    BOOST_TEST((ys[2] == 0.0f && !std::signbit(ys[2])));
    BOOST_TEST(ys[3] == 2.0f);
    BOOST_TEST(ys[4] == inf);
    BOOST_TEST((ys[5] == 0.0f && !std::signbit(ys[5])));
    ops::relu_backward(ds.data(), ones.data(), ys.data(), 6);
    BOOST_TEST(ds == (std::vector<float>{1, 0, 0, 1, 1, 0}));
  }
  ops::gelu_forward(y.data(), x.data(), 5);
  ops::gelu_backward(dx.data(), dy.data(), x.data(), 5);
  for (int i = 0; i < 5; ++i) {
    double xi = x[i];
    double cdf = 0.5 * (1.0 + std::erf(xi / std::sqrt(2.0)));
    double pdf = std::exp(-0.5 * xi * xi) / std::sqrt(2.0 * M_PI);
    BOOST_TEST(std::fabs(y[i] - xi * cdf) < 1e-6);
    BOOST_TEST(std::fabs(dx[i] - dy[i] * (cdf + xi * pdf)) < 1e-5);
  }
  std::vector<float> a = {1, 2, 3}, b = {10, 20, 30}, c(3);
  ops::add(c.data(), a.data(), b.data(), 3);
  BOOST_TEST(c == (std::vector<float>{11, 22, 33}));
  ops::add_inplace(c.data(), a.data(), 3);
  BOOST_TEST(c == (std::vector<float>{12, 24, 36}));
  // Large enough to take the parallel path.
  const int64_t n = 100000;
  auto big = random_vec(n, 9, -3.0f, 3.0f);
  std::vector<float> by(n);
  ops::relu_forward(by.data(), big.data(), n);
  for (int64_t i = 0; i < n; ++i) BOOST_TEST_REQUIRE(by[i] == std::max(big[i], 0.0f));
}

BOOST_AUTO_TEST_CASE(layernorm_and_log_softmax_vs_double) {
  const int64_t rows = 4, C = 7;
  auto x = random_vec(rows * C, 1, -2.0f, 3.0f);
  auto w = random_vec(C, 2, 0.5f, 1.5f), b = random_vec(C, 3);
  std::vector<float> y(rows * C), mean(rows), rstd(rows);
  ops::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, C, 1e-5f);
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0.0, v = 0.0;
    for (int64_t c = 0; c < C; ++c) m += x[r * C + c];
    m /= C;
    for (int64_t c = 0; c < C; ++c) v += (x[r * C + c] - m) * (x[r * C + c] - m);
    v /= C;  // biased
    double s = 1.0 / std::sqrt(v + 1e-5);
    BOOST_TEST(std::fabs(mean[r] - m) < 1e-5);
    BOOST_TEST(std::fabs(rstd[r] - s) < 1e-4 * s);
    for (int64_t c = 0; c < C; ++c) BOOST_TEST(std::fabs(y[r * C + c] - ((x[r * C + c] - m) * s * w[c] + b[c])) < 1e-5);
  }
  std::vector<float> ls(rows * C);
  ops::log_softmax_forward(ls.data(), x.data(), rows, C);
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -1e30, sum = 0.0;
    for (int64_t c = 0; c < C; ++c) mx = std::max(mx, static_cast<double>(x[r * C + c]));
    for (int64_t c = 0; c < C; ++c) sum += std::exp(x[r * C + c] - mx);
    for (int64_t c = 0; c < C; ++c) BOOST_TEST(std::fabs(ls[r * C + c] - (x[r * C + c] - mx - std::log(sum))) < 1e-5);
  }
  // Stable for huge logits.
  std::vector<float> hx = {1000.0f, 0.0f, -1000.0f}, hy(3);
  ops::log_softmax_forward(hy.data(), hx.data(), 1, 3);
  BOOST_TEST(hy[0] == 0.0f);
  BOOST_TEST(hy[1] == -1000.0f);
  BOOST_TEST(std::isfinite(hy[2]));
}

// layernorm_backward with a residual: dx = residual + d(layernorm), the bits of the backward
// without it followed by add(); dw and db the same bits on one thread (one pass) and on two (dx
// rows in parallel), at a size below and above kParallelMin.
BOOST_AUTO_TEST_CASE(layernorm_backward_residual_and_threads_bitwise) {
  const int saved_threads = omp_get_max_threads();
  for (int64_t rows : {int64_t{5}, 2 * ops::kParallelMin / 96 + 3}) {
    const int64_t C = 96;
    auto x = random_vec(rows * C, 21, -2.0f, 3.0f), dy = random_vec(rows * C, 22), res = random_vec(rows * C, 23);
    auto w = random_vec(C, 24, 0.5f, 1.5f), b = random_vec(C, 25);
    std::vector<float> y(rows * C), mean(rows), rstd(rows);
    ops::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, C, 1e-5f);
    std::vector<float> dx_ref(rows * C), sum_ref(rows * C), dw_ref(C, 0.25f), db_ref(C, -0.5f);
    omp_set_num_threads(1);
    ops::layernorm_backward(dx_ref.data(), nullptr, dw_ref.data(), db_ref.data(), dy.data(), x.data(), w.data(),
                            mean.data(), rstd.data(), rows, C);
    ops::add(sum_ref.data(), res.data(), dx_ref.data(), rows * C);
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      std::vector<float> dx(rows * C), dx_sum(rows * C), dw(C, 0.25f), db(C, -0.5f), dw2(C, 0.25f), db2(C, -0.5f);
      ops::layernorm_backward(dx.data(), nullptr, dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(),
                              rstd.data(), rows, C);
      ops::layernorm_backward(dx_sum.data(), res.data(), dw2.data(), db2.data(), dy.data(), x.data(), w.data(),
                              mean.data(), rstd.data(), rows, C);
      BOOST_TEST_INFO("rows " << rows << ", threads " << threads);
      BOOST_TEST(std::memcmp(dx.data(), dx_ref.data(), dx.size() * sizeof(float)) == 0);
      BOOST_TEST(std::memcmp(dx_sum.data(), sum_ref.data(), dx.size() * sizeof(float)) == 0);
      for (const auto* v : {&dw, &dw2}) BOOST_TEST(std::memcmp(v->data(), dw_ref.data(), C * sizeof(float)) == 0);
      for (const auto* v : {&db, &db2}) BOOST_TEST(std::memcmp(v->data(), db_ref.data(), C * sizeof(float)) == 0);
    }
  }
  omp_set_num_threads(saved_threads);
}

// row_max: every length around its 16 lanes, the maximum at every position, negative rows,
// NaNs passed over (as std::max(mx, x) passes them), n = 0 gives -inf.
BOOST_AUTO_TEST_CASE(row_max_lanes_tails_and_nans) {
  const float inf = std::numeric_limits<float>::infinity();
  BOOST_TEST(ops::row_max(nullptr, 0) == -inf);
  for (int64_t n : {1, 2, 15, 16, 17, 31, 32, 33, 100}) {
    for (int64_t at = 0; at < n; ++at) {
      std::vector<float> x(n);
      for (int64_t j = 0; j < n; ++j) x[j] = -1000.0f - static_cast<float>((j * 7) % 13);
      x[at] = -3.5f;
      BOOST_TEST_CONTEXT("n " << n << " max at " << at) {
        BOOST_TEST(ops::row_max(x.data(), n) == -3.5f);
        x[(at + 1) % n] = std::numeric_limits<float>::quiet_NaN();
        if (n > 1) BOOST_TEST(ops::row_max(x.data(), n) == -3.5f);
      }
    }
  }
  const std::vector<float> all_neg_inf(20, -inf);
  BOOST_TEST(ops::row_max(all_neg_inf.data(), 20) == -inf);
}

BOOST_AUTO_TEST_SUITE_END()

// A block of rows (nn/attention.cpp's recompute mode) computes what the whole planes compute on
// those rows, bit for bit (each row is computed alone); the recompute from the same scores and
// the saved statistics gives the forward's P bit for bit; the block's backward equals the whole
// planes' backward on those rows.
BOOST_AUTO_TEST_CASE(causal_softmax_row_blocks_equal_whole_planes) {
  const int64_t planes = 2, T = 45;
  auto S = random_vec(planes * T * T, 77, -4.0f, 4.0f);
  auto dP = random_vec(planes * T * T, 78);
  std::vector<float> P = S, dS = dP;
  Kernels& k = cpu_kernels();
  k.causal_softmax_forward(P.data(), CausalRows::whole(planes, T), nullptr, nullptr);
  k.causal_softmax_backward(dS.data(), P.data(), CausalRows::whole(planes, T), 0.25f);
  for (const auto& block : {std::pair<int64_t, int64_t>{0, 16}, {16, 16}, {32, 13}, {0, 45}}) {
    const int64_t row0 = block.first, rows = block.second;  // not a structured binding: clang 14's lambdas
    BOOST_TEST_CONTEXT("rows " << row0 << ".." << row0 + rows) {
      const auto n = static_cast<size_t>(planes * rows * T);
      std::vector<float> blk(n), dblk(n), mx(planes * T, 0.0f), inv(planes * T, 0.0f);
      auto block_of = [&](const std::vector<float>& whole, std::vector<float>& out) {
        for (int64_t p = 0; p < planes; ++p)
          std::copy_n(whole.begin() + (p * T + row0) * T, rows * T, out.begin() + p * rows * T);
      };
      block_of(S, blk);
      const CausalRows g{planes, rows, row0, T};
      k.causal_softmax_forward(blk.data(), g, mx.data(), inv.data());
      std::vector<float> want(n), again(n);
      block_of(P, want);
      BOOST_TEST(std::memcmp(blk.data(), want.data(), n * sizeof(float)) == 0);
      block_of(S, again);
      k.causal_softmax_recompute(again.data(), g, mx.data(), inv.data());
      BOOST_TEST(std::memcmp(again.data(), want.data(), n * sizeof(float)) == 0);
      block_of(dP, dblk);
      k.causal_softmax_backward(dblk.data(), blk.data(), g, 0.25f);
      block_of(dS, want);
      BOOST_TEST(std::memcmp(dblk.data(), want.data(), n * sizeof(float)) == 0);
      for (int64_t p = 0; p < planes; ++p)
        for (int64_t i = 0; i < T; ++i)
          BOOST_TEST((inv[p * T + i] != 0.0f) == (i >= row0 && i < row0 + rows));  // only the block's rows
    }
  }
}

// The host's causal softmax against its definition in double (row i keeps j <= i, zeros above),
// over T around the lane width; planes share nothing. Bound, relative to each probability (eps =
// 2^-23): rounding s - max costs eps/2 |s - max| in the exponent, exp_f32 about 1 ulp, the sum of
// i + 1 positive terms (i + 1) eps/2, the scaling one rounding.
BOOST_AUTO_TEST_CASE(causal_softmax_forward_vs_double) {
  for (int64_t T : {1, 5, 16, 17, 40}) {
    const int64_t planes = 3;
    auto P = random_vec(planes * T * T, 40 + static_cast<uint32_t>(T), -4.0f, 4.0f);
    const auto S = P;
    cpu_kernels().causal_softmax_forward(P.data(), CausalRows::whole(planes, T), nullptr, nullptr);
    for (int64_t r = 0; r < planes * T; ++r) {
      const int64_t i = r % T;
      double mx = -1e300, sum = 0.0;
      for (int64_t j = 0; j <= i; ++j) mx = std::max(mx, static_cast<double>(S[r * T + j]));
      for (int64_t j = 0; j <= i; ++j) sum += std::exp(S[r * T + j] - mx);
      for (int64_t j = 0; j < T; ++j) {
        const double want = j <= i ? std::exp(S[r * T + j] - mx) / sum : 0.0;
        const double eps = std::ldexp(1.0, -23);
        const double tol = want * eps * (std::fabs(S[r * T + j] - mx) + static_cast<double>(i) + 4.0);
        BOOST_TEST_CONTEXT("T " << T << " row " << r << " col " << j) {
          BOOST_TEST(std::fabs(P[r * T + j] - want) <= tol);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(gemm_bf16_equals_sgemm_on_widened_operands) {
  // Every bf16 value is an f32 value, so the bf16 GEMM must equal sgemm on the widened inputs.
  const int64_t M = 5, N = 7, K = 9;
  std::vector<uint16_t> a(M * K), b(K * N);
  fsdp::CounterRng rng(3, 4);
  for (size_t i = 0; i < a.size(); ++i) a[i] = fsdp::f32_to_bf16(rng.normal(i));
  for (size_t i = 0; i < b.size(); ++i) b[i] = fsdp::f32_to_bf16(rng.normal(1000 + i));
  std::vector<float> a32(a.size()), b32(b.size());
  fsdp::convert(a.data(), fsdp::DType::bf16, a32.data(), fsdp::DType::f32, a.size());
  fsdp::convert(b.data(), fsdp::DType::bf16, b32.data(), fsdp::DType::f32, b.size());
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      int64_t lda = ta ? M : K, ldb = tb ? K : N;
      std::vector<float> want(M * N, 0.0f), got(M * N, 0.0f);
      fsdp::ops::gemm(ta, tb, M, N, K, 1.0f, a32.data(), lda, b32.data(), ldb, 0.0f, want.data(), N);
      fsdp::ops::gemm_bf16(ta, tb, M, N, K, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, got.data(), N);
      for (int64_t i = 0; i < M * N; ++i) BOOST_TEST(got[i] == want[i]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The kernels a Hugging Face T5 needs (kernels.h), on the host: exact small cases, double
// references and finite differences of the f32 kernels.
namespace {

// Central differences of `loss` w.r.t. values[k] for each k in idx against analytic[k]:
// |fd - an| <= atol + rtol * max(|fd|, |an|) (test_nn.cpp's check, without its retries).
void fd_check(const std::function<double()>& loss, float* values, const std::vector<float>& analytic,
              const std::vector<int64_t>& idx, const char* what, double eps = 1e-2, double atol = 2e-4,
              double rtol = 2e-3) {
  int failures = 0;
  for (int64_t k : idx) {
    const float v = values[k];
    const float vp = v + static_cast<float>(eps), vm = v - static_cast<float>(eps);
    values[k] = vp;
    const double lp = loss();
    values[k] = vm;
    const double lm = loss();
    values[k] = v;
    const double fd = (lp - lm) / (static_cast<double>(vp) - vm), an = analytic[static_cast<size_t>(k)];
    if (std::fabs(fd - an) > atol + rtol * std::max(std::fabs(fd), std::fabs(an)) && failures++ < 10)
      BOOST_ERROR(what << " [" << k << "]: analytic " << an << " vs fd " << fd);
  }
  BOOST_TEST(failures == 0, what << ": " << failures << " of " << idx.size() << " elements off");
}

std::vector<int64_t> indices(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) { return naive_dot(a, b); }

}  // namespace

BOOST_AUTO_TEST_SUITE(t5_kernels)

BOOST_AUTO_TEST_CASE(rmsnorm_exact_values) {
  Kernels& k = cpu_kernels();
  // Row 0: mean x^2 = 1 -> rstd 1; row 1: mean 4 -> rstd 0.5, y = w; row 2: zeros with
  // eps = 0.25 -> rstd 2, y = 0. Every value exact.
  const int64_t rows = 3, C = 4;
  std::vector<float> x = {1, -1, 1, -1, 2, 2, 2, -2, 0, 0, 0, 0}, w = {2.0f, 0.5f, -1.0f, 3.0f};
  std::vector<float> y(rows * C), rstd(rows);
  k.rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), 2, C, 0.0f);
  k.rmsnorm_forward(y.data() + 2 * C, rstd.data() + 2, x.data() + 2 * C, w.data(), 1, C, 0.25f);
  BOOST_TEST(rstd == (std::vector<float>{1.0f, 0.5f, 2.0f}));
  BOOST_TEST(y == (std::vector<float>{2.0f, -0.5f, -1.0f, -3.0f, 2.0f, 0.5f, -1.0f, -3.0f, 0, 0, 0, 0}));
  // Backward of row 0 with dy = 1 (rstd 1): g = w, sum g x = 2 - 0.5 - 1 - 3 = -2.5,
  // k = -2.5 / 4 = -0.625, dx = g - x k = {2.625, -0.125, -0.375, 2.375}; dw += x * rstd * dy = x.
  std::vector<float> dy(C, 1.0f), dx(C, 9.0f), dw = {0.5f, 0.5f, 0.5f, 0.5f};
  k.rmsnorm_backward(dx.data(), nullptr, dw.data(), dy.data(), x.data(), w.data(), rstd.data(), 1, C);
  BOOST_TEST(dx == (std::vector<float>{2.625f, -0.125f, -0.375f, 2.375f}));
  BOOST_TEST(dw == (std::vector<float>{1.5f, -0.5f, 1.5f, -0.5f}));
}

BOOST_AUTO_TEST_CASE(rmsnorm_vs_double_and_gradients) {
  Kernels& k = cpu_kernels();
  const int64_t rows = 5, C = 13;
  const float eps = 1e-6f;
  auto x = random_vec(rows * C, 21, -2.0f, 2.0f), w = random_vec(C, 22, 0.5f, 1.5f);
  auto R = random_vec(rows * C, 23);  // loss = sum(y * R)
  std::vector<float> y(rows * C), rstd(rows);
  k.rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, C, eps);
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0.0;
    for (int64_t c = 0; c < C; ++c) ms += static_cast<double>(x[r * C + c]) * x[r * C + c];
    const double s = 1.0 / std::sqrt(ms / C + eps);
    BOOST_TEST(std::fabs(rstd[r] - s) <= 1e-6 * s);
    for (int64_t c = 0; c < C; ++c) {
      const double want = w[c] * x[r * C + c] * s;
      BOOST_TEST(std::fabs(y[r * C + c] - want) <= 2e-6 * (1.0 + std::fabs(want)));
    }
  }
  std::vector<float> dx(rows * C), dw(C, 0.25f), dw_no_dx(C, 0.25f);
  k.rmsnorm_backward(dx.data(), nullptr, dw.data(), R.data(), x.data(), w.data(), rstd.data(), rows, C);
  k.rmsnorm_backward(nullptr, nullptr, dw_no_dx.data(), R.data(), x.data(), w.data(), rstd.data(), rows, C);
  BOOST_TEST(dw == dw_no_dx);  // dx null: skipped, dw the same
  {
    // With a residual: residual + dx, the bits add() gives, and dw the same.
    const auto res = random_vec(rows * C, 24);
    std::vector<float> sum(rows * C), want(rows * C), dw_res(C, 0.25f);
    k.rmsnorm_backward(sum.data(), res.data(), dw_res.data(), R.data(), x.data(), w.data(), rstd.data(), rows, C);
    k.add(want.data(), res.data(), dx.data(), rows * C);
    BOOST_TEST(std::memcmp(sum.data(), want.data(), sum.size() * sizeof(float)) == 0);
    BOOST_TEST(dw_res == dw_no_dx);
  }
  for (auto& v : dw) v -= 0.25f;  // dw accumulates: remove the starting value
  auto loss = [&] {
    std::vector<float> yy(rows * C), ss(rows);
    k.rmsnorm_forward(yy.data(), ss.data(), x.data(), w.data(), rows, C, eps);
    return dot(yy, R);
  };
  fd_check(loss, x.data(), dx, indices(rows * C), "rmsnorm dx");
  fd_check(loss, w.data(), dw, indices(C), "rmsnorm dw", 1e-2, 2e-4, 1e-3);
}

BOOST_AUTO_TEST_CASE(gelu_tanh_values_and_gradient) {
  Kernels& k = cpu_kernels();
  // HF NewGELUActivation on these f32 inputs, and autograd's dy/dx, printed by torch 1.13 (CPU).
  std::vector<float> x = {-6.0f, -3.0f, -1.5f, -0.5f, -0.125f, 0.0f, 0.125f, 0.5f, 1.0f, 1.5f, 3.0f, 6.0f};
  const std::vector<float> torch_y = {
      -0.0f,         -0.00363743305f, -0.100428432f, -0.154285997f, -0.0562827997f, 0.0f,
      0.0687171966f, 0.345714003f,    0.841192007f,  1.39957154f,   2.99636269f,    6.0f};
  const std::vector<float> torch_dydx = {0.0f,         -0.0115842968f, -0.127710804f, 0.132630095f, 0.400784582f, 0.5f,
                                         0.599215388f, 0.86736989f,    1.08296406f,   1.12771082f,  1.01158428f,  1.0f};
  const auto n = static_cast<int64_t>(x.size());
  std::vector<float> y(n), dx(n), ones(n, 1.0f);
  k.gelu_tanh_forward(y.data(), x.data(), n);
  k.gelu_tanh_backward(dx.data(), ones.data(), x.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    // torch's tanh is Sleef's (1 ulp) where ours is glibc's: allow 2 ulp of y, plus the tanh
    // error carried through 0.5 x (1 + t) where 1 + t cancels (x << 0).
    const float ulp = std::numeric_limits<float>::epsilon();
    BOOST_TEST(std::fabs(y[i] - torch_y[i]) <= 2 * ulp * (std::fabs(torch_y[i]) + 0.5f * std::fabs(x[i])),
               "x " << x[i] << " y " << y[i] << " torch " << torch_y[i]);
    BOOST_TEST(std::fabs(dx[i] - torch_dydx[i]) <= 8 * ulp * (1.0f + std::fabs(x[i])),
               "x " << x[i] << " dx " << dx[i] << " torch " << torch_dydx[i]);
  }
  BOOST_TEST(y[5] == 0.0f);
  BOOST_TEST(dx[5] == 0.5f);                         // t = 0: exactly 0.5 (1 + 0)
  BOOST_TEST(y[11] == 6.0f);                         // tanh rounds to 1
  BOOST_TEST((y[0] == 0.0f && std::signbit(y[0])));  // -3 * (1 - 1) = -0, as torch
  // Against the formula in double, and finite differences of the f32 forward.
  auto xs = random_vec(200, 24, -4.0f, 4.0f), R = random_vec(200, 25);
  std::vector<float> ys(200), dxs(200);
  k.gelu_tanh_forward(ys.data(), xs.data(), 200);
  k.gelu_tanh_backward(dxs.data(), R.data(), xs.data(), 200);
  for (size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i], t = std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v));
    BOOST_TEST(std::fabs(ys[i] - 0.5 * v * (1.0 + t)) <= 1e-6 * (1.0 + std::fabs(v)));
  }
  auto loss = [&] {
    std::vector<float> yy(200);
    k.gelu_tanh_forward(yy.data(), xs.data(), 200);
    return dot(yy, R);
  };
  fd_check(loss, xs.data(), dxs, indices(200), "gelu_tanh dx");
}

BOOST_AUTO_TEST_CASE(silu_values_and_gradient) {
  Kernels& k = cpu_kernels();
  // torch.nn.functional.silu on these f32 inputs and autograd's dy/dx, printed by torch 1.13 (CPU).
  std::vector<float> x = {-20.0f, -6.0f, -3.0f, -1.5f, -0.5f, -0.125f, 0.0f,
                          0.125f, 0.5f,  1.0f,  1.5f,  3.0f,  6.0f,    20.0f};
  const std::vector<float> torch_y = {-4.1223074731533416e-08f,
                                      -0.014835738576948643f,
                                      -0.14227761328220367f,
                                      -0.2736382782459259f,
                                      -0.1887703388929367f,
                                      -0.058598827570676804f,
                                      0.0f,
                                      0.0664011761546135f,
                                      0.3112296760082245f,
                                      0.7310585975646973f,
                                      1.226361632347107f,
                                      2.857722520828247f,
                                      5.985164642333984f,
                                      20.0f};
  const std::vector<float> torch_dydx = {-3.916192170549948e-08f,
                                         -0.012326431460678577f,
                                         -0.08810410648584366f,
                                         -0.0412941612303257f,
                                         0.260038822889328f,
                                         0.43766236305236816f,
                                         0.5f,
                                         0.5623376965522766f,
                                         0.7399612069129944f,
                                         0.9276705384254456f,
                                         1.0412942171096802f,
                                         1.0881041288375854f,
                                         1.0123262405395508f,
                                         1.0f};
  const auto n = static_cast<int64_t>(x.size());
  std::vector<float> y(n), dx(n), ones(n, 1.0f);
  k.silu_forward(y.data(), x.data(), n);
  k.silu_backward(dx.data(), ones.data(), x.data(), n);
  const float ulp = std::numeric_limits<float>::epsilon();
  for (int64_t i = 0; i < n; ++i) {
    // torch's exp is Sleef's (1 ulp) where ours is kernel_math's exp_f32: a few ulp apart.
    BOOST_TEST(std::fabs(y[i] - torch_y[i]) <= 4 * ulp * std::fabs(torch_y[i]),
               "x " << x[i] << " y " << y[i] << " torch " << torch_y[i]);
    BOOST_TEST(std::fabs(dx[i] - torch_dydx[i]) <= 8 * ulp * (std::fabs(torch_dydx[i]) + 1e-6f),
               "x " << x[i] << " dx " << dx[i] << " torch " << torch_dydx[i]);
  }
  BOOST_TEST(y[6] == 0.0f);
  BOOST_TEST(dx[6] == 0.5f);  // s = 1/2 exactly: 1/2 * (1 + 0)
  // Against the formula in double, and finite differences of the f32 forward.
  auto xs = random_vec(200, 26, -8.0f, 8.0f), R = random_vec(200, 27);
  std::vector<float> ys(200), dxs(200);
  k.silu_forward(ys.data(), xs.data(), 200);
  k.silu_backward(dxs.data(), R.data(), xs.data(), 200);
  for (size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i];
    BOOST_TEST(std::fabs(ys[i] - v / (1.0 + std::exp(-v))) <= 1e-6 * (1.0 + std::fabs(v)));
  }
  auto loss = [&] {
    std::vector<float> yy(200);
    k.silu_forward(yy.data(), xs.data(), 200);
    return dot(yy, R);
  };
  fd_check(loss, xs.data(), dxs, indices(200), "silu dx");
}

// Rows of 3 heads of D = 8 at a row stride past the heads (a q or k slice of a wider buffer),
// positions from pos0: each pair (i, i + 4) rotated by the table's angle of (pos, i); the
// backward is the transpose (<rope(x), y> == <x, rope_backward(y)>) and undoes the forward.
BOOST_AUTO_TEST_CASE(rope_rotates_pairs_and_its_backward_is_the_transpose) {
  Kernels& k = cpu_kernels();
  constexpr int64_t rows = 6, T = 3, heads = 3, D = 8, ld = heads * D + 5, pos0 = 2, positions = pos0 + T;
  std::vector<float> cos(positions * D / 2), sin(positions * D / 2);
  fsdp::llama_rope_tables(cos.data(), sin.data(), positions, D, 10000.0, 2.0);
  for (int64_t p = 0; p < positions; ++p)  // HF: t = p / factor, inv_freq_i = 1 / 10000^(2i / D)
    for (int64_t i = 0; i < D / 2; ++i) {
      const double angle = (p / 2.0) / std::pow(10000.0, 2.0 * i / D);
      BOOST_TEST(std::fabs(cos[p * D / 2 + i] - std::cos(angle)) <= 1e-6);
      BOOST_TEST(std::fabs(sin[p * D / 2 + i] - std::sin(angle)) <= 1e-6);
    }
  const std::vector<float> x = random_vec(rows * ld, 28), g = random_vec(rows * ld, 29);
  std::vector<float> y = x, gx = g;
  k.rope(y.data(), cos.data(), sin.data(), rows, T, heads, D, ld, pos0, false);
  k.rope(gx.data(), cos.data(), sin.data(), rows, T, heads, D, ld, pos0, true);
  double max_error = 0.0, yg = 0.0, xgx = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t p = pos0 + r % T;
    for (int64_t c = heads * D; c < ld; ++c) BOOST_TEST(y[r * ld + c] == x[r * ld + c]);  // past the heads
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < D / 2; ++i) {
        const int64_t a = r * ld + h * D + i, b = a + D / 2;
        const double c = cos[p * D / 2 + i], s = sin[p * D / 2 + i];
        max_error =
            std::max({max_error, std::fabs(y[a] - (x[a] * c - x[b] * s)), std::fabs(y[b] - (x[b] * c + x[a] * s))});
        yg += double(y[a]) * g[a] + double(y[b]) * g[b];
        xgx += double(x[a]) * gx[a] + double(x[b]) * gx[b];
      }
  }
  BOOST_TEST(max_error <= 1e-6);
  BOOST_TEST(std::fabs(yg - xgx) <= 1e-5 * (1.0 + std::fabs(yg)));
  std::vector<float> back = y;
  k.rope(back.data(), cos.data(), sin.data(), rows, T, heads, D, ld, pos0, true);
  for (size_t i = 0; i < x.size(); ++i) BOOST_TEST(std::fabs(back[i] - x[i]) <= 1e-6f);
}

namespace {
// Softmax rows as the kernel defines them (kernels.h), in double.
std::vector<double> attention_reference(const std::vector<float>& S, const std::vector<float>* bias,
                                        const std::vector<int32_t>* key_valid, bool causal, int64_t B, int64_t H,
                                        int64_t Tq, int64_t Tk) {
  std::vector<double> P(S.size());
  for (int64_t r = 0; r < B * H * Tq; ++r) {
    const int64_t i = r % Tq, h = (r / Tq) % H, b = r / (H * Tq);
    auto valid = [&](int64_t j) { return !(causal && j > i) && (!key_valid || (*key_valid)[b * Tk + j] != 0); };
    double mx = -1e300, z = 0.0;
    bool any = false;
    std::vector<double> s(Tk);
    for (int64_t j = 0; j < Tk; ++j) {
      s[j] = S[r * Tk + j] + (bias ? (*bias)[(h * Tq + i) * Tk + j] : 0.0);
      if (valid(j)) mx = std::max(mx, s[j]), any = true;
    }
    for (int64_t j = 0; j < Tk; ++j) z += valid(j) ? std::exp(s[j] - mx) : 0.0;
    for (int64_t j = 0; j < Tk; ++j) P[r * Tk + j] = !any ? 1.0 / Tk : valid(j) ? std::exp(s[j] - mx) / z : 0.0;
  }
  return P;
}
}  // namespace

BOOST_AUTO_TEST_CASE(attention_softmax_exact_values) {
  Kernels& k = cpu_kernels();
  // B = 2, H = 1, Tq = 4, Tk = 4, equal scores: each row is uniform over its unmasked keys.
  // Sample 0 masks key 3; sample 1 masks every key (uniform 1/4 over all four, even causal).
  const int64_t B = 2, H = 1, Tq = 4, Tk = 4;
  std::vector<int32_t> kv = {1, 1, 1, 0, 0, 0, 0, 0};
  const float t = 1.0f / 3.0f;
  for (bool causal : {false, true}) {
    std::vector<float> P(B * H * Tq * Tk, 0.75f);
    k.attention_softmax_forward(P.data(), nullptr, kv.data(), causal, B, H, Tq, Tk);
    std::vector<float> want = causal ? std::vector<float>{1, 0, 0, 0, 0.5f, 0.5f, 0, 0, t, t, t, 0, t, t, t, 0}
                                     : std::vector<float>{t, t, t, 0, t, t, t, 0, t, t, t, 0, t, t, t, 0};
    want.insert(want.end(), 16, 0.25f);
    BOOST_TEST(P == want, "causal " << causal);
  }
  // The bias is added before the softmax: scores {1, 2} + bias {1, 0} are equal -> 1/2 each; no
  // key mask, not causal. Without the bias: the same scores give e / (1 + e) on key 1.
  std::vector<float> P = {1.0f, 2.0f}, bias = {1.0f, 0.0f};
  k.attention_softmax_forward(P.data(), bias.data(), nullptr, false, 1, 1, 1, 2);
  BOOST_TEST(P == (std::vector<float>{0.5f, 0.5f}));
  P = {1.0f, 2.0f};
  k.attention_softmax_forward(P.data(), nullptr, nullptr, false, 1, 1, 1, 2);
  BOOST_TEST(std::fabs(P[1] - std::exp(1.0) / (1.0 + std::exp(1.0))) < 1e-7);
}

BOOST_AUTO_TEST_CASE(attention_softmax_masks_and_gradients) {
  Kernels& k = cpu_kernels();
  const int64_t B = 3, H = 2, Tq = 5, Tk = 7, n = B * H * Tq * Tk;
  // Sample 0: keys 2 and 6 masked; sample 1: all valid; sample 2: only key 0 valid, so in the
  // causal case every row of it keeps key 0 and none is fully masked; sample 2 with key 0
  // masked as well (kv_all_masked) makes every one of its rows fully masked.
  std::vector<int32_t> kv = {1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0};
  std::vector<int32_t> kv_none = kv;
  std::fill(kv_none.begin() + 2 * Tk, kv_none.end(), 0);
  const auto S0 = random_vec(n, 31, -3.0f, 3.0f);
  auto bias = random_vec(H * Tq * Tk, 32, -2.0f, 2.0f);
  const auto R = random_vec(n, 33);
  for (bool causal : {false, true}) {
    for (const std::vector<int32_t>* mask : {&kv, &kv_none}) {
      for (bool with_bias : {true, false}) {
        BOOST_TEST_CONTEXT("causal " << causal << " fully masked sample " << (mask == &kv_none) << " bias "
                                     << with_bias) {
          const float* bp = with_bias ? bias.data() : nullptr;
          std::vector<float> P = S0;
          k.attention_softmax_forward(P.data(), bp, mask->data(), causal, B, H, Tq, Tk);
          const auto want = attention_reference(S0, with_bias ? &bias : nullptr, mask, causal, B, H, Tq, Tk);
          std::vector<bool> full(static_cast<size_t>(B * H * Tq), false);  // rows with every key masked
          for (int64_t r = 0; r < B * H * Tq; ++r) {
            const int64_t i = r % Tq, b = r / (H * Tq);
            double sum = 0.0;
            bool any = false;
            for (int64_t j = 0; j < Tk; ++j) {
              const bool masked = (causal && j > i) || (*mask)[b * Tk + j] == 0;
              any = any || !masked;
              const float p = P[r * Tk + j];
              sum += p;
              BOOST_TEST(std::fabs(p - want[r * Tk + j]) <= 1e-6 * want[r * Tk + j] + 1e-7);
            }
            full[r] = !any;
            if (full[r]) {
              for (int64_t j = 0; j < Tk; ++j) BOOST_TEST(P[r * Tk + j] == 1.0f / Tk);
            } else {
              for (int64_t j = 0; j < Tk; ++j)
                if ((causal && j > i) || (*mask)[b * Tk + j] == 0) BOOST_TEST(P[r * Tk + j] == 0.0f);
            }
            BOOST_TEST(std::fabs(sum - 1.0) <= 1e-6);
          }
          // Backward: dS = dL/dscores for loss = sum(P * R), checked by finite differences on the
          // scores (masked ones: exactly 0, as the forward ignores them) and, summed over the
          // batch, on the bias. Fully masked rows are left out of the differences: the forward is
          // constant there, while dS is what torch's autograd gives through HF's additive mask,
          // P (dP - sum P dP) with the uniform P, checked directly.
          std::vector<float> dS = R;
          k.softmax_backward(dS.data(), P.data(), B * H * Tq, Tk);
          std::vector<int64_t> idx;
          for (int64_t r = 0; r < B * H * Tq; ++r) {
            if (!full[r]) {
              for (int64_t j = 0; j < Tk; ++j) idx.push_back(r * Tk + j);
              continue;
            }
            double d = 0.0;
            for (int64_t j = 0; j < Tk; ++j) d += static_cast<double>(P[r * Tk + j]) * R[r * Tk + j];
            for (int64_t j = 0; j < Tk; ++j) BOOST_TEST(std::fabs(dS[r * Tk + j] - (R[r * Tk + j] - d) / Tk) <= 1e-6);
          }
          for (int64_t r = 0; r < B * H * Tq; ++r)
            for (int64_t j = 0; j < Tk; ++j)
              if (!full[r] && ((causal && j > r % Tq) || (*mask)[(r / (H * Tq)) * Tk + j] == 0))
                BOOST_TEST(dS[r * Tk + j] == 0.0f);
          std::vector<float> S = S0;
          auto loss = [&] {
            std::vector<float> PP = S;
            k.attention_softmax_forward(PP.data(), bp, mask->data(), causal, B, H, Tq, Tk);
            double l = 0.0;
            for (int64_t r = 0; r < B * H * Tq; ++r)
              if (!full[r])
                for (int64_t j = 0; j < Tk; ++j) l += static_cast<double>(PP[r * Tk + j]) * R[r * Tk + j];
            return l;
          };
          fd_check(loss, S.data(), dS, idx, "attention softmax d scores", 1e-2, 2e-4, 3e-3);
          if (with_bias) {
            std::vector<float> dbias(H * Tq * Tk, 0.0f);
            for (int64_t b = 0; b < B; ++b)
              for (int64_t m = 0; m < H * Tq * Tk; ++m) {
                const int64_t r = (b * H * Tq * Tk + m) / Tk;
                if (!full[r]) dbias[m] += dS[b * H * Tq * Tk + m];
              }
            fd_check(loss, bias.data(), dbias, indices(H * Tq * Tk), "attention softmax d bias", 1e-2, 2e-4, 3e-3);
          }
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(softmax_backward_exact_values) {
  // P = {0.5, 0.25, 0.25, 0}, dP = {1, 2, -4, 8}: sum P dP = 0.5 + 0.5 - 1 = 0, dS = P dP.
  std::vector<float> P = {0.5f, 0.25f, 0.25f, 0.0f}, dP = {1, 2, -4, 8};
  cpu_kernels().softmax_backward(dP.data(), P.data(), 1, 4);
  BOOST_TEST(dP == (std::vector<float>{0.5f, 0.5f, -1.0f, 0.0f}));
}

BOOST_AUTO_TEST_CASE(relative_bias_gather_and_adjoint) {
  Kernels& k = cpu_kernels();
  const int64_t B = 2, H = 3, Tq = 6, Tk = 9, nb = 8;
  std::vector<int32_t> bucket(Tq * Tk);
  t5_relative_buckets(bucket.data(), Tq, Tk, true, nb, 20);
  auto table = random_vec(nb * H, 41);
  std::vector<float> bias(H * Tq * Tk, 7.0f);
  k.relative_bias_forward(bias.data(), table.data(), bucket.data(), H, Tq, Tk);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t ij = 0; ij < Tq * Tk; ++ij) BOOST_TEST(bias[h * Tq * Tk + ij] == table[bucket[ij] * H + h]);
  // Backward is the adjoint of forward broadcast over the batch: <dS, bias> = <dtable, table>.
  // Integer values: every sum is exact, so the two sides must be equal, not just close.
  std::vector<float> dS(B * H * Tq * Tk), tab(nb * H);
  std::mt19937 gen(42);
  std::uniform_int_distribution<int> d(-20, 20);
  for (auto& v : dS) v = static_cast<float>(d(gen));
  for (auto& v : tab) v = static_cast<float>(d(gen));
  k.relative_bias_forward(bias.data(), tab.data(), bucket.data(), H, Tq, Tk);
  double lhs = 0.0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t m = 0; m < H * Tq * Tk; ++m) lhs += static_cast<double>(dS[b * H * Tq * Tk + m]) * bias[m];
  std::vector<float> dtable(nb * H, 0.0f);
  k.relative_bias_backward(dtable.data(), dS.data(), bucket.data(), B, H, Tq, Tk);
  BOOST_TEST(lhs == dot(dtable, tab));
  // Accumulates: a second call adds the same again; buckets never used keep their value.
  std::vector<float> twice = dtable;
  k.relative_bias_backward(twice.data(), dS.data(), bucket.data(), B, H, Tq, Tk);
  for (size_t i = 0; i < twice.size(); ++i) BOOST_TEST(twice[i] == 2.0f * dtable[i]);
  // Large enough for the parallel path: against a direct double sum.
  const int64_t B2 = 2, H2 = 4, T2 = 70;
  std::vector<int32_t> bk2(T2 * T2);
  t5_relative_buckets(bk2.data(), T2, T2, false, 32, 128);
  auto dS2 = random_vec(B2 * H2 * T2 * T2, 43);
  std::vector<float> dt2(32 * H2, 0.0f);
  std::vector<double> want(32 * H2, 0.0), mag(32 * H2, 0.0), terms(32 * H2, 0.0);
  k.relative_bias_backward(dt2.data(), dS2.data(), bk2.data(), B2, H2, T2, T2);
  for (int64_t b = 0; b < B2; ++b)
    for (int64_t h = 0; h < H2; ++h)
      for (int64_t ij = 0; ij < T2 * T2; ++ij) {
        const float v = dS2[(b * H2 + h) * T2 * T2 + ij];
        want[bk2[ij] * H2 + h] += v;
        mag[bk2[ij] * H2 + h] += std::fabs(v);
        terms[bk2[ij] * H2 + h] += 1.0;
      }
  // Any f32 summation order of m terms is within (m - 1) u sum |terms| of exact.
  for (size_t i = 0; i < want.size(); ++i)
    BOOST_TEST(std::fabs(dt2[i] - want[i]) <= terms[i] * std::numeric_limits<float>::epsilon() * mag[i]);
}

namespace {
// Runs of (value, count) along a row, as printed from torch.
std::vector<int32_t> expand_runs(const std::vector<std::pair<int32_t, int>>& runs) {
  std::vector<int32_t> v;
  for (auto [value, count] : runs) v.insert(v.end(), static_cast<size_t>(count), value);
  return v;
}
std::vector<int32_t> row_of(const std::vector<int32_t>& t, int64_t Tk, int64_t i) {
  return std::vector<int32_t>(t.begin() + i * Tk, t.begin() + (i + 1) * Tk);
}
// sum of bucket * (index % 9973 + 1) over the flat (Tq, Tk) table: the whole table in one number.
int64_t weighted_sum(const std::vector<int32_t>& t) {
  int64_t s = 0;
  for (size_t i = 0; i < t.size(); ++i) s += static_cast<int64_t>(t[i]) * static_cast<int64_t>(i % 9973 + 1);
  return s;
}
}  // namespace

// Expected values printed by torch 1.13 running transformers 4.36's
// T5Attention._relative_position_bucket on relative_position = arange(Tk)[None] - arange(Tq)[:, None]
// with num_buckets 32, max_distance 128: full rows 0, 18 and 36 of (37, 53), run-length rows 0, 150
// and 299 of (300, 300) (log branch and clamp), and for each table its sum and weighted_sum.
BOOST_AUTO_TEST_CASE(t5_buckets_match_hf) {
  auto table = [](int64_t Tq, int64_t Tk, bool bidirectional) {
    std::vector<int32_t> t(static_cast<size_t>(Tq * Tk), -1);
    t5_relative_buckets(t.data(), Tq, Tk, bidirectional, 32, 128);
    return t;
  };
  auto sum = [](const std::vector<int32_t>& t) { return std::accumulate(t.begin(), t.end(), int64_t{0}); };
  {
    const auto t = table(37, 53, true);
    BOOST_TEST(row_of(t, 53, 0) ==
               (std::vector<int32_t>{0,  17, 18, 19, 20, 21, 22, 23, 24, 24, 24, 24, 25, 25, 25, 25, 26, 26,
                                     26, 26, 26, 26, 26, 27, 27, 27, 27, 27, 27, 27, 27, 27, 28, 28, 28, 28,
                                     28, 28, 28, 28, 28, 28, 28, 28, 28, 28, 29, 29, 29, 29, 29, 29, 29}));
    BOOST_TEST(row_of(t, 53, 18) ==
               (std::vector<int32_t>{10, 10, 10, 9,  9,  9,  9,  8,  8,  8,  8,  7,  6,  5,  4,  3,  2,  1,
                                     0,  17, 18, 19, 20, 21, 22, 23, 24, 24, 24, 24, 25, 25, 25, 25, 26, 26,
                                     26, 26, 26, 26, 26, 27, 27, 27, 27, 27, 27, 27, 27, 27, 28, 28, 28}));
    BOOST_TEST(row_of(t, 53, 36) ==
               (std::vector<int32_t>{12, 12, 12, 12, 12, 11, 11, 11, 11, 11, 11, 11, 11, 11, 10, 10, 10, 10,
                                     10, 10, 10, 9,  9,  9,  9,  8,  8,  8,  8,  7,  6,  5,  4,  3,  2,  1,
                                     0,  17, 18, 19, 20, 21, 22, 23, 24, 24, 24, 24, 25, 25, 25, 25, 26}));
    BOOST_TEST(sum(t) == 36486);
    BOOST_TEST(weighted_sum(t) == 31922064);
  }
  {
    const auto t = table(37, 53, false);
    BOOST_TEST(row_of(t, 53, 0) == std::vector<int32_t>(53, 0));
    BOOST_TEST(row_of(t, 53, 18) == expand_runs({{16, 3},
                                                 {15, 1},
                                                 {14, 1},
                                                 {13, 1},
                                                 {12, 1},
                                                 {11, 1},
                                                 {10, 1},
                                                 {9, 1},
                                                 {8, 1},
                                                 {7, 1},
                                                 {6, 1},
                                                 {5, 1},
                                                 {4, 1},
                                                 {3, 1},
                                                 {2, 1},
                                                 {1, 1},
                                                 {0, 35}}));
    BOOST_TEST(row_of(t, 53, 36) ==
               (std::vector<int32_t>{22, 22, 21, 21, 21, 21, 20, 20, 20, 20, 19, 19, 19, 18, 18, 18, 17, 17,
                                     16, 16, 16, 15, 14, 13, 12, 11, 10, 9,  8,  7,  6,  5,  4,  3,  2,  1,
                                     0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0}));
    BOOST_TEST(sum(t) == 7373);
    BOOST_TEST(weighted_sum(t) == 10501929);
  }
  {
    const auto t = table(300, 300, true);
    BOOST_TEST(row_of(t, 300, 0) == expand_runs({{0, 1},
                                                 {17, 1},
                                                 {18, 1},
                                                 {19, 1},
                                                 {20, 1},
                                                 {21, 1},
                                                 {22, 1},
                                                 {23, 1},
                                                 {24, 4},
                                                 {25, 4},
                                                 {26, 7},
                                                 {27, 9},
                                                 {28, 14},
                                                 {29, 18},
                                                 {30, 27},
                                                 {31, 209}}));
    BOOST_TEST(row_of(t, 300, 150) ==
               expand_runs({{15, 60}, {14, 27}, {13, 18}, {12, 14}, {11, 9},  {10, 7},  {9, 4},  {8, 4},
                            {7, 1},   {6, 1},   {5, 1},   {4, 1},   {3, 1},   {2, 1},   {1, 1},  {0, 1},
                            {17, 1},  {18, 1},  {19, 1},  {20, 1},  {21, 1},  {22, 1},  {23, 1}, {24, 4},
                            {25, 4},  {26, 7},  {27, 9},  {28, 14}, {29, 18}, {30, 27}, {31, 59}}));
    BOOST_TEST(row_of(t, 300, 299) == expand_runs({{15, 209},
                                                   {14, 27},
                                                   {13, 18},
                                                   {12, 14},
                                                   {11, 9},
                                                   {10, 7},
                                                   {9, 4},
                                                   {8, 4},
                                                   {7, 1},
                                                   {6, 1},
                                                   {5, 1},
                                                   {4, 1},
                                                   {3, 1},
                                                   {2, 1},
                                                   {1, 1},
                                                   {0, 1}}));
    BOOST_TEST(sum(t) == 1896430);
    BOOST_TEST(weighted_sum(t) == 9307989666);
  }
  {
    const auto t = table(300, 300, false);
    BOOST_TEST(row_of(t, 300, 0) == std::vector<int32_t>(300, 0));
    const std::vector<std::pair<int32_t, int>> tail = {
        {30, 14}, {29, 12}, {28, 10}, {27, 10}, {26, 8}, {25, 7}, {24, 6}, {23, 6}, {22, 5}, {21, 4},
        {20, 4},  {19, 3},  {18, 3},  {17, 2},  {16, 3}, {15, 1}, {14, 1}, {13, 1}, {12, 1}, {11, 1},
        {10, 1},  {9, 1},   {8, 1},   {7, 1},   {6, 1},  {5, 1},  {4, 1},  {3, 1},  {2, 1},  {1, 1}};
    auto runs150 = tail, runs299 = tail;
    runs150.insert(runs150.begin(), {31, 38});
    runs150.push_back({0, 150});
    runs299.insert(runs299.begin(), {31, 187});
    runs299.push_back({0, 1});
    BOOST_TEST(row_of(t, 300, 150) == expand_runs(runs150));
    BOOST_TEST(row_of(t, 300, 299) == expand_runs(runs299));
    BOOST_TEST(sum(t) == 1147407);
    BOOST_TEST(weighted_sum(t) == 5921112630);
  }
  // Another configuration, num_buckets 8 and max_distance 20, for j - i = -20 .. 20 (torch 1.13).
  const std::vector<int32_t> bi8 = {3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 1, 0,
                                    5, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7};
  const std::vector<int32_t> ca8 = {7, 7, 7, 7, 7, 7, 7, 6, 6, 6, 6, 6, 5, 5, 5, 4, 4, 3, 2, 1, 0,
                                    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t d = -20; d <= 20; ++d) {
    BOOST_TEST(t5_relative_bucket(d, true, 8, 20) == bi8[d + 20], "d " << d);
    BOOST_TEST(t5_relative_bucket(d, false, 8, 20) == ca8[d + 20], "d " << d);
  }
  BOOST_CHECK_THROW(t5_relative_buckets(nullptr, 1, 1, true, 7, 128), Error);
}

BOOST_AUTO_TEST_CASE(embedding_without_positions) {
  Kernels& k = cpu_kernels();
  const int64_t V = 5, B = 2, T = 3, C = 4;
  std::vector<int32_t> tokens = {1, 3, 3, 0, 4, 1};
  auto wte = random_vec(V * C, 51), wpe = random_vec(T * C, 52), dy = random_vec(B * T * C, 53);
  std::vector<float> y(B * T * C, 9.0f), yp(B * T * C);
  k.embedding_forward(y.data(), tokens.data(), wte.data(), nullptr, B, T, C);
  k.embedding_forward(yp.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  for (int64_t i = 0; i < B * T; ++i)
    for (int64_t c = 0; c < C; ++c) {
      BOOST_TEST(y[i * C + c] == wte[tokens[i] * C + c]);
      BOOST_TEST(yp[i * C + c] == wte[tokens[i] * C + c] + wpe[(i % T) * C + c]);  // unchanged with wpe
    }
  std::vector<float> dwte(V * C, 0.5f), dwte_p(V * C, 0.5f), dwpe(T * C, 0.0f);
  k.embedding_backward(dwte.data(), nullptr, dy.data(), tokens.data(), B, T, C);
  k.embedding_backward(dwte_p.data(), dwpe.data(), dy.data(), tokens.data(), B, T, C);
  BOOST_TEST(dwte == dwte_p);  // the token gradient does not depend on the position term
  std::vector<float> want(V * C, 0.5f);
  for (int64_t i = 0; i < B * T; ++i)
    for (int64_t c = 0; c < C; ++c) want[tokens[i] * C + c] += dy[i * C + c];
  BOOST_TEST(dwte == want);
  for (int64_t c = 0; c < C; ++c) BOOST_TEST(dwte[2 * C + c] == 0.5f);  // token 2 unused
}

BOOST_AUTO_TEST_CASE(losses_ignore_negative_targets) {
  Kernels& k = cpu_kernels();
  const int64_t rows = 4, C = 5;
  auto x = random_vec(rows * C, 61, -2.0f, 2.0f);
  x[1 * C + 0] = 5.0f;  // row 1's argmax is column 0: correct for target 0, never when ignored
  std::vector<float> logp(rows * C);
  k.log_softmax_forward(logp.data(), x.data(), rows, C);
  const std::vector<int32_t> ignored = {2, -100, 4, -1}, plain = {2, 0, 4, 1};
  double s = 0.0, s_plain = 0.0;
  int64_t correct = -1, correct_plain = -1;
  k.nll_sum(logp.data(), ignored.data(), rows, C, &s, &correct);
  BOOST_TEST(s == -(static_cast<double>(logp[0 * C + 2]) + logp[2 * C + 4]));
  int64_t want_correct = 0;
  for (int64_t r : {0, 2}) {
    const int64_t best = std::max_element(logp.begin() + r * C, logp.begin() + (r + 1) * C) - (logp.begin() + r * C);
    want_correct += best == ignored[r];
  }
  BOOST_TEST(correct == want_correct);
  k.nll_sum(logp.data(), plain.data(), rows, C, &s_plain, &correct_plain);  // non-negative targets: as before
  BOOST_TEST(s_plain == -(static_cast<double>(logp[2]) + logp[C] + logp[2 * C + 4] + logp[3 * C + 1]));
  BOOST_TEST(correct_plain ==
             want_correct + 1 + (std::max_element(logp.begin() + 3 * C, logp.end()) - logp.begin() == 3 * C + 1));

  std::vector<float> d(rows * C, NAN);
  k.nll_backward(d.data(), ignored.data(), rows, C, -0.5f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < C; ++c) BOOST_TEST(d[r * C + c] == (ignored[r] == c ? -0.5f : 0.0f));

  std::vector<float> g(rows * C, NAN), g_plain(rows * C, NAN);
  k.cross_entropy_backward(g.data(), logp.data(), ignored.data(), rows, C, 0.25f);
  k.cross_entropy_backward(g_plain.data(), logp.data(), plain.data(), rows, C, 0.25f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const size_t i = static_cast<size_t>(r * C + c);
      if (ignored[r] < 0) {
        BOOST_TEST((g[i] == 0.0f && !std::signbit(g[i])));
      } else {
        BOOST_TEST(bits(g[i]) == bits(g_plain[i]));  // kept rows: bitwise what they were
        const float want = std::exp(logp[i]) * 0.25f - (c == plain[r] ? 0.25f : 0.0f);
        BOOST_TEST(g[i] == want);
      }
    }
}

BOOST_AUTO_TEST_SUITE_END()

// ---- train.matmul_precision: operands rounded to TF32 / bf16, f32 accumulation ----

BOOST_AUTO_TEST_CASE(round_to_tf32_known_answers) {
  const float one = 1.0f;
  BOOST_TEST(ops::round_to_tf32(one + std::ldexp(1.0f, -11)) == one);                             // tie: to even
  BOOST_TEST(ops::round_to_tf32(one + 3 * std::ldexp(1.0f, -11)) == one + std::ldexp(1.0f, -9));  // tie: up to even
  BOOST_TEST(ops::round_to_tf32(one + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)) == one + std::ldexp(1.0f, -10));
  BOOST_TEST(ops::round_to_tf32(-1.5f) == -1.5f);
  BOOST_TEST(ops::round_to_tf32(std::numeric_limits<float>::infinity()) == std::numeric_limits<float>::infinity());
  BOOST_TEST(std::isnan(ops::round_to_tf32(std::numeric_limits<float>::quiet_NaN())));
  // The largest float is above TF32's largest plus half its ulp: it rounds to infinity.
  BOOST_TEST(ops::round_to_tf32(std::numeric_limits<float>::max()) == std::numeric_limits<float>::infinity());
  BOOST_TEST(ops::round_to_bf16(one + std::ldexp(1.0f, -8)) == one);  // bf16: 7 bits, tie to even
}

BOOST_AUTO_TEST_CASE(round_to_tf32_matches_nearest_even_in_double) {
  std::mt19937 gen(7);
  std::uniform_int_distribution<uint32_t> bits(0, 0xffffffffu);
  int checked = 0;
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = bits(gen);
    float x = 0;
    std::memcpy(&x, &u, 4);
    if (!std::isnormal(x) || std::fabs(x) > 1e38f) continue;
    int e = 0;
    std::frexp(static_cast<double>(x), &e);                                  // x = m * 2^e, m in [0.5, 1)
    const double ulp = std::ldexp(1.0, e - 1 - 10);                          // 10 bits after the leading one
    const double want = std::nearbyint(static_cast<double>(x) / ulp) * ulp;  // ties to even
    BOOST_TEST_REQUIRE(static_cast<double>(ops::round_to_tf32(x)) == want, "x = " << x);
    ++checked;
  }
  BOOST_TEST(checked > 100000);
}

namespace {

// op(A) (M,K) and op(B) (K,N) stored with leading-dimension gaps; every combination of
// transposes; the rounded GEMM against highest-precision GEMM of operands rounded in place.
void check_rounded_gemm(MatmulPrecision p, float (*round)(float)) {
  std::mt19937 gen(11);
  std::normal_distribution<float> d(0.0f, 1.0f);
  const int64_t M = 37, N = 29, K = 53, gap = 3;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, lda = a_cols + gap;
      const int64_t b_rows = tb ? N : K, b_cols = tb ? K : N, ldb = b_cols + gap;
      std::vector<float> A(a_rows * lda), B(b_rows * ldb), C0(M * (N + gap));
      for (auto& v : A) v = d(gen);
      for (auto& v : B) v = d(gen);
      for (auto& v : C0) v = d(gen);
      std::vector<float> Ar = A, Br = B;
      for (auto& v : Ar) v = round(v);
      for (auto& v : Br) v = round(v);
      std::vector<float> got = C0, want = C0, full = C0;
      ops::gemm(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 0.25f, got.data(), N + gap, p);
      ops::gemm(ta, tb, M, N, K, 0.5f, Ar.data(), lda, Br.data(), ldb, 0.25f, want.data(), N + gap);
      ops::gemm(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 0.25f, full.data(), N + gap);
      // Exact products of rounded operands, summed as OpenBLAS sums: within f32 reordering.
      for (size_t i = 0; i < got.size(); ++i)
        BOOST_TEST_REQUIRE(std::fabs(got[i] - want[i]) <= 1e-5f * (1.0f + std::fabs(want[i])),
                           "ta " << ta << " tb " << tb << " element " << i);
      // The gaps of C are left alone; the rounding did something.
      for (int64_t r = 0; r < M; ++r)
        for (int64_t c = N; c < N + gap; ++c) BOOST_TEST_REQUIRE(got[r * (N + gap) + c] == C0[r * (N + gap) + c]);
      float most = 0;
      for (size_t i = 0; i < got.size(); ++i) most = std::max(most, std::fabs(got[i] - full[i]));
      BOOST_TEST(most > 1e-4f, "rounding to " << matmul_precision_name(p) << " changed nothing");
    }
}

}  // namespace

BOOST_AUTO_TEST_CASE(gemm_with_operands_rounded) {
  check_rounded_gemm(MatmulPrecision::high, ops::round_to_tf32);
  check_rounded_gemm(MatmulPrecision::medium, ops::round_to_bf16);
}

BOOST_AUTO_TEST_CASE(matmul_precision_is_per_kernel_set) {
  // A runtime's kernel set rounds; the shared one (and another set) does not.
  std::unique_ptr<Kernels> mine = make_cpu_kernels();
  mine->set_matmul_precision(MatmulPrecision::medium);
  BOOST_TEST(matmul_precision_name(cpu_kernels().matmul_precision()) == "highest");
  const int64_t rows = 5, in = 7, out = 3;
  std::vector<float> X(rows * in), W(out * in), b(out, 0.5f);
  for (size_t i = 0; i < X.size(); ++i) X[i] = 1.0f + 0.001f * static_cast<float>(i);  // not bf16 values
  for (size_t i = 0; i < W.size(); ++i) W[i] = 0.3f - 0.01f * static_cast<float>(i);
  std::vector<float> y_medium(rows * out), y_ops(rows * out), y_shared(rows * out), y_highest(rows * out);
  mine->linear_forward(y_medium.data(), X.data(), W.data(), b.data(), rows, in, out);
  ops::linear_forward(y_ops.data(), X.data(), W.data(), b.data(), rows, in, out, MatmulPrecision::medium);
  cpu_kernels().linear_forward(y_shared.data(), X.data(), W.data(), b.data(), rows, in, out);
  ops::linear_forward(y_highest.data(), X.data(), W.data(), b.data(), rows, in, out);
  BOOST_TEST(y_medium == y_ops, boost::test_tools::per_element());
  BOOST_TEST(y_shared == y_highest, boost::test_tools::per_element());
  BOOST_TEST(y_medium != y_highest);
}
