// tensor/kernel_math.h on the host against the CPU code it mirrors, bit for bit: Philox against
// CounterRng, GELU against ops.cpp, the bf16/f16 conversions against dtype.h, and one element
// of SGD/Adadelta/AdamW against the real optimizers (optim/optimizer.cpp).
#define BOOST_TEST_MODULE kernel_math
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "config/config.h"
#include "optim/optim.h"
#include "tensor/dtype.h"
#include "tensor/kernel_math.h"
#include "tensor/memory.h"
#include "tensor/ops.h"
#include "tensor/rng.h"

using namespace fsdp;

namespace {

uint32_t bits(float f) { return kmath::bits_of(f); }

// Equal bits, or both NaN with equal bits (NaN payloads are part of what must match).
void require_same(float expected, float got, const std::string& what) {
  if (bits(expected) != bits(got))
    BOOST_FAIL(what << ": expected " << expected << " (0x" << std::hex << bits(expected) << ") got " << got << " (0x"
                    << bits(got) << std::dec << ")");
}

// Interesting f32 values: specials, boundaries of bf16/f16 rounding, denormals, ties.
std::vector<float> special_floats() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          -std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::signaling_NaN(),
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::lowest(),
                          std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::denorm_min(),
                          -std::numeric_limits<float>::denorm_min(),
                          65504.0f,
                          65519.99f,
                          65520.0f,
                          -65520.0f,
                          6.103515625e-05f,  // smallest normal f16
                          5.9604645e-08f,    // smallest subnormal f16
                          2.9802322e-08f,    // half of it: ties to zero
                          2.9802326e-08f,    // just above half
                          8.940697e-08f,     // 1.5 * 2^-24: tie to even (2)
                          1.00390625f,       // bf16 tie (1 + 2^-8): rounds to even (1)
                          1.01171875f,       // bf16 tie (1 + 3 * 2^-8): rounds up
                          1.00048828125f,    // f16 tie (1 + 2^-11)
                          1.00146484375f};   // f16 tie (1 + 3 * 2^-11)
  for (uint32_t u :
       {0x7f7fffffu, 0x7f7f8000u, 0x7f7f7fffu, 0x00000001u, 0x007fffffu, 0x80000001u, 0x7f800001u, 0x7fc00001u,
        0xffbfffffu, 0x477fefffu, 0x477ff000u, 0x33000000u, 0x33000001u, 0x387fc000u, 0x387fe000u, 0x38800000u})
    v.push_back(kmath::float_of(u));
  return v;
}

}  // namespace

BOOST_AUTO_TEST_CASE(philox_equals_counter_rng) {
  std::mt19937_64 gen(12345);
  std::vector<uint64_t> keys = {0, 1, 0xffffffffffffffffull, 0x9E3779B97F4A7C15ull, hash_name("layer.weight")};
  std::vector<uint64_t> streams = {0, 1, 0xffffffff00000000ull, hash_name("dropout1")};
  for (int i = 0; i < 20; ++i) {
    keys.push_back(gen());
    streams.push_back(gen());
  }
  int64_t checked = 0;
  for (uint64_t key : keys) {
    for (uint64_t stream : streams) {
      CounterRng rng(key, stream);
      for (int i = 0; i < 200; ++i) {
        // Small counters, counters around 2^32 (the carry into word 1) and random ones.
        uint64_t counter = i < 64 ? static_cast<uint64_t>(i) : i < 128 ? 0xffffffffull + (i - 96) : gen();
        auto expected = rng.block(counter);
        auto got = kmath::philox_block(key, stream, counter);
        for (int w = 0; w < 4; ++w) BOOST_REQUIRE_EQUAL(expected[w], got.v[w]);
        require_same(rng.uniform(counter), kmath::philox_uniform(key, stream, counter), "uniform");
        ++checked;
      }
    }
  }
  BOOST_TEST(checked == 25 * 24 * 200);
}

BOOST_AUTO_TEST_CASE(dropout_counter_and_mask) {
  // nn/activation.cpp: counter = (sample_offset + n) * per_sample + j; keep when u >= p.
  BOOST_TEST(kmath::dropout_counter(3, 2, 10, 7) == 57u);
  BOOST_TEST(kmath::dropout_counter(0, 0, 1, 0) == 0u);
  BOOST_TEST(kmath::dropout_mask(0.5f, 0.5f, 2.0f) == 2.0f);
  BOOST_TEST(kmath::dropout_mask(0.49999997f, 0.5f, 2.0f) == 0.0f);
  BOOST_TEST(kmath::dropout_mask(0.0f, 0.0f, 1.0f) == 1.0f);
}

