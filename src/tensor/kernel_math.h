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
//   - erf and exp in GELU are erf_f32/exp_f32 below, not the C library's: polynomials of fmaf,
//     so the host and the device compute the same bits, and the host loop vectorises (glibc's
//     erff/expf are scalar calls: 12% of the bench transformer's step went to GELU). tanhf (T5's
//     gelu_new) is still the library's: glibc's on the host, CUDA's (max 2 ulp) on the device.
//     sqrtf and '/' are correctly rounded on both (nvcc's default -prec-sqrt/div).
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

// v as a `dtype` tensor would hold it, widened back (bf16/f16 to nearest even, as torch's .to();
// f32 and the rest: v): fsdp.mixed_precision.compute: param_dtype's rounding of an op's output,
// in Kernels::round_to and folded into the kernels that store outputs (add_layernorm_forward).
FSDP_HD inline float round_as(float v, DType dtype) {
  if (dtype == DType::bf16) return bf16_to_f32(f32_to_bf16(v));
  if (dtype == DType::f16) return f16_to_f32(f32_to_f16(v));
  return v;
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
FSDP_HD inline float dropout_scale(float p) { return 1.0f / (1.0f - p); }  // forward and backward alike

// --- Exact GELU (ops.cpp).
constexpr float kSqrt1_2 = 0.7071067811865476f;  // static_cast<float>(M_SQRT1_2)
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

// exp(x) for x < 88.37 (2^n times a degree-6 polynomial on [-ln2/2, ln2/2]): at most 0.91 ulp
// from the exact value for x >= -87.33 (every f32 checked once against double exp; the test
// samples), 0 below, where glibc's expf returns denormals; NaN stays NaN. Branch-free: with
// -fno-trapping-math (meson.build) GCC vectorises a loop of it, and of erf_f32.
FSDP_HD inline float exp_f32(float x) {
  constexpr float kLog2e = 1.44269504f;
  constexpr float kRound = 12582912.0f;  // 0x1.8p23: adding it rounds to an integer, held in the low bits
  constexpr float kLn2Hi = 0.693145751953125f, kLn2Lo = 1.42860677e-06f;  // ln 2 = hi + lo, hi exact in 16 bits
  constexpr float kMin = -87.3365479f;   // ln(2^-126): below it 2^n is no longer a normal float
  const float xc = x < kMin ? kMin : x;  // a NaN compares false and stays
  const float shifted = fmaf(kLog2e, xc, kRound);
  const float n = shifted - kRound;  // round(x / ln 2)
  float r = fmaf(n, -kLn2Hi, xc);    // x - n ln 2, in two steps so it is exact to the last bit
  r = fmaf(n, -kLn2Lo, r);
  // exp(r) = 1 + r (1 + r q(r)), q a least-squares fit in relative error on Chebyshev nodes;
  // the last step is one rounding of a value near 1.
  float q = 0.00137514074f;
  q = fmaf(q, r, 0.00836891588f);
  q = fmaf(q, r, 0.0416695327f);
  q = fmaf(q, r, 0.166665182f);
  q = fmaf(q, r, 0.499999881f);
  q = fmaf(q, r, 1.0f);
  const float p = fmaf(q, r, 1.0f);
  // 2^n from the low bits of `shifted` (n + 0x400000 there): shifted into the exponent field.
  const float scale = float_of((bits_of(shifted) << 23) + 0x3F800000u);
  return x < kMin ? 0.0f : p * scale;
}

// erf(x), at most 1.03 ulp from the exact value (every f32 checked once against double erf;
// glibc's erff: 0.97; tests/test_kernel_math.cpp samples). Two least-
// squares fits, evaluated both and selected so the loop stays branch-free:
//   |x| < 1:  erf(x) = x + x R(x^2), R of degree 6 fits erf(x)/x - 1;
//   |x| >= 1: erf(|x|) = 1 - exp(Q(|x| - 2.46) - x^2), Q of degree 8 fits log(erfc(t)) + t^2
//             on [1, 3.92]; beyond 3.92 erf rounds to 1 in f32.
// The |x| < 1 branch alone: erf_f32(x) == erf_small_f32(x), bit for bit, wherever |x| < 1.
FSDP_HD inline float erf_small_f32(float x) {
  const float s = x * x;
  float r = 7.84725926e-05f;
  r = fmaf(r, s, -0.000800818903f);
  r = fmaf(r, s, 0.00518809911f);
  r = fmaf(r, s, -0.0268536918f);
  r = fmaf(r, s, 0.112835824f);
  r = fmaf(r, s, -0.37612626f);
  r = fmaf(r, s, 0.128379166f);
  return fmaf(x, r, x);
}

FSDP_HD inline float erf_f32(float x) {
  const float t = fabsf(x);
  const float small = erf_small_f32(x);
  const float tc = t > 3.92f ? 3.92f : t;  // not fminf: a NaN must stay NaN
  const float u = tc - 2.46000004f;
  float q = 1.64496589e-06f;
  q = fmaf(q, u, -1.3808045e-05f);
  q = fmaf(q, u, 8.10720376e-05f);
  q = fmaf(q, u, -0.000439232565f);
  q = fmaf(q, u, 0.00225122273f);
  q = fmaf(q, u, -0.0112117082f);
  q = fmaf(q, u, 0.0574303828f);
  q = fmaf(q, u, -0.357221872f);
  q = fmaf(q, u, -1.54261756f);
  // 1 - exp unfused: exp ends in a product, which a compiler could otherwise fuse into the
  // subtraction on one side only.
  const float large = copysignf(add_unfused(1.0f, -exp_f32(fmaf(-tc, tc, q))), x);
  return t < 1.0f ? small : large;
}

// kErfSmall: the host's loops (ops.cpp) pass true for a block of inputs that all have
// |x / sqrt 2| < 1 (gelu_erf_is_small), and erf skips its other branch's polynomial and exp:
// the same bits as erf_f32 there, in about half the time.
template <bool kErfSmall = false>
FSDP_HD inline float gelu_erf(float x) {
  return kErfSmall ? erf_small_f32(x * kSqrt1_2) : erf_f32(x * kSqrt1_2);
}

template <bool kErfSmall = false>
FSDP_HD inline float gelu_forward(float x) {
  return 0.5f * x * (1.0f + gelu_erf<kErfSmall>(x));
}

template <bool kErfSmall = false>
FSDP_HD inline float gelu_backward(float dy, float x) {
  const float one_plus_erf = 1.0f + gelu_erf<kErfSmall>(x);
  const float pdf = kInvSqrt2Pi * exp_f32(-0.5f * x * x);
  // cdf + x * pdf with cdf = 0.5 * (1 + erf), as the CPU build computes it (see the top).
  return dy * fmaf(0.5f, one_plus_erf, x * pdf);
}

// Whether erf_small_f32 gives gelu's erf its value for x (a NaN does not qualify).
FSDP_HD inline bool gelu_erf_is_small(float x) { return fabsf(x * kSqrt1_2) < 1.0f; }

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

// --- SiLU (Llama's hidden_act "silu"): torch's x / (1 + exp(-x)) and its silu_backward,
// dy * s * (1 + x * (1 - s)) with s = 1 / (1 + exp(-x)); the sum of a product as an explicit fmaf
// so that host and device round it alike.
FSDP_HD inline float silu_forward(float x) { return x / (1.0f + exp_f32(-x)); }
FSDP_HD inline float silu_backward(float dy, float x) {
  const float s = 1.0f / (1.0f + exp_f32(-x));
  return dy * s * fmaf(x, 1.0f - s, 1.0f);
}

// --- Rotary position embedding (HF Llama's apply_rotary_pos_emb): element i < D/2 of a head and
// element i + D/2 rotate together by the angle of (position, i): y = x * cos + rotate_half(x) *
// sin, two products rounded and then added, as torch computes it. The backward is the same
// rotation with sin negated: dx1 = dy1 c + dy2 s, dx2 = dy2 c - dy1 s (rotate_half's transpose).
FSDP_HD inline void rope_pair(float* x1, float* x2, float c, float s) {
  const float a = *x1, b = *x2;
  *x1 = add_unfused(a * c, -(b * s));
  *x2 = add_unfused(b * c, a * s);
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
