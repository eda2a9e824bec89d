#pragma once
// Fully Sharded Data Parallelism over the collective layer. A wrap policy picks subtrees of the
// model's module tree as units (nested, as PyTorch nests them); each unit flattens its parameters (PyTorch order) into
// one FlatParam padded to a multiple of the shard-group size N, and rank r keeps slice r — a
// shard is {offset, size}. Per unit, named verbs: unshard (start the all_gather),
// wait_for_unshard, reshard (free the gathered buffer), post_backward (reduce_scatter the
// gradient into the grad shard, then all_reduce it across the replicate group for HYBRID).
// The engine runs them from the hooks of each unit's root module, in whatever order the model's
// forward reaches them; prefetch follows the order recorded on the first pass (as FSDP2 does).
// The optimizer steps on the concatenated parameter shards, with each unit's gradient shard.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/comm.h"
#include "fsdp/strategy.h"
#include "fsdp/trace.h"
#include "models/model.h"
#include "nn/flat.h"
#include "optim/optim.h"
#include "tensor/device.h"
#include "tensor/tensor.h"

namespace fsdp {

class NodeSharedParams;  // node_shared.h

struct FsdpOptions {
  Strategy strategy = Strategy::full_shard;
  WrapPolicy wrap_policy = WrapPolicy::size_based;
  int64_t min_num_params = 100;
  std::vector<std::string> wrap_modules;                     // manual
  DType param_dtype = DType::f32;                            // all_gather and compute precision of parameters
  DType reduce_dtype = DType::f32;                           // reduce_scatter precision of gradients
  ComputePrecision compute = ComputePrecision::param_dtype;  // strategy.h
  BackwardPrefetch backward_prefetch = BackwardPrefetch::pre;
  bool forward_prefetch = false;
  bool limit_all_gathers = true;  // at most two units' gathered buffers alive
  // Ranks of a shard group on one node read the gathered parameters from one node-shared copy
  // instead of all_gathering them (host runs; see FsdpEngine::unshard).
  bool node_shared_params = false;
  bool activation_checkpointing = false;
  int shard_group_size = 0;  // hybrid: ranks per shard group, 0 = ranks per node
  // Parameter and optimizer shards in host memory, stepped on the host; only gathered
  // parameters and gradients live on the device (fsdp.cpu_offload, device runs only).
  bool cpu_offload = false;
};

// One FSDP unit: the module it is rooted at and the parameters it owns, which are its subtree's
// minus those of the units nested in it; a parameter several modules use (a tied weight) sits
// in the innermost unit whose subtree holds all of them. Unit 0 is the root (the model), which
// may own nothing. Units are listed in pre-order: an outer unit before those nested in it.
//   size_based         PyTorch's size_based_auto_wrap_policy, recursing: a module becomes a unit
//                      when the parameters its subtree holds outside inner units number at least
//                      min_num_params (MultiheadAttention is a leaf; containers never wrap)
//   transformer_layer  every module whose type is one of the model's block_types()
//   manual             the modules named by path in wrap_modules
struct UnitSpec {
  std::string name;  // "root" or the module's path
  Module* module = nullptr;
  std::vector<Param*> params;  // PyTorch named_parameters() order
};
std::vector<UnitSpec> apply_wrap_policy(Model& model, const FsdpOptions& options);

// The ranks that share shards (N of them) and the ranks that hold replicas of the same shard.
struct ProcessMesh {
  std::unique_ptr<Communicator> shard;      // size N
  std::unique_ptr<Communicator> replicate;  // size world / N
  bool shard_group_on_one_node = false;     // by the node colors make_mesh was given
};
// The colors world.split_by gets for each group, for every rank: shard[r] and replicate[r].
// node_color_of_rank: equal for ranks on one node (e.g. the world rank of the node's first rank);
// HYBRID with shard_group_size 0 makes one shard group per node. Throws Error when the groups
// cannot be formed (a group size that does not divide the world, nodes of unequal size).
struct MeshColors {
  std::vector<int> shard, replicate;
};
MeshColors mesh_colors(Strategy strategy, int shard_group_size, const std::vector<int>& node_color_of_rank);
ProcessMesh make_mesh(Communicator& world, Strategy strategy, int shard_group_size,
                      const std::vector<int>& node_color_of_rank);

// What the engine's collectives moved in one training step (begin_step to finish_backward),
// sizes as nccl-tests counts them: `bytes` sums each call's whole array (all_gather: the
// gathered output, reduce_scatter: the full input, all_reduce: the buffer); `wire_bytes` is
// what each rank sends (bus bytes: (n-1)/n of that, twice for all_reduce, over a group of n).
struct CollectiveCount {
  int64_t calls = 0;
  int64_t bytes = 0;
  int64_t wire_bytes = 0;
  int group_size = 1;
  void add(int64_t call_bytes, bool is_all_reduce);
};
struct StepTraffic {
  CollectiveCount all_gather, reduce_scatter, all_reduce;  // all_reduce: the replicate group's
};

// Full parameter values from outside the engine (train/ opens model.init_from's file), used on
// rank 0 only: check(all params) throws Error when they cannot all be read at their shapes;
// read(params) writes each one's values through its bound data pointer.
struct WeightReader {
  std::function<void(const std::vector<Param*>&)> check, read;
};
using WeightOpener = std::function<WeightReader()>;  // may throw Error

enum class UnitState { sharded, gathering, gathered };

struct Unit {
  UnitSpec spec;
  FlatLayout layout;         // unpadded params, PyTorch order
  int64_t padded_numel = 0;  // layout.numel rounded up to a multiple of N
  int64_t shard_numel = 0;   // padded_numel / N
  int64_t shard_offset = 0;  // this unit's shard in the engine's concatenated shard buffers
  UnitState state = UnitState::sharded;
  Tensor gathered;       // (padded_numel) f32 compute copy while unsharded
  Tensor gathered_lowp;  // (padded_numel) param_dtype when it is not f32
  Tensor full_grad;      // (padded_numel) f32 gradients during backward
  // (shard_numel) f32, in the shards' memory: this rank's slice of the unit's reduced gradient,
  // from the unit's first post_backward of a step until the next step begins. Freed there, as
  // PyTorch's zero_grad(set_to_none=True) frees .grad: a step's forward holds no gradients, and
  // its backward only those of the units it has reduced so far.
  Tensor grad_shard;
  std::unique_ptr<Work> pending_gather;
  // Why the last all_gather was issued (forward, forward prefetch, backward, backward prefetch,
  // full weights): a timeout waiting for it names this.
  const char* gather_phase = "";
  Tensor staged_shard;         // cpu_offload: this rank's shard copied to the device for the all_gather
  float* shared = nullptr;     // fsdp.node_shared_params: the node's copy (padded_numel), slice r rank r's
  int forward_uses = 0;        // calls of the unit's module in this forward (a module used twice: 2)
  int backward_left = 0;       // of those, the backward calls still to come: reduce after the last
  bool backward_done = false;  // this backward pass has reduced and freed the unit
};

class FsdpEngine : public ModuleHooks {
 public:
  // runtime: where gathered parameters, gradients and (without cpu_offload) the shards live,
  // and whose streams order the collectives: compute on compute_stream(), all_gather and
  // reduce_scatter on comm_stream(), joined by events — the host never waits for the device
  // inside a step except where a host value is asked for (norms, finiteness, the loss).
  // Null: host memory through a HostRuntime of the engine's own (every wait is immediate).
  FsdpEngine(Model& model, Communicator& world, ProcessMesh mesh, const FsdpOptions& options, MemoryTracker& mem,
             DeviceRuntime* runtime = nullptr);
  ~FsdpEngine() override;
  FsdpEngine(const FsdpEngine&) = delete;  // owns the shards and the collectives in flight on them
  FsdpEngine& operator=(const FsdpEngine&) = delete;

