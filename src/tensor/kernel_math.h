#pragma once
// The per-element math that the host kernels and the CUDA kernels share, written once as
// FSDP_HD (host + device) inline functions so both compute the same bits:
//   - Philox4x32-10 and uniform(counter): CounterRng (tensor/rng.cpp) bit for bit;
//   - dropout's keep rule (nn/activation.cpp): mask = uniform >= p ? scale : 0;
//   - exact (erf) GELU forward and backward as ops.cpp computes them;
//   - f32 <-> bf16 / f16 round to nearest even and back (tensor/dtype.h);
//   - one element of SGD, Adadelta and AdamW (optim/optimizer.cpp) from kernels.h's Args.
//
// Floating-point contraction. The CPU build (-march=native, GCC's default -ffp-contract=fast)
// fuses where FMA is an instruction, and optimizer.cpp's madd() is an explicit fmaf under
// FP_FAST_FMAF (defined by -march=native on every x86 with FMA: Haswell and later, all the
// hosts this project trains on). nvcc fuses a*b+c by default too (--fmad=true), but not always
// where GCC does. So every sum of a product here is spelled out: fmaf() where the CPU build
// fuses, add_unfused() where it must not (the host spelling of the CPU code, fmaf(a, 1, b), which
// GCC keeps as it is; on the device __fadd_rn, which nvcc never contracts). Nothing else here
// adds a product, so no compiler can change these results:
//   - optimizer madd(a, b, c) -> fmaf(a, b, c): bitwise equal to the CPU build with FMA. A CPU
//     build without FMA (-Dnative_arch=false on an old target) rounds a*b first: up to one
//     rounding apart per madd there (tests/test_kernel_math.cpp checks which case it is in).
//   - GELU backward: GCC 12 compiles ops.cpp's `cdf + x * pdf` with cdf = 0.5f * (1 + erf) as
//     fma(0.5f, 1 + erf, x * pdf) (read from the object code); gelu_backward below spells that.
//   - erff/expf: on the host these are glibc's (the same calls ops.cpp makes, so bitwise); on
//     the device CUDA's erff/expf (max 2 ulp), so device GELU matches the host to a few ulp,
//     not bitwise. sqrtf and '/' are correctly rounded on both (nvcc's default -prec-sqrt/div).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "tensor/kernels.h"

// The one preprocessor switch of the CUDA part of tensor/: FSDP_HD marks functions for both
// the host and the device when nvcc compiles; add_unfused picks the device intrinsic in nvcc's
// device pass.
#ifdef __CUDACC__
#define FSDP_HD __host__ __device__
#else
#define FSDP_HD
#endif

namespace fsdp::kmath {

// a + b rounded once, never fused with a product that produced a or b.
FSDP_HD inline float add_unfused(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return fmaf(a, 1.0f, b);  // GCC keeps fma(a, 1, b): optimizer.cpp's madd(x, 1.0f, p)
#endif
}

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

// --- Philox4x32-10 (CounterRng::block): counter in words 0-1, stream in words 2-3, key 0-1.
struct Philox4 {
  uint32_t v[4];
};

FSDP_HD inline Philox4 philox_block(uint64_t key, uint64_t stream, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = static_cast<uint32_t>(stream), c3 = static_cast<uint32_t>(stream >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    uint32_t n1 = static_cast<uint32_t>(p1);
    uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    uint32_t n3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// CounterRng(key, stream).uniform(counter): [0, 1) from the top 24 bits of word 0.
FSDP_HD inline float philox_uniform(uint64_t key, uint64_t stream, uint64_t counter) {
  return static_cast<float>(philox_block(key, stream, counter).v[0] >> 8) * (1.0f / 16777216.0f);
}

// Dropout's mask value for element j of local sample n (nn/activation.cpp, kernels.h).
FSDP_HD inline uint64_t dropout_counter(int64_t sample_offset, int64_t n, int64_t per_sample, int64_t j) {
  return static_cast<uint64_t>(sample_offset + n) * static_cast<uint64_t>(per_sample) + static_cast<uint64_t>(j);
}
FSDP_HD inline float dropout_mask(float u, float p, float scale) { return u >= p ? scale : 0.0f; }

// --- Exact GELU (ops.cpp).
constexpr float kSqrt1_2 = 0.7071067811865476f;  // static_cast<float>(M_SQRT1_2)
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

FSDP_HD inline float gelu_forward(float x) { return 0.5f * x * (1.0f + erff(x * kSqrt1_2)); }

FSDP_HD inline float gelu_backward(float dy, float x) {
  const float one_plus_erf = 1.0f + erff(x * kSqrt1_2);
  const float pdf = kInvSqrt2Pi * expf(-0.5f * x * x);
  // cdf + x * pdf with cdf = 0.5 * (1 + erf), as the CPU build computes it (see the top).
  return dy * fmaf(0.5f, one_plus_erf, x * pdf);
}

// --- f32 <-> bf16 / f16 (tensor/dtype.h): round to nearest even, NaN quiet, overflow to inf.
FSDP_HD inline uint16_t f32_to_bf16(float value) {
  uint32_t u = bits_of(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

FSDP_HD inline float bf16_to_f32(uint16_t bits) { return float_of(static_cast<uint32_t>(bits) << 16); }

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

// --- Optimizer updates of one element (optim/optimizer.cpp; madd -> fmaf, see the top).
// momentum_buffer: null when !a.has_momentum.
FSDP_HD inline void sgd_element(float& p, float g, float* momentum_buffer, const SgdArgs& a) {
  float d = g;
  if (a.has_weight_decay) d = fmaf(a.weight_decay, p, d);  // d_p.add(param, alpha=wd)
  if (a.has_momentum) {
    float b = d;  // the first step clones d_p into the buffer
    if (!a.first_step) b = fmaf(a.keep, d, *momentum_buffer * a.momentum);
    *momentum_buffer = b;
    d = a.nesterov ? fmaf(a.momentum, b, d) : b;
  }
  p = fmaf(a.neg_lr, d, p);  // param.add_(d_p, alpha=-lr)
}

FSDP_HD inline void adadelta_element(float& p, float g, float& square_avg, float& acc_delta, const AdadeltaArgs& a) {
  float gi = g;
  if (a.has_weight_decay) gi = fmaf(a.weight_decay, p, gi);
  const float s = fmaf(a.one_minus_rho * gi, gi, square_avg * a.rho);
  square_avg = s;
  const float delta = sqrtf(acc_delta + a.eps) / sqrtf(s + a.eps) * gi;
  acc_delta = fmaf(a.one_minus_rho * delta, delta, acc_delta * a.rho);
  p = fmaf(a.neg_lr, delta, p);
}

FSDP_HD inline void adamw_element(float& p, float g, float& exp_avg, float& exp_avg_sq, const AdamWArgs& a) {
  float pi = p;
  if (a.has_weight_decay) pi = pi * a.decay;  // param.mul_(1 - lr * wd)
  const float mi = fmaf(a.one_minus_beta1, g, exp_avg * a.beta1);
  const float vi = fmaf(a.one_minus_beta2 * g, g, exp_avg_sq * a.beta2);
  exp_avg = mi;
  exp_avg_sq = vi;
  const float denom = sqrtf(vi) / a.bias_correction2_sqrt + a.eps;
  p = add_unfused(a.neg_step_size * mi / denom, pi);  // addcdiv_: an unfused add
}

}  // namespace fsdp::kmath