// |got - exact| in units of the last place of the exact value rounded to f32.
double ulps(float got, double exact) {
  const float rounded = static_cast<float>(exact);
  const double ulp = std::nextafter(std::fabs(rounded), std::numeric_limits<float>::infinity()) - std::fabs(rounded);
  return std::fabs(static_cast<double>(got) - exact) / ulp;
}

// Every 4093rd f32 bit pattern from lo to hi, bits_of(lo) <= bits_of(hi) (for negative floats
// the bits grow with the magnitude, so a negative range runs from the small end to the large
// one). About 760,000 values in the three ranges below: seconds under the sanitizers. The
// exhaustive scan was a one-off (kernel_math.h gives its result).
template <class F>
void scan_floats(float lo, float hi, F&& check) {
  for (uint32_t b = kmath::bits_of(lo); kmath::bits_of(kmath::float_of(b)) <= kmath::bits_of(hi); b += 4093)
    check(kmath::float_of(b));
}

BOOST_AUTO_TEST_CASE(erf_f32_within_one_ulp) {
  double worst = 0.0;
  float worst_x = 0.0f;
  scan_floats(1e-30f, 10.0f, [&](float x) {
    const double e = ulps(kmath::erf_f32(x), std::erf(static_cast<double>(x)));
    if (e > worst) worst = e, worst_x = x;
    require_same(-kmath::erf_f32(x), kmath::erf_f32(-x), "erf_f32 odd at " + std::to_string(x));
  });
  BOOST_TEST_MESSAGE("erf_f32: worst " << worst << " ulp at " << worst_x);
  BOOST_TEST(worst <= 1.03, "erf_f32 " << worst << " ulp at " << worst_x);
  require_same(0.0f, kmath::erf_f32(0.0f), "erf(0)");
  require_same(-0.0f, kmath::erf_f32(-0.0f), "erf(-0)");
  require_same(1.0f, kmath::erf_f32(std::numeric_limits<float>::infinity()), "erf(inf)");
  require_same(-1.0f, kmath::erf_f32(-std::numeric_limits<float>::infinity()), "erf(-inf)");
  BOOST_TEST(std::isnan(kmath::erf_f32(std::numeric_limits<float>::quiet_NaN())));
  // The small branch alone (GELU's blocks of small inputs) is erf_f32 wherever |x| < 1.
  scan_floats(1e-30f, std::nextafter(1.0f, 0.0f), [&](float x) {
    require_same(kmath::erf_f32(x), kmath::erf_small_f32(x), "erf_small_f32(" + std::to_string(x) + ")");
    require_same(kmath::erf_f32(-x), kmath::erf_small_f32(-x), "erf_small_f32(" + std::to_string(-x) + ")");
  });
  BOOST_TEST(kmath::gelu_erf_is_small(std::nextafter(1.41421356f, 0.0f)));
  BOOST_TEST(!kmath::gelu_erf_is_small(1.41421356f * 1.0000002f));
  BOOST_TEST(!kmath::gelu_erf_is_small(std::numeric_limits<float>::quiet_NaN()));
}

BOOST_AUTO_TEST_CASE(exp_f32_within_one_ulp) {
  double worst = 0.0;
  float worst_x = 0.0f;
  auto check = [&](float x) {
    const double e = ulps(kmath::exp_f32(x), std::exp(static_cast<double>(x)));
    if (e > worst) worst = e, worst_x = x;
  };
  scan_floats(0.0f, 88.3f, check);
  scan_floats(-1e-30f, -87.3365f, check);
  BOOST_TEST_MESSAGE("exp_f32: worst " << worst << " ulp at " << worst_x);
  BOOST_TEST(worst <= 0.91, "exp_f32 " << worst << " ulp at " << worst_x);
  require_same(1.0f, kmath::exp_f32(0.0f), "exp(0)");
  require_same(0.0f, kmath::exp_f32(-87.34f), "exp below the normal range flushes to 0");
  require_same(0.0f, kmath::exp_f32(-std::numeric_limits<float>::infinity()), "exp(-inf)");
  BOOST_TEST(std::isnan(kmath::exp_f32(std::numeric_limits<float>::quiet_NaN())));
}

