#pragma once
// The run's schedule as events: the training steps, the evaluations and periodic saves between
// them, and the closing evaluation, save and weights. Trainer::run executes every event;
// Trainer::plan executes the same events filtered to the shortest sequence that reaches every
// memory peak the run reaches (PlanFilter), so the plan cannot drift from what the run does.
#include <cstdint>
#include <functional>

#include "config/config.h"  // EvalEvery

namespace fsdp {

struct RunEvent {
  enum class Kind {
    step,            // training step `step` (0-based)
    evaluate,        // train.eval_every after `step` steps (step: steps done)
    save,            // checkpoint.every_steps after `step` steps
    close_evaluate,  // the end of training: an evaluation unless one just ran
    close_save,      // the end of the launch: a checkpoint unless one was just written
    save_weights,    // output.save_weights
  };
  Kind kind;
  int64_t step;
};

struct RunScheduleFacts {
  int64_t start_step = 0;  // the first step of this launch (a resumed run's)
  int64_t end_step = 0;    // one past its last (stop_after_steps may end it early)
  int64_t total_steps = 0;
  int64_t steps_per_epoch = 1;
  EvalEvery eval_every;
  int64_t save_every_steps = 0;  // checkpoint.every_steps; 0: none
  bool saves = false;            // checkpoint.dir set
  bool save_weights = false;     // output.save_weights set
};

// Calls fn with each event in the order the run meets them.
void for_each_run_event(const RunScheduleFacts& f, const std::function<void(const RunEvent&)>& fn);

// Which events a memory plan executes: two steps (the second gathers while the first's buffers
// are alive: the steady state), the first evaluation, a step after it and a second evaluation
// (activation buffers change shape both ways), the first periodic save, and the closing events.
class PlanFilter {
 public:
  bool wanted(const RunEvent& e);

 private:
  int64_t steps_ = 0, evaluations_ = 0, saves_ = 0;
  bool step_since_evaluation_ = false;
};

}  // namespace fsdp
