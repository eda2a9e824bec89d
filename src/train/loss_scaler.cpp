#include "train/loss_scaler.h"

#include "fsdp/fsdp.h"

namespace fsdp {

bool LossScaler::update(FsdpEngine& engine) {
  if (!enabled) return true;
  if (!engine.grads_finite()) {
    scale *= 0.5;
    good_steps = 0;
    return false;
  }
  engine.scale_grads(static_cast<float>(1.0 / scale));
  if (++good_steps == 2000) {
    scale *= 2.0;
    good_steps = 0;
  }
  return true;
}

}  // namespace fsdp