BOOST_AUTO_TEST_CASE(gelu_equals_ops) {
  std::vector<float> x = special_floats();
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_real_distribution<float> wide(-40.0f, 40.0f);
  for (int i = 0; i < 200000; ++i) x.push_back(i % 2 ? normal(gen) : wide(gen));
  for (int i = -2000; i <= 2000; ++i) x.push_back(static_cast<float>(i) / 256.0f);  // a dense grid
  // ops' loops go in blocks of 16 and take erf's small branch alone for a block whose inputs all
  // have |x / sqrt 2| < 1: blocks of a transformer's spread (about 0.45), blocks with one input
  // at the branch's edge (sqrt 2 and the floats beside it) or past it at each of the 16
  // positions, and a tail that is no whole block.
  std::normal_distribution<float> narrow(0.0f, 0.45f);
  const float edge = 1.41421356f;
  const float edges[] = {std::nextafter(edge, 0.0f),
                         edge,
                         std::nextafter(edge, 2.0f),
                         -edge,
                         2.5f,
                         std::numeric_limits<float>::quiet_NaN()};
  x.resize((x.size() + 15) / 16 * 16, 0.5f);
  for (int i = 0; i < 4000; ++i) x.push_back(narrow(gen));
  for (const float e : edges)
    for (int at = 0; at < 16; ++at)
      for (int i = 0; i < 16; ++i) x.push_back(i == at ? e : narrow(gen));
  for (int i = 0; i < 7; ++i) x.push_back(narrow(gen));
  auto n = static_cast<int64_t>(x.size());
  std::vector<float> dy(x.size());
  for (auto& d : dy) d = normal(gen);
  std::vector<float> y(x.size()), dx(x.size());
  ops::gelu_forward(y.data(), x.data(), n);
  ops::gelu_backward(dx.data(), dy.data(), x.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    require_same(y[i], kmath::gelu_forward(x[i]), "gelu_forward(" + std::to_string(x[i]) + ")");
    require_same(dx[i], kmath::gelu_backward(dy[i], x[i]), "gelu_backward(" + std::to_string(x[i]) + ")");
  }
}

BOOST_AUTO_TEST_CASE(half_conversions_equal_dtype) {
  // Every 16-bit pattern back to f32.
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    auto b = static_cast<uint16_t>(h);
    require_same(bf16_to_f32(b), kmath::bf16_to_f32(b), "bf16_to_f32");
    require_same(f16_to_f32(b), kmath::f16_to_f32(b), "f16_to_f32");
  }
  auto check = [](float f) {
    if (f32_to_bf16(f) != kmath::f32_to_bf16(f))
      BOOST_FAIL("f32_to_bf16 of 0x" << std::hex << bits(f) << ": " << f32_to_bf16(f) << " vs "
                                     << kmath::f32_to_bf16(f));
    if (f32_to_f16(f) != kmath::f32_to_f16(f))
      BOOST_FAIL("f32_to_f16 of 0x" << std::hex << bits(f) << ": " << f32_to_f16(f) << " vs " << kmath::f32_to_f16(f));
  };
  for (float f : special_floats()) {
    check(f);
    check(-f);
  }
  // A stride through all 2^32 patterns (NaNs, infinities, denormals, both signs) ...
  for (uint64_t u = 0; u <= 0xffffffffull; u += 977) check(kmath::float_of(static_cast<uint32_t>(u)));
  // ... and every pattern whose dropped bits sit at or next to a rounding tie, in every
  // exponent (bf16 drops 16 bits; f16 13 in the normal range, more in the subnormal range).
  for (uint32_t e = 0; e < 256; ++e) {
    for (uint32_t low : {0x7fffu, 0x8000u, 0x8001u, 0x17fffu, 0x18000u, 0x18001u, 0xfffu, 0x1000u, 0x1001u, 0x2fffu,
                         0x3000u, 0x3001u, 0x3fffu, 0x4000u, 0x1ffffu, 0x20000u, 0x3ffffu, 0x40000u}) {
      for (uint32_t sign : {0u, 0x80000000u}) check(kmath::float_of(sign | (e << 23) | low));
    }
  }
  // Round trips of every half value.
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    auto b = static_cast<uint16_t>(h);
    check(bf16_to_f32(b));
    check(f16_to_f32(b));
  }
}

