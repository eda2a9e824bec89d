#pragma once
// The memory and communication plan of a run, predicted without training: what
// `fsdp_app INPUT.yaml --plan` prints, and what every run's metrics set beside the
// MemoryTracker's measured peaks. Per rank (rank 0, which gets the largest batch slices), by
// MemoryTracker category, for any world size — not only the one running.
//
// How: the plan builds the model (parameters have no storage until bound, so this is cheap)
// and the units by the wrap policy, then replays the run on shapes alone — the trainer's
// set-up and loop, the FSDP engine's unshard/reshard/post_backward logic and every layer's
// ensure() calls (Layer::plan_forward) — charging a MemoryTracker of its own. Its peaks are
// therefore the same quantities the real tracker reports: per-category peaks, and the peak
// of the total (not the sum of the category peaks, which may fall at different moments).
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/memory.h"

namespace fsdp {

struct Config;

struct PlanRequest {
  int world_size = 1;
  // HYBRID_SHARD*: ranks per shard group. 0: fsdp.hybrid.shard_group_size, and where that is 0
  // too (ranks per node, unknown to a plan), all ranks on one node.
  int shard_group_size = 0;
  // Dataset sizes in samples, when the caller has them (the trainer has loaded the data).
  // 0: derived where the config fixes them (synthetic; Fashion-MNIST 60000/10000), otherwise
  // assumed the worst case (full eval batches; a training step follows every evaluation).
  int64_t train_samples = 0;
  int64_t eval_samples = 0;
};

struct UnitPlan {
  std::string name;
  int64_t numel = 0;         // parameters in the unit
  int64_t padded_numel = 0;  // rounded up to a multiple of the shard group size N
  int64_t shard_numel = 0;   // padded_numel / N: what each rank keeps
};

// One collective kind over one training step (all micro-batches). Sizes follow nccl-tests:
// `bytes` sums each call's whole array (all_gather: the gathered output, reduce_scatter: the
// full input, all_reduce: the buffer); `wire_bytes` is what each rank sends, the bus bytes
// (all_gather and reduce_scatter: bytes * (n-1)/n, all_reduce: 2 * bytes * (n-1)/n over a
// group of n). Scalar all_reduces (the loss, the gradient norm) are left out.
struct CollectivePlan {
  int64_t calls = 0;
  int64_t bytes = 0;
  int64_t wire_bytes = 0;
  int group_size = 1;
};

struct MemoryPlan {
  std::string model;     // model.kind
  std::string strategy;  // FULL_SHARD, ...
  int world_size = 1;
  int shard_group_size = 1;     // N: ranks sharing one copy of the parameters
  int replicas = 1;             // world_size / N
  int64_t num_params = 0;       // Psi
  std::vector<UnitPlan> units;  // index 0 = root
  // Predicted peaks, per rank, indexed by MemCategory: the MemoryTracker's peak_bytes(c) and
  // peak_total_bytes() at the end of the run.
  std::array<int64_t, kMemCategoryCount> peak_bytes{};
  int64_t total_peak_bytes = 0;
  CollectivePlan all_gather, reduce_scatter, all_reduce;
  std::vector<std::string> notes;  // assumptions the prediction rests on

  int64_t peak(MemCategory c) const { return peak_bytes[static_cast<size_t>(c)]; }
  // The printed plan: model and units, one line per category and per collective, totals.
  std::string text() const;
  // {"params": N, ..., "other": N, "total": N}: the shape of mem_peaks_json, for the metrics.
  std::string peaks_json() const;
};

// Throws Error (as the trainer would) on a configuration the engine rejects.
MemoryPlan plan_memory(const Config& config, const PlanRequest& request);

}  // namespace fsdp
