#pragma once
// What rank 0 prints when a run starts: the model, strategy, backend, data and schedule, and the
// mesh line (the nodes MPI found, each named by its first rank's host, and the groups made of
// them). Collective: every rank calls it (the host names are gathered).
#include <cstdint>
#include <vector>

namespace fsdp {

struct Config;
struct RunEnv;
class FsdpEngine;
class Model;

struct RunDescription {
  const Config& config;
  const RunEnv& env;
  Model& model;  // num_params() walks the tree
  const FsdpEngine& engine;
  int64_t train_samples = 0, eval_samples = 0;
  int64_t total_steps = 0, steps_per_epoch = 0;
  const std::vector<int>& node_colors;  // every rank's, in world order
};

void print_banner(const RunDescription& run);

// Whether progress may redraw one line: rank 0 on a terminal, and not under a launcher.
bool interactive_terminal();

}  // namespace fsdp
