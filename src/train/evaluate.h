#pragma once
// Evaluation: each rank runs its slice of every eval batch through the FSDP hooks (units are
// gathered as in training); the sums are added over all ranks at the end.
#include <cstdint>
#include <string>

namespace fsdp {

class Dataset;
class FsdpEngine;
class MemoryTracker;
class Model;

struct EvalResult {
  double loss = 0.0, accuracy = 0.0;
};

struct EvalOptions {
  int64_t batch_size = 1000;  // per rank (train.eval_batch_size)
  uint64_t seed = 1;
  int rank = 0, world_size = 1;
  bool progress = false;  // a bar on this rank's terminal
};

EvalResult evaluate(Model& model, FsdpEngine& engine, const Dataset& data, const EvalOptions& options,
                    MemoryTracker& mem);

}  // namespace fsdp
