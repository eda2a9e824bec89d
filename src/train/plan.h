#pragma once
// The memory and communication plan of a run: what `fsdp_app INPUT.yaml --plan` prints, what a
// run checks against the memory of its node before allocating, and what every run's metrics set
// beside the MemoryTracker's measured peaks. Per rank (rank 0, which gets the largest batch
// slices), by MemoryTracker category, for any world size — not only the one running.
//
// How: the real Trainer, FSDP engine and layers run on the meta device (tensor/meta_runtime.h:
// memory charged as on the planned device, nothing computed) with a meta communicator of the
// planned size (comm/meta_comm.h: collectives complete at once, move nothing). Trainer::plan
// runs the shortest sequence of the run's own calls that reaches every peak a whole run reaches.
// So the peaks are the quantities the real tracker reports, by construction: per-category
// peaks, and the peak of the total (not the sum of the category peaks).
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/fsdp.h"
#include "tensor/memory.h"
#include "tensor/tensor.h"
#include "tensor/timeline.h"
#include "train/metrics.h"  // JsonLine

namespace fsdp {

struct Config;
class Dataset;

struct ClusterSpec;

struct PlanRequest {
  int world_size = 1;
  // A timed plan (TimePlan) on this cluster (config/cluster.h); null: memory only. The ranks
  // fill nodes ranks_per_node at a time (0: the cluster's devices_per_node).
  const ClusterSpec* cluster = nullptr;
  // The planned world's nodes: ranks_per_node consecutive ranks each (HYBRID's shard groups when
  // fsdp.hybrid.shard_group_size is 0). 0: all ranks on one node. node_color_of_rank, when not
  // empty, gives every rank's node instead (a run plans for its own launch).
  int ranks_per_node = 0;
  std::vector<int> node_color_of_rank;
  // The datasets, when the caller has loaded them already (the trainer): not loaded again.
  std::shared_ptr<const Dataset> train_data, eval_data;
};

struct UnitPlan {
  std::string name;
  int64_t numel = 0;         // parameters in the unit
  int64_t padded_numel = 0;  // rounded up to a multiple of the shard group size N
  int64_t shard_numel = 0;   // padded_numel / N: what each rank keeps
};

// One training step's predicted time on a cluster, per rank (rank 0): the step's own calls on
// the meta device, each kernel at its FLOPs and bytes, each collective at its ring cost, in the
// engine's order on the planned streams (tensor/timeline.h, comm/collective_cost.h).
struct TimePlan {
  std::string cluster, backend;
  int ranks_per_node = 1, nodes = 1, ranks_per_device = 1;
  bool overlaps = true;                               // the backend's collectives progress during compute
  double step_s = 0;                                  // from the step's first call to the end of its last
  double gemm_s = 0, memory_bound_s = 0, copy_s = 0;  // busy time of the kernels
  double gemm_flops = 0;                              // this rank's GEMM FLOPs in the step (recompute included)
  int64_t kernels = 0;                                // kernels in the step, each with the cluster's overhead
  double peak_flops_per_s = 0;                        // the device's dense peak at the GEMMs' precision (MFU)
  std::string precision;                              // "f32", "tf32", "bf16"
  std::array<double, kCollectiveKindCount> collective_s{};
  std::array<int64_t, kCollectiveKindCount> collective_calls{};
  double samples_per_step = 0;   // global batch
  double tokens_per_sample = 0;  // 0: not a token model
  std::vector<std::string> modelled, not_modelled;

  double compute_s() const { return gemm_s + memory_bound_s + copy_s; }
  double comm_s() const;
  double exposed_comm_s() const { return step_s > compute_s() ? step_s - compute_s() : 0.0; }
  // Of the device's peak: the ranks sharing a device (CPU ranks on one node) share its peak.
  double mfu() const {
    return step_s > 0 && peak_flops_per_s > 0 ? gemm_flops * ranks_per_device / step_s / peak_flops_per_s : 0;
  }
  std::string text(int world_size) const;
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
  // The same total split by where the bytes live (a cpu run: all host): each space's own peak.
  int64_t host_peak_bytes = 0, device_peak_bytes = 0;
  // One training step's collectives (all micro-batches), FsdpEngine::step_traffic.
  CollectiveCount all_gather, reduce_scatter, all_reduce;
  std::vector<std::string> notes;  // assumptions the prediction rests on
  std::optional<TimePlan> time;    // with PlanRequest::cluster

  int64_t peak(MemCategory c) const { return peak_bytes[static_cast<size_t>(c)]; }
  // The printed plan: model and units, one line per category and per collective, totals.
  std::string text() const;
  // {"params": N, ..., "other": N, "total": N}: the shape of mem_peaks_json, for the metrics.
  JsonLine peaks_json() const;
};

// Throws Error, as the run would, on a configuration the run rejects.
MemoryPlan plan_memory(const Config& config, const PlanRequest& request);

// `fsdp_app IN.yaml --plan --suggest --cluster C`: the timed plan of each strategy FULL_SHARD,
// SHARD_GRAD_OP, HYBRID_SHARD (shard groups of one node), NO_SHARD, each with and without
// activation checkpointing and (on a GPU) cpu_offload, everything else as the input has it.
struct StrategyChoice {
  std::string label;               // "FULL_SHARD + activation checkpointing"
  std::optional<MemoryPlan> plan;  // empty when the run would refuse the combination
  std::string refused;             // the run's own error line, when it would
  bool fits = false;               // within the cluster's device and host memory
  double per_rank_bytes = 0;       // the peak that must fit: the device's, or the host's on a CPU
};
// Ranked: those that fit by predicted step time, then those that do not, then the refused.
std::vector<StrategyChoice> suggest_strategies(const Config& config, const PlanRequest& request);
std::string suggestions_text(const std::vector<StrategyChoice>& choices, const PlanRequest& request);

// A run that cannot fit is refused before it allocates, with the numbers, instead of being
// killed by the kernel's OOM killer (or a CUDA out-of-memory) minutes later: Error when
// ranks_on_node x the planned host peak exceeds the node's MemAvailable, or, on a device run,
// when the ranks sharing this rank's device (ranks_on_node / devices, rounded up) x the planned
// device peak exceed the device's free memory (DeviceRuntime::device_memory).
void check_plan_fits(const MemoryPlan& plan, int ranks_on_node, DeviceRuntime& runtime);

// "1.50 GiB".
std::string human_bytes(double bytes);

}  // namespace fsdp
