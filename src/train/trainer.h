#pragma once
// The training driver: builds data, model, process mesh, FSDP engine and optimizer from a Config
// (the set-up phase, which touches no training collective, so a failure there can be agreed on
// by all ranks and reported once) and then runs the loop — forward, backward, reduce, clip,
// step, schedule, evaluate, report (the run phase). Reads top-down in trainer.cpp.
#include <cstdint>
#include <memory>
#include <string>

namespace fsdp {

struct Config;
class Communicator;

struct RunEnv {
  int rank = 0;
  int world_size = 1;
  Communicator* world = nullptr;  // comm.backend over all ranks; null: a local one-rank run
  int node_color = 0;             // equal on ranks of one node (hybrid sharding)
  int local_rank = 0;             // rank within the node
};

struct TrainSummary {
  int64_t steps = 0;
  double last_loss = 0.0;
  double eval_loss = -1.0;      // -1 when no evaluation ran
  double eval_accuracy = -1.0;
  double samples_per_s = 0.0;   // mean over the run, excluding the first step
};

class Trainer {
 public:
  Trainer(const Config& config, const RunEnv& env);  // set-up phase
  ~Trainer();
  TrainSummary run();                                  // run phase

 private:
  struct State;
  std::unique_ptr<State> s_;
};

TrainSummary train(const Config& config, const RunEnv& env);

}  // namespace fsdp
