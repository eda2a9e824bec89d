#pragma once
// The trainer's state, shared by the files that implement Trainer: trainer.cpp (set-up, the
// step, the loop, the plan), save_resume.cpp (checkpoints and weights), banner.cpp and
// evaluate.cpp. Not for other users.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "config/config.h"
#include "data/data.h"
#include "fsdp/fsdp.h"
#include "fsdp/trace.h"
#include "models/model.h"
#include "optim/optim.h"
#include "tensor/device.h"
#include "tensor/memory.h"
#include "train/batches.h"
#include "train/communicators.h"
#include "train/metrics.h"
#include "train/plan.h"
#include "train/progress.h"
#include "train/trace_file.h"
#include "train/trainer.h"

namespace fsdp {

// f16 dynamic loss scaling, torch.cuda.amp.GradScaler's rule, for f16 parameters or reductions:
// start at init_loss_scale (2^16 by default), halve and skip the step on an overflow, double
// after 2000 good steps in a row.
struct LossScaler {
  bool enabled = false;
  double scale = 65536.0;
  int64_t good_steps = 0;
  // Returns whether the optimizer may step; unscales the gradients when it may.
  bool update(FsdpEngine& engine) {
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
};

// What run() keeps between its named calls.
struct Progress {
  std::unique_ptr<MetricsFile> metrics;  // rank 0 writes; disabled elsewhere
  bool tty = false;                      // progress bars (rank 0 on a terminal)
  std::unique_ptr<ProgressBar> bar;      // the current epoch's, on a terminal
  TrainSummary summary;
  double lr = 0.0;
  double timed_s = 0.0;  // steps after the first (which pays for allocations)
  int64_t timed_samples = 0;
  int64_t last_eval_step = -1, last_saved_step = -1;
};

struct Trainer::State {
  // A copy (the caller's Config may be gone before run()); model.attention: auto is resolved in it
  // (prepare), and attention_note says how.
  Config c;
  std::string attention_note;
  RunEnv env;
  MemoryTracker mem;
  std::unique_ptr<DeviceRuntime> runtime;  // train.device: where tensors live, kernels run
  // The world when env.world is null, and a device run's data-plane world (train/communicators.h):
  // FSDP's shard and replicate groups split from the device world, or from the world on a cpu run.
  RunCommunicators comms;
  Datasets data;
  std::unique_ptr<Model> model;
  // output.trace (and NVTX ranges on a device); declared before the engine, which holds it.
  std::unique_ptr<Tracer> tracer;
  TraceClock trace_clock;
  std::unique_ptr<FsdpEngine> engine;
  std::unique_ptr<Optimizer> optimizer;
  int64_t micro_global = 0, global_batch = 0, steps_per_epoch = 0, total_steps = 0;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<LrSchedule> schedule;
  LossScaler scaler;
  BatchBuffers batch, dev_batch;  // this rank's micro-batch: host, and its copy on a device
  std::vector<int> node_colors;   // every rank's node_color, in world order
  MemoryPlan plan;                // predicted per-rank peaks, reported next to the measured ones
  // Checkpoints: where this launch starts and what save_best compares against.
  bool resumed = false;
  int64_t start_step = 0;
  double best_eval_loss = -1.0;
  std::string resume_note;  // printed by rank 0 when the run starts
  std::string last_good;    // the checkpoint resumed from or last written ("" when none)
  Progress progress;        // run(): reporting, evaluation and checkpoint state
  State(const Config& config, int world_size) : c(for_world_size(config, world_size)) {}
};

}  // namespace fsdp