namespace {

// One optimizer on n elements for `steps` steps, against kmath's update element by element
// with the scalars computed as optimizer.cpp computes them (f64, cast to f32).
std::vector<std::vector<float>> random_grads(int steps, size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> grads(steps, std::vector<float>(n));
  for (auto& g : grads) {
    for (size_t i = 0; i < n; ++i) g[i] = i % 97 == 0 ? 0.0f : normal(gen) * (i % 5 == 0 ? 1e-4f : 1.0f);
  }
  return grads;
}

std::vector<float> random_params(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> p(n);
  for (auto& x : p) x = u(gen);
  return p;
}

constexpr size_t kElements = 4096;
constexpr int kSteps = 6;

// The real optimizer's params after each step.
std::vector<std::vector<float>> run_real(const OptimizerConfig& config, const std::vector<float>& p0,
                                         const std::vector<std::vector<float>>& grads, double lr) {
  MemoryTracker tracker;
  auto opt = make_optimizer(config, static_cast<int64_t>(p0.size()), &tracker);
  std::vector<float> p = p0;
  std::vector<std::vector<float>> out;
  for (const auto& g : grads) {
    opt->step(std::span<float>(p), std::span<const float>(g), lr);
    out.push_back(p);
  }
  return out;
}

void require_params(const std::vector<float>& expected, const std::vector<float>& got, int step, const char* what) {
  BOOST_TEST(expected.size() == got.size());
  for (size_t i = 0; i < expected.size(); ++i)
    require_same(expected[i], got[i],
                 std::string(what) + " step " + std::to_string(step) + " element " + std::to_string(i));
}

// Whether this build's optimizer madd (tensor/cpu_kernels.cpp) is fmaf: FP_FAST_FMAF, which GCC
// defines with -march=native on every x86 with FMA (clang defines none). kernel_math.h always
// fuses, so the element cases below compare bitwise only in such a build; in any other they are
// skipped, saying so.
constexpr bool kBuildFusesMadd =
#ifdef FP_FAST_FMAF
    true;
#else
    false;
#endif

boost::test_tools::assertion_result build_fuses_madd(boost::unit_test::test_unit_id) {
  boost::test_tools::assertion_result r(kBuildFusesMadd);
  if (!kBuildFusesMadd)
    r.message() << "no FP_FAST_FMAF in this build: the optimizer's madd is a * b + c, which the compiler may or may "
                   "not contract, and kernel_math fuses (kernel_math.h): the bitwise comparison does not apply";
  return r;
}

}  // namespace

BOOST_AUTO_TEST_CASE(this_build_fuses_madd) {
  // One SGD step, p + (-lr) * g, on operands where fusing shows: -lr * g = -(1 + 2^-11 + 2^-24)
  // exactly, which rounded to f32 first is -(1 + 2^-11) (a tie, to even), so the unfused sum is
  // 0; fused it is -2^-24. kernel_math's SGD element fuses in every build. Under FP_FAST_FMAF the
  // real optimizer's madd is an explicit fmaf and must give the fused bits too (what the element
  // cases below rely on). Otherwise madd is a * b + c, which the compiler may still contract
  // where FMA is an instruction (clang's -ffp-contract=on defines no FP_FAST_FMAF) or not: either
  // result is right, one rounding apart at most (kernel_math.h), and nothing else is.
  const double lr = 1.0 + 0x1p-12;
  const float g = 1.0f + 0x1p-12f, p0 = 1.0f + 0x1p-11f, neg_lr = float(-lr);
  const float fused = std::fma(neg_lr, g, p0);
  volatile float product = neg_lr * g;  // volatile: rounded on its own, never contracted into the add
  const float unfused = product + p0;
  BOOST_REQUIRE_MESSAGE(bits(fused) != bits(unfused), "the operands do not tell fused from unfused");
  SgdArgs a{};
  a.neg_lr = neg_lr;
  a.first_step = true;
  float p = p0;
  kmath::sgd_element(p, g, nullptr, a);
  require_same(fused, p, "kernel_math SGD element (always fused)");

  OptimizerConfig config;
  config.kind = fsdp::OptimizerKind::sgd;
  config.lr = lr;
  const float got = run_real(config, {p0}, {{g}}, lr).at(0).at(0);
  if (kBuildFusesMadd) {
    BOOST_TEST_MESSAGE("FP_FAST_FMAF: optimizer madd is fmaf, kernel_math matches bitwise");
    require_same(fused, got, "optimizer SGD step (FP_FAST_FMAF build: madd is fmaf)");
  } else {
    BOOST_TEST_MESSAGE("no FP_FAST_FMAF: optimizer madd is a * b + c, here "
                       << (bits(got) == bits(fused) ? "contracted by the compiler (fused)" : "rounded twice"));
    BOOST_TEST((bits(got) == bits(fused) || bits(got) == bits(unfused)),
               "optimizer SGD step gave " << got << ", neither fused " << fused << " nor unfused " << unfused);
  }
}