  // Deferred sharded init: each rank materialises only its own slice of every unit.
  void init_shards(uint64_t seed);
  // sync_module_states: rank 0 opens the source (model.init_from's HDF5 file), checks it holds
  // every parameter, then reads it unit by unit and broadcasts; every rank keeps its slice.
  // Replaces init_shards' values. A source that fails on rank 0 fails every rank with its message.
  void load_full_weights(const WeightOpener& open);

  // A training step: begin_step frees the grad shards; forward/backward run through the hooks;
  // with sync_grads false (gradient accumulation, all but the last micro-batch) post_backward
  // keeps the full gradients instead of reducing them; finish_backward waits for every reduction
  // (and gives a unit no backward reached a zero gradient).
  void begin_step();
  void set_sync_grads(bool sync) { sync_grads_ = sync; }
  void finish_backward();
  // Gathers each unit in turn (all ranks), calls fn with its params bound to full values, then
  // frees it: how full weights are written without any rank holding the whole model.
  void for_each_gathered_unit(const std::function<void(const Unit&)>& fn);
  // After a forward without backward (evaluation): free what forward left gathered.
  void end_forward_only();
  // Generation: every unit gathered at once (all the all_gathers issued, then waited), so a
  // decoding loop of one forward per token runs with no collective per token (ZeRO-3's 10x
  // slower generation is one gather per unit per token); reshard_all frees them. In between,
  // run the model without the engine's hooks (RunCtx::hooks null). Costs the whole model's
  // parameters on every rank for that time (the memory plan counts it).
  void unshard_all();
  void reshard_all();

