#pragma once
// The per-element math that the host kernels and the CUDA kernels share, written once as
// FSDP_HD (host + device) inline functions so both compute the same bits:
//   - Philox4x32-10 and uniform(counter): CounterRng (tensor/rng.cpp) bit for bit;
//   - dropout's keep rule (nn/activation.cpp): mask = uniform >= p ? scale : 0;
//   - exact (erf) GELU forward and backward as ops.cpp computes them; tanh GELU (HF's gelu_new);
//   - f32 <-> bf16 / f16 round to nearest even and back (tensor/half_math.h, also dtype.h's);
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
//   - GELU backward: GCC 12 compiled ops.cpp's former `cdf + x * pdf` with cdf = 0.5f * (1 + erf)
//     as fma(0.5f, 1 + erf, x * pdf) (read from the object code); gelu_backward below spells
//     that, and ops.cpp now calls it: clang (-ffp-contract=on) had fused it the other way,
//     fma(x, pdf, cdf), one ulp apart (tests/test_kernel_math.cpp under tests/sanitize.sh).
//   - erff/expf: on the host these are glibc's (the same calls ops.cpp makes, so bitwise); on
//     the device CUDA's erff/expf (max 2 ulp), so device GELU matches the host to a few ulp,
//     not bitwise. sqrtf and '/' are correctly rounded on both (nvcc's default -prec-sqrt/div).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "tensor/half_math.h"
#include "tensor/kernels.h"

namespace fsdp::kmath {

// a + b rounded once, never fused with a product that produced a or b.
FSDP_HD inline float add_unfused(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return fmaf(a, 1.0f, b);  // GCC keeps fma(a, 1, b): optimizer.cpp's madd(x, 1.0f, p)
#endif
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

// --- Tanh GELU: HF's NewGELUActivation ("gelu_new", T5 v1.1's gated-gelu), whose forward is
// torch ops each rounded to f32: x * x * x (torch.pow(x, 3.0) multiplies twice), times
// 0.044715, plus x (unfused), times sqrt(2/pi), tanh, plus 1, times 0.5 * x. tanhf is glibc's
// on the host and CUDA's (max 2 ulp) on the device: a few ulp apart, as erf GELU.
constexpr float kSqrt2OverPi = 0.7978845608028654f;  // static_cast<float>(math.sqrt(2 / math.pi))
constexpr float kGeluTanhCubic = 0.044715f;

FSDP_HD inline float gelu_tanh_inner(float x) { return kSqrt2OverPi * add_unfused(x, kGeluTanhCubic * (x * x * x)); }

FSDP_HD inline float gelu_tanh_forward(float x) { return 0.5f * x * (1.0f + tanhf(gelu_tanh_inner(x))); }

// d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), t = tanh(inner).
// The three sums of a product are explicit fmaf so host and device round them alike.
FSDP_HD inline float gelu_tanh_backward(float dy, float x) {
  const float t = tanhf(gelu_tanh_inner(x));
  const float sech2 = fmaf(-t, t, 1.0f);                                         // 1 - t^2
  const float dinner = kSqrt2OverPi * fmaf(3.0f * kGeluTanhCubic, x * x, 1.0f);  // d inner / dx
  return dy * fmaf(0.5f * x * sech2, dinner, 0.5f * (1.0f + t));
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