BOOST_AUTO_TEST_CASE(sgd_element_equals_optimizer, *boost::unit_test::precondition(build_fuses_madd)) {
  auto p0 = random_params(kElements, 1);
  auto grads = random_grads(kSteps, kElements, 2);
  const double lr = 0.05;
  struct Case {
    double momentum, dampening, weight_decay;
    bool nesterov;
  };
  for (Case c : {Case{0, 0, 0, false}, Case{0, 0, 1e-2, false}, Case{0.9, 0, 0, false}, Case{0.9, 0.1, 1e-3, false},
                 Case{0.9, 0, 1e-2, true}, Case{0.5, 0, 0, true}}) {
    OptimizerConfig config;
    config.kind = fsdp::OptimizerKind::sgd;
    config.lr = lr;
    config.momentum = c.momentum;
    config.dampening = c.dampening;
    config.weight_decay = c.weight_decay;
    config.nesterov = c.nesterov;
    auto expected = run_real(config, p0, grads, lr);
    std::vector<float> p = p0, buf(kElements, 0.0f);
    for (int s = 0; s < kSteps; ++s) {
      SgdArgs a{};
      a.weight_decay = float(c.weight_decay);
      a.momentum = float(c.momentum);
      a.keep = float(1 - c.dampening);
      a.neg_lr = float(-lr);
      a.has_weight_decay = c.weight_decay != 0;
      a.has_momentum = c.momentum != 0;
      a.first_step = s == 0;
      a.nesterov = c.nesterov;
      for (size_t i = 0; i < kElements; ++i)
        kmath::sgd_element(p[i], grads[s][i], a.has_momentum ? &buf[i] : nullptr, a);
      require_params(expected[s], p, s, "sgd");
    }
  }
}

BOOST_AUTO_TEST_CASE(adadelta_element_equals_optimizer, *boost::unit_test::precondition(build_fuses_madd)) {
  auto p0 = random_params(kElements, 3);
  auto grads = random_grads(kSteps, kElements, 4);
  for (double wd : {0.0, 0.05}) {
    for (double lr : {1.0, 0.3}) {
      OptimizerConfig config;
      config.kind = fsdp::OptimizerKind::adadelta;
      config.lr = lr;
      config.weight_decay = wd;
      config.rho = 0.9;
      config.eps = 1e-6;
      auto expected = run_real(config, p0, grads, lr);
      std::vector<float> p = p0, sq(kElements, 0.0f), acc(kElements, 0.0f);
      AdadeltaArgs a{};
      a.weight_decay = float(wd);
      a.rho = float(config.rho);
      a.one_minus_rho = float(1 - config.rho);
      a.eps = float(config.eps);
      a.neg_lr = float(-lr);
      a.has_weight_decay = wd != 0;
      for (int s = 0; s < kSteps; ++s) {
        for (size_t i = 0; i < kElements; ++i) kmath::adadelta_element(p[i], grads[s][i], sq[i], acc[i], a);
        require_params(expected[s], p, s, "adadelta");
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(adamw_element_equals_optimizer, *boost::unit_test::precondition(build_fuses_madd)) {
  auto p0 = random_params(kElements, 5);
  auto grads = random_grads(kSteps, kElements, 6);
  for (double wd : {0.0, 0.01, 0.1}) {
    const double lr = 1e-3;
    OptimizerConfig config;
    config.kind = fsdp::OptimizerKind::adamw;
    config.lr = lr;
    config.weight_decay = wd;
    config.eps = 1e-8;
    config.beta1 = 0.9;
    config.beta2 = 0.999;
    auto expected = run_real(config, p0, grads, lr);
    std::vector<float> p = p0, m(kElements, 0.0f), v(kElements, 0.0f);
    for (int s = 0; s < kSteps; ++s) {
      const auto step = double(s + 1);
      const double bc1 = 1 - std::pow(config.beta1, step), bc2 = 1 - std::pow(config.beta2, step);
      AdamWArgs a{};
      a.decay = float(1 - lr * wd);
      a.beta1 = float(config.beta1);
      a.one_minus_beta1 = float(1 - config.beta1);
      a.beta2 = float(config.beta2);
      a.one_minus_beta2 = float(1 - config.beta2);
      a.bias_correction2_sqrt = float(std::sqrt(bc2));
      a.eps = float(config.eps);
      a.neg_step_size = float(-(lr / bc1));
      a.has_weight_decay = wd != 0;
      for (size_t i = 0; i < kElements; ++i) kmath::adamw_element(p[i], grads[s][i], m[i], v[i], a);
      require_params(expected[s], p, s, "adamw");
    }
  }
}
