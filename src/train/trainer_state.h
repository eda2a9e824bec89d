#pragma once
// The trainer's state, shared by the files that implement Trainer: trainer.cpp (set-up, the
// step, the loop, the plan) and save_resume.cpp (checkpoints and weights). Not for other users.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "config/config.h"
#include "data/data.h"
#include "fsdp/fsdp.h"
#include "models/model.h"
#include "optim/optim.h"
#include "tensor/device.h"
#include "tensor/memory.h"
#include "train/batches.h"
#include "train/communicators.h"
#include "train/loss_scaler.h"
#include "train/metrics.h"
#include "train/plan.h"
#include "train/progress.h"
#include "train/trainer.h"

namespace fsdp {

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
  const Config c;  // a copy: the caller's Config may be gone before run()
  RunEnv env;
  MemoryTracker mem;
  std::unique_ptr<DeviceRuntime> runtime;  // train.device: where tensors live, kernels run
  // The world when env.world is null, and a device run's data-plane world (train/communicators.h):
  // FSDP's shard and replicate groups split from the device world, or from the world on a cpu run.
  RunCommunicators comms;
  Datasets data;
  std::unique_ptr<Model> model;
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