  // Global L2 norm of the gradient (f64 partial sums, one all_reduce over the shard group),
  // then scales the grad shards by min(1, max_norm / (norm + 1e-6)) as PyTorch does.
  double clip_grad_norm(double max_norm);
  // True when every rank's gradient shard is finite (one all_reduce over the world); false
  // means an f16 overflow somewhere, and the step must be skipped on every rank.
  bool grads_finite();
  // grad shards *= factor (undoes the loss scale).
  void scale_grads(float factor);
  // In shard_runtime()'s memory (the device, or the host under cpu_offload). Mutable, so the
  // caller may change them (the optimizer, a checkpoint's load): under node-shared params the next
  // unshard publishes this rank's shards anew, so every rank must ask at the same points (as every
  // caller does: optimizer steps and checkpoints run on all ranks).
  std::span<float> param_shards() {
    shards_written();
    return {shards_.f32(), static_cast<size_t>(shards_.numel())};
  }
  // Every unit's grad shard after finish_backward, in unit order: they tile param_shards().
  std::vector<GradSlice> grad_shards() const;
  // One unit's (empty before its first post_backward of the step).
  static std::span<float> grad_shard(const Unit& u) {
    return {u.grad_shard.defined() ? u.grad_shard.f32() : nullptr, static_cast<size_t>(u.grad_shard.numel())};
  }
  DeviceRuntime& runtime() { return *rt_; }
  // Where the shards (and so the optimizer) live: the runtime, or the host under cpu_offload.
  DeviceRuntime& shard_runtime() { return *shard_rt_; }

  const std::vector<std::unique_ptr<Unit>>& units() const { return units_; }
  const ProcessMesh& mesh() const { return mesh_; }
  Communicator& world() { return world_; }
  const FsdpOptions& options() const { return options_; }
  // What the model's forward and backward compute in (RunCtx::compute_dtype): param_dtype under
  // fsdp.mixed_precision.compute: param_dtype, else f32.
  DType compute_dtype() const {
    return options_.compute == ComputePrecision::param_dtype ? options_.param_dtype : DType::f32;
  }
  // The current (or last) step's collectives; the scalar all_reduces (loss, norm) not counted.
  const StepTraffic& step_traffic() const { return traffic_; }
  // Where the verbs' spans and collectives go (fsdp/trace.h); null: the engine's own, off. The
  // tracer must outlive the engine.
  void set_tracer(Tracer* tracer) { trace_ = tracer ? tracer : &no_trace_; }
  Tracer& tracer() { return *trace_; }
  // fsdp.node_shared_params: "on: ..." or "off: why" (empty when not asked for).
  const std::string& node_shared_params_note() const { return node_params_note_; }

