// Learning-rate schedules, in double like the Python floats torch's schedulers produce.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "optim/optim.h"
#include "optim/optimizer_config.h"
#include "tensor/error.h"

namespace fsdp {

LrSchedule::LrSchedule(const SchedulerConfig& config, double base_lr, int64_t total_steps)
    : kind_(config.kind),
      base_lr_(base_lr),
      gamma_(config.gamma),
      min_lr_(config.min_lr),
      step_size_(config.step_size),
      warmup_steps_(config.warmup_steps),
      total_steps_(config.total_steps > 0 ? config.total_steps : total_steps) {
  if (kind_ == SchedulerKind::step && step_size_ < 1) throw Error("scheduler step_size must be >= 1");
  if (kind_ == SchedulerKind::cosine && warmup_steps_ < 0) throw Error("scheduler warmup_steps must be >= 0");
}

double LrSchedule::lr(int64_t step, int64_t epoch) const {
  if (kind_ == SchedulerKind::step) {
    // StepLR.step() without an epoch argument (the MNIST example) multiplies the current lr by
    // gamma at each decay; repeating that product, rather than base * pow(gamma, k), keeps the
    // value bit-identical to torch's.
    double lr = base_lr_;
    for (int64_t k = epoch / step_size_; k > 0; --k) lr *= gamma_;
    return lr;
  }
  if (kind_ == SchedulerKind::cosine) {
    // step < W:  base * (step + 1) / W                     (reaches base on the last warmup step)
    // else:      t = min((step - W) / max(T - W, 1), 1)
    //            base - (base - min) * (1 - cos(pi * t)) / 2
    // This is CosineAnnealingLR's min + (base - min) * (1 + cos(pi t)) / 2, written so that
    // step == W gives exactly base; the last step (T - 1) is one decay step short of min, and
    // steps past T stay at min.
    if (step < warmup_steps_) return base_lr_ * double(step + 1) / double(warmup_steps_);
    const double decay_steps = double(std::max<int64_t>(total_steps_ - warmup_steps_, 1));
    const double t = std::min(double(step - warmup_steps_) / decay_steps, 1.0);
    return base_lr_ - (base_lr_ - min_lr_) * (1 - std::cos(std::numbers::pi * t)) / 2;
  }
  return base_lr_;
}

}  // namespace fsdp
