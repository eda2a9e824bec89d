#pragma once
// The optimizer's and the LR schedule's settings (train.optimizer, train.scheduler), apart from
// the rest of Config: optim/ takes these and nothing else of the input file.
#include <cstdint>

#include "optim/kinds.h"

namespace fsdp {

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::adadelta;
  double lr = 1.0;
  double momentum = 0.0;      // sgd
  double dampening = 0.0;     // sgd
  bool nesterov = false;      // sgd
  double weight_decay = 0.0;  // all (adamw default 0.01 when not given)
  double rho = 0.9;           // adadelta
  double eps = 1e-6;          // adadelta 1e-6, adamw 1e-8 when not given
  double beta1 = 0.9;         // adamw
  double beta2 = 0.999;       // adamw
};

struct SchedulerConfig {
  SchedulerKind kind = SchedulerKind::none;
  int64_t step_size = 1;     // step: epochs between decays
  double gamma = 0.7;        // step
  int64_t warmup_steps = 0;  // cosine: linear warmup from 0
  int64_t total_steps = 0;   // cosine: 0 = the run's total steps
  double min_lr = 0.0;       // cosine floor
};

}  // namespace fsdp
