// SGD, Adadelta and AdamW as torch 1.13's _single_tensor_* functions compute them, fused into
// one kernel per step (Kernels::adamw_step, ...: the element loops live in tensor/cpu_kernels.cpp
// and tensor/cuda/). Every tensor op there rounds to f32 and every Python-float scalar is cast to
// f32 when it meets a tensor, so the scalars are computed here exactly as torch's Python does
// (doubles: bias corrections, step size) and rounded to f32 once, on the host.
#include <cmath>
#include <string>
#include <utility>

#include "optim/optim.h"
#include "optim/optimizer_config.h"
#include "tensor/device.h"
#include "tensor/error.h"
#include "tensor/kernels.h"

namespace fsdp {
namespace {

// Where the state lives and the update runs: host memory charged to a tracker with the host
// kernels, or a DeviceRuntime's memory with its kernels.
struct StateAlloc {
  Kernels& kernels;
  MemoryTracker* tracker = nullptr;
  DeviceRuntime* runtime = nullptr;
  Tensor zeros(int64_t numel) const {
    if (runtime) return Tensor::zeros(*runtime, {numel}, DType::f32, MemCategory::optim);
    return Tensor::zeros({numel}, DType::f32, MemCategory::optim, tracker);
  }
};

class OptimizerBase : public Optimizer {
 protected:
  OptimizerBase(const OptimizerConfig& config, int64_t numel, Kernels& kernels)
      : c_(config), numel_(numel), kernels_(kernels) {}
  // The slices must tile [0, numel) in order: a gap would leave elements without an update.
  void check(std::span<float> params, std::span<const GradSlice> grads) const {
    int64_t next = 0;
    bool tiled = true;
    for (const GradSlice& g : grads) {
      tiled = tiled && g.offset == next;
      next = g.offset + static_cast<int64_t>(g.grads.size());
    }
    if (params.size() != static_cast<size_t>(numel_) || next != numel_ || !tiled)
      throw Error(std::string(enum_name(c_.kind)) + " step: " + std::to_string(params.size()) + " params and " +
                  std::to_string(next) + " grads" + (tiled ? "" : " in slices that leave gaps") +
                  " for an optimizer of " + std::to_string(numel_) + " elements");
  }
  static int64_t size(const GradSlice& g) { return static_cast<int64_t>(g.grads.size()); }
  OptimizerConfig c_;
  int64_t numel_;
  Kernels& kernels_;
};

class Sgd final : public OptimizerBase {
 public:
  Sgd(const OptimizerConfig& config, int64_t numel, const StateAlloc& alloc)
      : OptimizerBase(config, numel, alloc.kernels) {
    if (c_.momentum != 0) buf_ = alloc.zeros(numel);  // torch keeps none without momentum
  }

  void step(std::span<float> params, std::span<const GradSlice> grads, double lr) override {
    check(params, grads);
    // torch's buffer is None until the first step, which clones d_p into it instead of
    // decaying; step_count (restored with the buffer from checkpoints) stands in for None.
    const bool first = step_count_++ == 0;
    SgdArgs a{};
    a.weight_decay = float(c_.weight_decay);
    a.momentum = float(c_.momentum);
    a.keep = float(1 - c_.dampening);
    a.neg_lr = float(-lr);
    a.has_weight_decay = c_.weight_decay != 0;
    a.has_momentum = buf_.defined();
    a.first_step = first;
    a.nesterov = c_.nesterov;
    for (const GradSlice& g : grads)
      kernels_.sgd_step(params.data() + g.offset, g.grads.data(), buf_.defined() ? buf_.f32() + g.offset : nullptr,
                        size(g), a);
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
  Adadelta(const OptimizerConfig& config, int64_t numel, const StateAlloc& alloc)
      : OptimizerBase(config, numel, alloc.kernels), square_avg_(alloc.zeros(numel)), acc_delta_(alloc.zeros(numel)) {}

  void step(std::span<float> params, std::span<const GradSlice> grads, double lr) override {
    check(params, grads);
    ++step_count_;
    AdadeltaArgs a{};
    a.weight_decay = float(c_.weight_decay);
    a.rho = float(c_.rho);
    a.one_minus_rho = float(1 - c_.rho);
    a.eps = float(c_.eps);
    a.neg_lr = float(-lr);
    a.has_weight_decay = c_.weight_decay != 0;
    for (const GradSlice& g : grads)
      kernels_.adadelta_step(params.data() + g.offset, g.grads.data(), square_avg_.f32() + g.offset,
                             acc_delta_.f32() + g.offset, size(g), a);
  }

  std::vector<std::pair<std::string, Tensor*>> state() override {
    return {{"square_avg", &square_avg_}, {"acc_delta", &acc_delta_}};
  }

 private:
  Tensor square_avg_, acc_delta_;
};

class AdamW final : public OptimizerBase {
 public:
  AdamW(const OptimizerConfig& config, int64_t numel, const StateAlloc& alloc)
      : OptimizerBase(config, numel, alloc.kernels), exp_avg_(alloc.zeros(numel)), exp_avg_sq_(alloc.zeros(numel)) {}

