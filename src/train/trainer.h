#pragma once
// The training driver: builds model, data, optimizer from a Config and runs the loop —
// forward, backward, clip, step, schedule, evaluate, report. Reads top-down in trainer.cpp.
#include <cstdint>
#include <string>

namespace fsdp {

struct Config;
class Communicator;

struct RunEnv {
  int rank = 0;
  int world_size = 1;
  Communicator* world = nullptr;  // comm.backend over all ranks; null for in-process single-rank runs
};

struct TrainSummary {
  int64_t steps = 0;
  double last_loss = 0.0;
  double eval_loss = -1.0;      // -1 when no evaluation ran
  double eval_accuracy = -1.0;
  double samples_per_s = 0.0;   // mean over the run, excluding the first step
};

TrainSummary train(const Config& config, const RunEnv& env);

}  // namespace fsdp