  // ModuleHooks
  void pre_forward(Module& module) override;
  void post_forward(Module& module) override;
  void pre_backward(Module& module) override;
  void post_backward(Module& module) override;

 private:
  void unshard(Unit& u, const char* phase);
  void wait_for_unshard(Unit& u, const char* phase);
  void reshard(Unit& u);
  void post_backward(Unit& u);
  void prefetch(int unit_index, const char* phase);  // -1: nothing to prefetch
  int next_in_forward(const Unit& u) const;
  int next_in_backward(const Unit& u) const;
  bool keeps_params_after_forward(const Unit& u) const;
  // A shard group of one rank with f32 parameters on the device: the shard is the whole unit, so
  // unshard binds it in place and reshard has nothing to free.
  bool shard_is_the_unit() const;
  // The unit's grad shard, allocated (zeros) when the step has none yet.
  float* grad_shard_for(Unit& u);
  Unit& unit_of(Module& module);
  int index_of(const Unit& u) const;

  Model& model_;
  Communicator& world_;
  ProcessMesh mesh_;
  FsdpOptions options_;
  MemoryTracker& mem_;
  std::unique_ptr<DeviceRuntime> own_rt_;  // when none was given
  DeviceRuntime* rt_;
  std::unique_ptr<DeviceRuntime> host_rt_;  // cpu_offload: the shards' host memory
  DeviceRuntime* shard_rt_;
  // Makes the comm stream wait for the compute stream's work so far: before a collective reads
  // what compute wrote, or writes memory compute used last (freed blocks are reused on the
  // compute stream's order).
  void comm_waits_for_compute();
  bool offloaded() const;  // shards in host memory, compute on the device
  // One rank, f32 reductions and compute, no offload: gradients accumulate in the grad shard.
  bool direct_grads() const;
  // Host values into the shard buffer at `offset` (init, init_from), synchronously.
  void write_shard(int64_t offset, const float* host, int64_t count);
  // fsdp.node_shared_params (node_shared.h: the protocol). The node's one copy of every unit's
  // parameters (Unit::shared): a rank copies its shards into its slices once per version of the
  // shards (publish_shards: the first unshard after they changed) and reads the peers' slices in
  // place: no all_gather, no copy, and one wait per step for the peers instead of one a unit.
  std::unique_ptr<NodeSharedParams> node_params_;
  // for_each_gathered_unit: gathers in f32 (the shards' values) instead of param_dtype.
  bool full_precision_gather_ = false;
  std::string node_params_note_;
  size_t node_params_charged_bytes_ = 0;  // this rank's share, charged as gathered memory
  void share_params_on_node();
  void shards_written();  // the shards may have changed (see param_shards)
  void publish_shards();
  std::vector<std::unique_ptr<Unit>> units_;
  std::unordered_map<const Module*, int> unit_of_module_;  // the units' root modules
  // Unit indices in the order the first forward and the first backward reached them (first use
  // only): what prefetch follows from then on. A backward before the first one has finished
  // guesses the reverse forward order.
  std::vector<int> forward_order_, backward_order_;
  bool backward_order_known_ = false;
  // Between the root's pre_backward and finish_backward: a forward then is a recompute
  // (activation checkpointing), which gathers but neither counts a use nor reshards.
  bool in_backward_ = false;
  Tensor shards_;  // concatenated f32 master shards of every unit
  bool sync_grads_ = true;
  struct PendingReduction {
    std::unique_ptr<Work> work;
    Tensor input;          // the unit's full gradient, alive until the reduce_scatter is done
    Tensor output;         // low precision or cpu_offload: the reduced shard before it is added in
    Unit* unit = nullptr;  // whose grad shard it lands in; named by a timeout
  };
  // The compute stream waits for the reduction, then adds a low-precision or offloaded result
  // into the f32 grad shard.
  void complete(PendingReduction& p);
  std::vector<PendingReduction> pending_reductions_;
  StepTraffic traffic_;
  Tracer no_trace_;
  Tracer* trace_ = &no_trace_;
};

}  // namespace fsdp