  void step(std::span<float> params, std::span<const GradSlice> grads, double lr) override {
    check(params, grads);
    const auto step = double(++step_count_);  // torch: state['step'] += 1 before the update
    const double b1 = c_.beta1, b2 = c_.beta2;
    const double bias_correction1 = 1 - std::pow(b1, step);
    const double bias_correction2 = 1 - std::pow(b2, step);
    AdamWArgs a{};
    a.decay = float(1 - lr * c_.weight_decay);
    a.beta1 = float(b1);
    a.one_minus_beta1 = float(1 - b1);
    a.beta2 = float(b2);
    a.one_minus_beta2 = float(1 - b2);
    a.bias_correction2_sqrt = float(std::sqrt(bias_correction2));
    a.eps = float(c_.eps);
    a.neg_step_size = float(-(lr / bias_correction1));
    a.has_weight_decay = c_.weight_decay != 0;
    for (const GradSlice& g : grads)
      kernels_.adamw_step(params.data() + g.offset, g.grads.data(), exp_avg_.f32() + g.offset,
                          exp_avg_sq_.f32() + g.offset, size(g), a);
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
    if (!ok) throw Error("optimizer " + std::string(enum_name(c.kind)) + ": " + what);
  };
  if (c.kind == OptimizerKind::sgd) {
    require(c.momentum >= 0, "momentum must be >= 0");
    require(!c.nesterov || (c.momentum > 0 && c.dampening == 0), "nesterov requires momentum > 0 and dampening == 0");
  } else if (c.kind == OptimizerKind::adadelta) {
    require(c.rho >= 0 && c.rho <= 1, "rho must be in [0, 1]");
  } else {
    require(c.beta1 >= 0 && c.beta1 < 1, "beta1 must be in [0, 1)");
    require(c.beta2 >= 0 && c.beta2 < 1, "beta2 must be in [0, 1)");
  }
  require(c.lr >= 0, "lr must be >= 0");
  require(c.weight_decay >= 0, "weight_decay must be >= 0");
  require(c.eps >= 0, "eps must be >= 0");
}

std::unique_ptr<Optimizer> make_with(const OptimizerConfig& config, int64_t numel, const StateAlloc& alloc) {
  validate(config);
  if (config.kind == OptimizerKind::sgd) return std::make_unique<Sgd>(config, numel, alloc);
  if (config.kind == OptimizerKind::adadelta) return std::make_unique<Adadelta>(config, numel, alloc);
  return std::make_unique<AdamW>(config, numel, alloc);
}

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, int64_t numel, MemoryTracker* tracker) {
  return make_with(config, numel, StateAlloc{cpu_kernels(), tracker, nullptr});
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, int64_t numel, DeviceRuntime& runtime) {
  return make_with(config, numel, StateAlloc{runtime.kernels(), nullptr, &runtime});
}

}  // namespace fsdp
