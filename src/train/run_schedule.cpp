#include "train/run_schedule.h"

namespace fsdp {

void for_each_run_event(const RunScheduleFacts& f, const std::function<void(const RunEvent&)>& fn) {
  int64_t last_evaluation = -1, last_save = -1;
  for (int64_t step = f.start_step; step < f.end_step; ++step) {
    fn({RunEvent::Kind::step, step});
    const int64_t done = step + 1;
    const bool epoch_end = step % f.steps_per_epoch == f.steps_per_epoch - 1;
    if (f.eval_every.due(done, epoch_end)) {
      fn({RunEvent::Kind::evaluate, done});
      last_evaluation = done;
    }
    if (f.saves && f.save_every_steps > 0 && done % f.save_every_steps == 0) {
      fn({RunEvent::Kind::save, done});
      last_save = done;
    }
  }
  // The closing evaluation belongs to the end of training, not to a launch that stops early.
  const bool finished = f.end_step == f.total_steps;
  if (finished && !f.eval_every.never() && f.total_steps > 0 && last_evaluation != f.end_step)
    fn({RunEvent::Kind::close_evaluate, f.end_step});
  if (f.saves && f.end_step > f.start_step && last_save != f.end_step) fn({RunEvent::Kind::close_save, f.end_step});
  if (f.save_weights) fn({RunEvent::Kind::save_weights, f.end_step});
}

bool PlanFilter::wanted(const RunEvent& e) {
  switch (e.kind) {
    case RunEvent::Kind::step:
      if (steps_ >= 2 && !(evaluations_ == 1 && !step_since_evaluation_)) return false;
      ++steps_;
      step_since_evaluation_ = evaluations_ > 0;
      return true;
    case RunEvent::Kind::evaluate:
    case RunEvent::Kind::close_evaluate:
      if (evaluations_ >= 2 || (evaluations_ == 1 && !step_since_evaluation_)) return false;
      ++evaluations_;
      step_since_evaluation_ = false;
      return true;
    case RunEvent::Kind::save: return saves_++ == 0;
    case RunEvent::Kind::close_save:
    case RunEvent::Kind::save_weights: return true;
  }
  return false;
}

}  // namespace fsdp
