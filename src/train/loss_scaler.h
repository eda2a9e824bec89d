#pragma once
// f16 dynamic loss scaling.
#include <cstdint>

namespace fsdp {

class FsdpEngine;

// torch.cuda.amp.GradScaler's rule, for f16 parameters or reductions: start at init_loss_scale
// (2^16 by default), halve and skip the step on an overflow, double after 2000 good steps in a
// row.
struct LossScaler {
  bool enabled = false;
  double scale = 65536.0;
  int64_t good_steps = 0;
  // Returns whether the optimizer may step; unscales the gradients when it may.
  bool update(FsdpEngine& engine);
};

}  // namespace fsdp
