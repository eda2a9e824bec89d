// SGD, Adadelta and AdamW as torch 1.13's _single_tensor_* functions compute them, fused into
// one pass per step. Every tensor op there rounds to f32 and every Python-float scalar is cast
// to f32 when it meets a tensor, so each element here follows the same sequence of f32
// roundings; scalars that torch derives in Python (bias corrections, step size) are doubles.
#include <cmath>
#include <string>
#include <type_traits>
#include <utility>

#include "config/config.h"
#include "optim/optim.h"
#include "tensor/error.h"

namespace fsdp {
namespace {

// Below this many elements the OpenMP fork/join costs more than the update itself.
constexpr int64_t kParallelMin = 1 << 16;

// torch's AVX2 kernels evaluate `self + alpha * other` (add_ with alpha, addcmul_) as one
// fused multiply-add, vector body and scalar tail alike. Fuse exactly there when FMA is an
// instruction (-march=native builds): bit-identical to torch. Elsewhere a libm fmaf call would
// cost far more than the one-rounding difference it removes. An explicit fmaf also keeps the
// compiler from contracting the *other* products into adds, which torch rounds separately.
inline float madd(float a, float b, float c) {
#ifdef FP_FAST_FMAF
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

// Each element's math is independent of the others and of the thread split, so threading never
// changes results. f is a by-value lambda of pointers and scalars: each thread's private copy
// keeps them in registers rather than reloaded through a shared reference every element.
// (std::sqrt loops only vectorize under -fno-math-errno; sqrt is exact either way, so that
// flag changes speed, not values.)
template <class F>
void parallel_for(int64_t n, F f) {
#pragma omp parallel for simd if (n >= kParallelMin) firstprivate(f)
  for (int64_t i = 0; i < n; ++i) f(i);
}

// Calls f with one std::bool_constant per flag, so per-step options become `if constexpr`
// and the element loops stay branch-free.
template <class F>
void dispatch(F&& f) {
  f();
}
template <class F, class... Flags>
void dispatch(F&& f, bool flag, Flags... rest) {
  if (flag)
    dispatch([&](auto... c) { f(std::true_type{}, c...); }, rest...);
  else
    dispatch([&](auto... c) { f(std::false_type{}, c...); }, rest...);
}

Tensor state_tensor(int64_t numel, MemoryTracker* tracker) {
  return Tensor::zeros({numel}, DType::f32, MemCategory::optim, tracker);
}

class OptimizerBase : public Optimizer {
 protected:
  OptimizerBase(OptimizerConfig config, int64_t numel) : c_(std::move(config)), numel_(numel) {}
  void check(std::span<float> params, std::span<const float> grads) const {
    auto n = static_cast<size_t>(numel_);
    if (params.size() != n || grads.size() != n)
      throw Error(c_.kind + " step: " + std::to_string(params.size()) + " params and " + std::to_string(grads.size()) +
                  " grads for an optimizer of " + std::to_string(numel_) + " elements");
  }
  OptimizerConfig c_;
  int64_t numel_;
};

class Sgd final : public OptimizerBase {
 public:
  Sgd(const OptimizerConfig& config, int64_t numel, MemoryTracker* tracker) : OptimizerBase(config, numel) {
    if (c_.momentum != 0) buf_ = state_tensor(numel, tracker);  // torch keeps none without momentum
  }

  void step(std::span<float> params, std::span<const float> grads, double lr) override {
    check(params, grads);
    // torch's buffer is None until the first step, which clones d_p into it instead of
    // decaying; step_count (restored with the buffer from checkpoints) stands in for None.
    const bool first = step_count_++ == 0;
    float* p = params.data();
    const float* g = grads.data();
    float* buf = buf_.defined() ? buf_.f32() : nullptr;
    const float wd = float(c_.weight_decay), mom = float(c_.momentum);
    const float keep = float(1 - c_.dampening), neg_lr = float(-lr);
    dispatch(
        [&](auto has_wd, auto has_mom, auto is_first, auto nesterov) {
          parallel_for(numel_, [=](int64_t i) {
            float d = g[i];
            if constexpr (has_wd) d = madd(wd, p[i], d);  // d_p.add(param, alpha=wd)
            if constexpr (has_mom) {
              float b = d;                                               // the first step clones d_p into the buffer
              if constexpr (!is_first) b = madd(keep, d, buf[i] * mom);  // buf.mul_(momentum).add_(d_p, alpha=1-damp)
              buf[i] = b;
              if constexpr (nesterov)
                d = madd(mom, b, d);  // d_p.add(buf, alpha=momentum)
              else
                d = b;
            }
            p[i] = madd(neg_lr, d, p[i]);  // param.add_(d_p, alpha=-lr)
          });
        },
        c_.weight_decay != 0, buf != nullptr, first, c_.nesterov);
  }

  std::vector<std::pair<std::string, Tensor*>> state() override {
    if (!buf_.defined()) return {};
    return {{"momentum_buffer", &buf_}};
  }

 private:
  Tensor buf_;
};

class Adadelta final : public OptimizerBase {
 public:
  Adadelta(const OptimizerConfig& config, int64_t numel, MemoryTracker* tracker)
      : OptimizerBase(config, numel),
        square_avg_(state_tensor(numel, tracker)),
        acc_delta_(state_tensor(numel, tracker)) {}

  void step(std::span<float> params, std::span<const float> grads, double lr) override {
    check(params, grads);
    ++step_count_;
    float* p = params.data();
    const float* g = grads.data();
    float* sq = square_avg_.f32();
    float* acc = acc_delta_.f32();
    const float wd = float(c_.weight_decay), rho = float(c_.rho), one_m_rho = float(1 - c_.rho);
    const float eps = float(c_.eps), neg_lr = float(-lr);
    dispatch(
        [&](auto has_wd) {
          parallel_for(numel_, [=](int64_t i) {
            float gi = g[i];
            if constexpr (has_wd) gi = madd(wd, p[i], gi);  // grad.add(param, alpha=wd)
            // square_avg.mul_(rho).addcmul_(grad, grad, value=1-rho)
            const float s = madd(one_m_rho * gi, gi, sq[i] * rho);
            sq[i] = s;
            // std = square_avg.add(eps).sqrt_()
            // delta = acc_delta.add(eps).sqrt_().div_(std).mul_(grad)
            const float delta = std::sqrt(acc[i] + eps) / std::sqrt(s + eps) * gi;
            // acc_delta.mul_(rho).addcmul_(delta, delta, value=1-rho)
            acc[i] = madd(one_m_rho * delta, delta, acc[i] * rho);
            p[i] = madd(neg_lr, delta, p[i]);  // param.add_(delta, alpha=-lr)
          });
        },
        c_.weight_decay != 0);
  }

  std::vector<std::pair<std::string, Tensor*>> state() override {
    return {{"square_avg", &square_avg_}, {"acc_delta", &acc_delta_}};
  }

 private:
  Tensor square_avg_, acc_delta_;
};

class AdamW final : public OptimizerBase {
 public:
  AdamW(const OptimizerConfig& config, int64_t numel, MemoryTracker* tracker)
      : OptimizerBase(config, numel),
        exp_avg_(state_tensor(numel, tracker)),
        exp_avg_sq_(state_tensor(numel, tracker)) {}

  void step(std::span<float> params, std::span<const float> grads, double lr) override {
    check(params, grads);
    const auto step = double(++step_count_);  // torch: state['step'] += 1 before the update
    float* p = params.data();
    const float* g = grads.data();
    float* m = exp_avg_.f32();
    float* v = exp_avg_sq_.f32();
    const double b1 = c_.beta1, b2 = c_.beta2;
    const double bias_correction1 = 1 - std::pow(b1, step);
    const double bias_correction2 = 1 - std::pow(b2, step);
    const float decay = float(1 - lr * c_.weight_decay);
    const float fb1 = float(b1), one_m_b1 = float(1 - b1);
    const float fb2 = float(b2), one_m_b2 = float(1 - b2);
    const float bc2_sqrt = float(std::sqrt(bias_correction2)), eps = float(c_.eps);
    const float neg_step_size = float(-(lr / bias_correction1));
    dispatch(
        [&](auto has_wd) {
          parallel_for(numel_, [=](int64_t i) {
            float pi = p[i];
            if constexpr (has_wd) pi = pi * decay;  // param.mul_(1 - lr*wd)
            const float gi = g[i];
            const float mi = madd(one_m_b1, gi, m[i] * fb1);       // mul_(b1).add_(g, alpha=1-b1)
            const float vi = madd(one_m_b2 * gi, gi, v[i] * fb2);  // mul_(b2).addcmul_(g, g, 1-b2)
            m[i] = mi;
            v[i] = vi;
            const float denom = std::sqrt(vi) / bc2_sqrt + eps;  // (sq.sqrt() / bc2_sqrt).add_(eps)
            // addcdiv_(m, denom, value=-step_size) is an unfused add; madd(x, 1, pi) rounds the
            // same while stopping the compiler from fusing the decay product into it.
            p[i] = madd(neg_step_size * mi / denom, 1.0f, pi);
          });
        },
        c_.weight_decay != 0);
  }

  std::vector<std::pair<std::string, Tensor*>> state() override {
    return {{"exp_avg", &exp_avg_}, {"exp_avg_sq", &exp_avg_sq_}};
  }

 private:
  Tensor exp_avg_, exp_avg_sq_;
};

// Unknown kinds, and the range checks torch's constructors make, so a bad value fails here
// rather than as NaNs later.
void validate(const OptimizerConfig& c) {
  auto require = [&](bool ok, const std::string& what) {
    if (!ok) throw Error("optimizer " + c.kind + ": " + what);
  };
  if (c.kind == "sgd") {
    require(c.momentum >= 0, "momentum must be >= 0");
    require(!c.nesterov || (c.momentum > 0 && c.dampening == 0), "nesterov requires momentum > 0 and dampening == 0");
  } else if (c.kind == "adadelta") {
    require(c.rho >= 0 && c.rho <= 1, "rho must be in [0, 1]");
  } else if (c.kind == "adamw") {
    require(c.beta1 >= 0 && c.beta1 < 1, "beta1 must be in [0, 1)");
    require(c.beta2 >= 0 && c.beta2 < 1, "beta2 must be in [0, 1)");
  } else {
    throw Error("unknown optimizer kind '" + c.kind + "' (sgd | adadelta | adamw)");
  }
  require(c.lr >= 0, "lr must be >= 0");
  require(c.weight_decay >= 0, "weight_decay must be >= 0");
  require(c.eps >= 0, "eps must be >= 0");
}

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, int64_t numel, MemoryTracker* tracker) {
  validate(config);
  if (config.kind == "sgd") return std::make_unique<Sgd>(config, numel, tracker);
  if (config.kind == "adadelta") return std::make_unique<Adadelta>(config, numel, tracker);
  return std::make_unique<AdamW>(config, numel, tracker);
}

}  // namespace fsdp
