// The memory plan: the run replayed on shapes. Three mirrors, each of code elsewhere, in the
// order that code runs, so the replay's MemoryTracker sees the same charges and credits:
//   EngineReplay   FsdpEngine (engine.cpp): shards, unshard/reshard with prefetch and
//                  limit_all_gathers, full gradients and their in-flight reductions, comm staging
//   ModelReplay    Model::forward/backward (models/model.cpp): hooks, activation checkpointing,
//                  the held input/output handles; the layers replay themselves (plan_forward)
//   plan_memory    Trainer (train/trainer.cpp): set-up, steps with their batch buffers,
//                  evaluation at eval_batch_size with its own batch buffers, save_weights
// A change to one of those must be mirrored here; tests/test_plan.cpp compares the plan with
// measured peaks and fails when they drift apart.
//
// Checkpoints: on a device run without cpu_offload the trainer stages the shards and optimizer
// state through host tensors charged `other` (HostCheckpointState, train/checkpointing.h):
// replayed at a resume (the file is assumed to exist) and at a save after the first steps and
// at the end. save_weights on a device run stages each gathered unit to the host the same way.
// Host shards (cpu runs, cpu_offload) are written in place and cost nothing here. Not modelled:
// the ckpt writer's and loader's own untracked buffers (HDF5, the consolidated pieces), and the
// cpu_offload path's device copies of the host shards (FsdpEngine::unshard's staged_shard).
#include "fsdp/plan.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "config/config.h"
#include "fsdp/fsdp.h"
#include "models/model.h"
#include "tensor/error.h"

namespace fsdp {

namespace {

int64_t optimizer_states(const OptimizerConfig& c) {
  if (c.kind == "adamw" || c.kind == "adadelta") return 2;  // exp_avg, exp_avg_sq; square_avg, acc_delta
  if (c.kind == "sgd") return c.momentum != 0 ? 1 : 0;      // momentum_buffer only with momentum
  throw Error("unknown optimizer kind '" + c.kind + "' (sgd | adadelta | adamw)");
}

// Sampler::rank_slice(n, 0, ranks).second: rank 0 gets one more when n does not divide.
int64_t rank0_count(int64_t n, int64_t ranks) { return n / ranks + (n % ranks > 0 ? 1 : 0); }

struct SimUnit {
  UnitPlan plan;
  std::vector<Layer*> layers;
  UnitState state = UnitState::sharded;
  PlanTensor gathered, gathered_lowp, full_grad;
  int forward_layers_left = 0;
  int backward_layers_left = 0;
};

// FsdpEngine's memory behaviour, function by function. Collectives complete at once here; what
// matters is which buffers are alive when, and that follows the engine's states, not timing.
class EngineReplay {
 public:
  EngineReplay(const Model& model, std::vector<UnitSpec> specs, FsdpOptions o, int64_t n, int64_t replicas,
               ActivationPlan& plan)
      : o_(std::move(o)), n_(n), replicas_(replicas), plan_(plan) {
    int64_t total = 0;
    for (UnitSpec& spec : specs) {
      SimUnit u;
      std::vector<Param*> params;
      for (Layer* layer : spec.layers) layer->collect_params(params);
      for (Param* p : params) u.plan.numel += p->numel();
      u.plan.name = spec.name;
      u.plan.padded_numel = (u.plan.numel + n - 1) / n * n;
      u.plan.shard_numel = u.plan.padded_numel / n;
      u.layers = std::move(spec.layers);
      total += u.plan.shard_numel;
      units_.push_back(std::move(u));
    }
    const std::vector<Layer*>& layers = model.layers();
    unit_of_layer_.assign(layers.size(), -1);
    for (size_t ui = 0; ui < units_.size(); ++ui)
      for (Layer* l : units_[ui].layers)
        unit_of_layer_[std::find(layers.begin(), layers.end(), l) - layers.begin()] = static_cast<int>(ui);
    for (size_t li = 0; li < layers.size(); ++li)
      if (std::find(forward_order_.begin(), forward_order_.end(), unit_of_layer_[li]) == forward_order_.end())
        forward_order_.push_back(unit_of_layer_[li]);
    shard_total_ = total;
    shards_ = plan_.make({total}, DType::f32, MemCategory::params);
    grad_shards_ = plan_.make({total}, DType::f32, MemCategory::grads);
    all_gather.group_size = reduce_scatter.group_size = static_cast<int>(n);
    all_reduce.group_size = static_cast<int>(replicas);
  }

  int64_t shard_total() const { return shard_total_; }
  std::vector<UnitPlan> unit_plans() const {
    std::vector<UnitPlan> out;
    for (const SimUnit& u : units_) out.push_back(u.plan);
    return out;
  }
  bool is_checkpointed(size_t layer_index) const {
    // engine.cpp: every layer of a wrapped (non-root) unit recomputes.
    return o_.activation_checkpointing && unit_of_layer_[layer_index] > 0;
  }

  // FsdpEngine::load_full_weights: one unit's full f32 values at a time, category other.
  void load_full_weights() {
    for (SimUnit& u : units_) plan_.make({u.plan.padded_numel}, DType::f32, MemCategory::other);
  }

  void begin_step() {}
  void set_sync_grads(bool sync) { sync_grads_ = sync; }

  void pre_forward(size_t li) {
    SimUnit& u = unit_of(li);
    if (u.forward_layers_left == 0) u.forward_layers_left = static_cast<int>(u.layers.size());
    wait_for_unshard(u);
    if (o_.forward_prefetch) {
      auto it = std::find(forward_order_.begin(), forward_order_.end(), index_of(u));
      if (it != forward_order_.end() && it + 1 != forward_order_.end()) prefetch(*(it + 1));
    }
  }

  void post_forward(size_t li) {
    SimUnit& u = unit_of(li);
    if (--u.forward_layers_left == 0 && !keeps_params_after_forward(u)) reshard(u);
  }

  void pre_backward(size_t li) {
    SimUnit& u = unit_of(li);
    if (u.backward_layers_left == 0) {
      u.backward_layers_left = static_cast<int>(u.layers.size());
      wait_for_unshard(u);
      // NO_SHARD (N = 1, f32 reduce) accumulates into the grad shard: no full gradient.
      if (!(n_ == 1 && o_.reduce_dtype == DType::f32) && !u.full_grad.defined())
        u.full_grad = plan_.make({u.plan.padded_numel}, DType::f32, MemCategory::grads);
    }
    if (o_.backward_prefetch == BackwardPrefetch::pre) prefetch_before(li, u);
  }

  void post_backward(size_t li) {
    SimUnit& u = unit_of(li);
    if (--u.backward_layers_left > 0) return;
    if (o_.backward_prefetch == BackwardPrefetch::post) prefetch_before(li, u);
    const bool direct = n_ == 1 && o_.reduce_dtype == DType::f32;
    if (sync_grads_ && !direct) {
      // At most two reductions in flight after this one is queued, each holding its unit's
      // full gradient: with the unit that backward runs next, three full gradients at once.
      while (pending_.size() > 1) pending_.erase(pending_.begin());
      const int64_t rbytes = static_cast<int64_t>(dtype_bytes(o_.reduce_dtype));
      count(reduce_scatter, u.plan.padded_numel * rbytes, false);
      if (o_.reduce_dtype == DType::f32) {
        pending_.push_back(std::move(u.full_grad));
      } else {
        // Staging in reduce_dtype: the full-size copy, then the shard-size result; both freed
        // when the (waited) reduce_scatter is done.
        PlanTensor low = plan_.make({u.plan.padded_numel}, o_.reduce_dtype, MemCategory::comm);
        u.full_grad = PlanTensor();
        PlanTensor out = plan_.make({u.plan.shard_numel}, o_.reduce_dtype, MemCategory::comm);
      }
      u.full_grad = PlanTensor();
    }
    reshard(u);
  }

  void finish_backward() {
    pending_.clear();
    if (sync_grads_ && replicas_ > 1 && !o_.skip_replicate_reduce)
      count(all_reduce, shard_total_ * static_cast<int64_t>(sizeof(float)), true);
  }

  void end_forward_only() {
    for (SimUnit& u : units_) {
      u.forward_layers_left = 0;
      if (u.state != UnitState::sharded) reshard(u);
    }
  }

  // host_staging: a device run's save_weights, whose writer (rank 0) copies each gathered unit's
  // values (unpadded) to the host before writing them (trainer.cpp's write_gathered_unit).
  void for_each_gathered_unit(bool host_staging) {
    for (SimUnit& u : units_) {
      wait_for_unshard(u);
      if (host_staging && u.plan.numel > 0) plan_.make({u.plan.numel}, DType::f32, MemCategory::other);
      reshard(u);
    }
  }

  // Per-step counters: reset at the start of a step, read after it.
  void reset_counters() {
    all_gather.calls = all_gather.bytes = all_gather.wire_bytes = 0;
    reduce_scatter.calls = reduce_scatter.bytes = reduce_scatter.wire_bytes = 0;
    all_reduce.calls = all_reduce.bytes = all_reduce.wire_bytes = 0;
  }
  CollectivePlan all_gather, reduce_scatter, all_reduce;

 private:
  SimUnit& unit_of(size_t li) { return units_[unit_of_layer_[li]]; }
  int index_of(const SimUnit& u) const { return static_cast<int>(&u - units_.data()); }

  bool keeps_params_after_forward(const SimUnit& u) const {
    return index_of(u) == 0 || o_.strategy == Strategy::shard_grad_op || o_.strategy == Strategy::hybrid_shard_zero2 ||
           n_ == 1;
  }

  void count(CollectivePlan& c, int64_t bytes, bool all_reduce_factor) {
    c.calls += 1;
    c.bytes += bytes;
    const int64_t g = c.group_size;
    c.wire_bytes += (all_reduce_factor ? 2 : 1) * bytes * (g - 1) / g;
  }

  void unshard(SimUnit& u) {
    if (u.state != UnitState::sharded) return;
    if (n_ == 1 && o_.param_dtype == DType::f32) {  // the shard is the whole unit: bound in place
      u.state = UnitState::gathered;
      return;
    }
    if (!u.gathered.defined()) u.gathered = plan_.make({u.plan.padded_numel}, DType::f32, MemCategory::gathered);
    if (o_.param_dtype != DType::f32)
      u.gathered_lowp = plan_.make({u.plan.padded_numel}, o_.param_dtype, MemCategory::gathered);
    count(all_gather, u.plan.padded_numel * static_cast<int64_t>(dtype_bytes(o_.param_dtype)), false);
    u.state = UnitState::gathering;
  }

  void wait_for_unshard(SimUnit& u) {
    if (u.state == UnitState::sharded) unshard(u);
    if (u.state == UnitState::gathering) {
      u.gathered_lowp = PlanTensor();  // converted into the f32 copy, then freed
      u.state = UnitState::gathered;
    }
  }

  void reshard(SimUnit& u) {
    if (u.state == UnitState::gathering) wait_for_unshard(u);
    if (n_ == 1 && o_.param_dtype == DType::f32) return;
    u.gathered = PlanTensor();
    u.state = UnitState::sharded;
  }

  void prefetch(int unit_index) {
    if (unit_index < 0) return;
    SimUnit& u = units_[unit_index];
    if (u.state != UnitState::sharded) return;
    if (o_.limit_all_gathers) {
      int alive = 0;
      for (size_t i = 1; i < units_.size(); ++i) alive += units_[i].state != UnitState::sharded;
      if (alive >= 2) return;
    }
    unshard(u);
  }

  // The unit backward reaches next: the nearest earlier layer of another unit.
  void prefetch_before(size_t li, const SimUnit& u) {
    for (int p = static_cast<int>(li) - 1; p >= 0; --p)
      if (unit_of_layer_[p] != index_of(u)) {
        prefetch(unit_of_layer_[p]);
        break;
      }
  }

  FsdpOptions o_;
  int64_t n_, replicas_;
  ActivationPlan& plan_;
  std::vector<SimUnit> units_;
  std::vector<int> unit_of_layer_;
  std::vector<int> forward_order_;
  int64_t shard_total_ = 0;
  PlanTensor shards_, grad_shards_;
  bool sync_grads_ = true;
  std::vector<PlanTensor> pending_;  // full gradients of in-flight reductions
};

// Model::forward / Model::backward with the engine as hooks.
class ModelReplay {
 public:
  ModelReplay(const Model& model, EngineReplay& engine, ActivationPlan& plan)
      : model_(model), engine_(engine), plan_(plan), saved_inputs_(model.layers().size()) {}

  void forward(const RunCtx& ctx, const PlanTensor& inputs, const PlanTensor& targets) {
    const std::vector<Layer*>& layers = model_.layers();
    PlanTensor x = inputs;  // a handle: holds the current input, as Model::forward's does
    for (size_t i = 0; i < layers.size(); ++i) {
      engine_.pre_forward(i);
      const bool ckpt = engine_.is_checkpointed(i) && ctx.training;
      if (ckpt) saved_inputs_[i] = x;
      x = layers[i]->plan_forward(plan_, ctx, x);
      if (ckpt) plan_.release(*layers[i]);
      engine_.post_forward(i);
    }
    output_ = x;
    model_.loss().plan_forward(plan_, x, targets);
  }

  void backward(const RunCtx& ctx) {
    const std::vector<Layer*>& layers = model_.layers();
    PlanTensor dy = model_.loss().plan_backward(plan_);
    for (size_t i = layers.size(); i-- > 0;) {
      engine_.pre_backward(i);
      if (engine_.is_checkpointed(i)) {
        layers[i]->plan_forward(plan_, ctx, saved_inputs_[i]);
        saved_inputs_[i] = PlanTensor();
      }
      dy = layers[i]->plan_backward(plan_, ctx, dy);
      if (engine_.is_checkpointed(i)) plan_.release(*layers[i]);  // dy keeps its own handle
      engine_.post_backward(i);
    }
  }

 private:
  const Model& model_;
  EngineReplay& engine_;
  ActivationPlan& plan_;
  std::vector<PlanTensor> saved_inputs_;
  PlanTensor output_;
};

// trainer.cpp's BatchBuffers: inputs and targets, ensure()d per batch.
struct BatchSlots {
  Tensor inputs, targets;  // never used: their addresses key the plan's slots
};

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024.0 && i < 4) {
    b /= 1024.0;
    ++i;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, i == 0 ? "%.0f %s" : "%.2f %s", b, units[i]);
  return buf;
}

std::string grouped(int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return (v < 0 ? "-" : "") + out;
}

}  // namespace

MemoryPlan plan_memory(const Config& config, const PlanRequest& request) {
  const int world = request.world_size;
  if (world < 1) throw Error("memory plan: world size " + std::to_string(world) + " is not >= 1");
  const Config c = for_world_size(config, world);
  const FsdpOptions o = fsdp_options(c.fsdp);
  for (DType d : {o.param_dtype, o.reduce_dtype})
    if (d != DType::f32 && d != DType::bf16 && d != DType::f16)
      throw Error("fsdp.mixed_precision: " + std::string(dtype_name(d)) + " is not f32, bf16 or f16");

  // The mesh make_mesh builds: N ranks share one copy of the parameters.
  int n = world;
  if (o.strategy == Strategy::no_shard) n = 1;
  if (o.strategy == Strategy::hybrid_shard || o.strategy == Strategy::hybrid_shard_zero2) {
    n = request.shard_group_size > 0 ? request.shard_group_size : o.shard_group_size > 0 ? o.shard_group_size : world;
    if (world % n != 0)
      throw Error("fsdp.hybrid.shard_group_size " + std::to_string(n) + " does not divide the " +
                  std::to_string(world) + " ranks");
  }

  MemoryPlan plan;
  plan.model = c.model.kind;
  plan.strategy = std::string(strategy_name(o.strategy));
  plan.world_size = world;
  plan.shard_group_size = n;
  plan.replicas = world / n;

  std::unique_ptr<Model> model = make_model(c.model);
  plan.num_params = model->num_params();
  MemoryTracker tracker;
  {
    ActivationPlan acts(tracker);
    EngineReplay engine(*model, apply_wrap_policy(*model, o), o, n, world / n, acts);
    ModelReplay replay(*model, engine, acts);
    plan.units = engine.unit_plans();

    // Trainer set-up: the engine's shards (above), then the optimizer's state on them.
    const int64_t states = optimizer_states(c.train.optimizer);
    std::vector<PlanTensor> optim_state;
    for (int64_t s = 0; s < states; ++s)
      optim_state.push_back(acts.make({engine.shard_total()}, DType::f32, MemCategory::optim));
    // HostCheckpointState: on a device run without cpu_offload, a save or a resume holds a host
    // copy of the param shards and of every optimizer state buffer while the file is written or
    // read. Host shards are used in place.
    const bool device_shards = c.train.device == "cuda" && !c.fsdp.cpu_offload;
    auto checkpoint_staging = [&] {
      std::vector<PlanTensor> staging;
      for (int64_t b = 0; b < 1 + states; ++b)
        staging.push_back(acts.make({engine.shard_total()}, DType::f32, MemCategory::other));
    };
    if (device_shards && !c.checkpoint.resume.empty()) checkpoint_staging();
    if (!c.model.init_from.empty()) engine.load_full_weights();

    // What one sample looks like (the datasets' input_shape/target_shape for this model).
    const bool lm = c.model.kind == "transformer";
    const Shape sample_in = lm ? Shape{c.model.seq_len} : Shape{1, 28, 28};
    const Shape sample_tg = lm ? Shape{c.model.seq_len} : Shape{};
    const DType in_dtype = lm ? DType::i32 : DType::f32;

    // Dataset sizes, as the trainer's load_data makes them.
    int64_t train_n = request.train_samples, eval_n = request.eval_samples;
    if (c.data.kind == "synthetic") {
      if (!train_n) train_n = c.data.synthetic_samples;
      if (!eval_n) eval_n = std::max<int64_t>(1, c.data.synthetic_samples / 4);
    } else if (c.data.kind == "fashion_mnist") {
      if (!train_n) train_n = 60000;
      if (!eval_n) eval_n = 10000;
    }

    // The schedule: how many steps, whether evaluation runs, whether a step follows one.
    const int64_t global_batch = c.train.batch_size * world * c.train.grad_accum;
    int64_t total_steps = -1;  // unknown
    int64_t steps_per_epoch = train_n > 0 ? train_n / global_batch : -1;
    if (c.train.steps > 0)
      total_steps = c.train.steps;
    else if (steps_per_epoch >= 0)
      total_steps = c.train.epochs * steps_per_epoch;
    const bool evaluates = c.train.eval_every != "never" && total_steps != 0;
    bool step_after_eval = false;
    if (evaluates) {
      if (c.train.eval_every == "epoch") {
        step_after_eval =
            steps_per_epoch < 0 ? (c.train.steps > 0 || c.train.epochs > 1) : total_steps > steps_per_epoch;
        if (steps_per_epoch < 0 && c.train.steps > 0)
          plan.notes.emplace_back("train set size unknown: assumed a training step follows an evaluation");
      } else {
        const int64_t every = std::stoll(c.train.eval_every);
        step_after_eval = total_steps < 0 || every < total_steps;
      }
    }
    if (total_steps < 0) plan.notes.emplace_back("train set size unknown: assumed at least two steps");

    // Per-rank counts of rank 0's slices of the eval batches, in order. A third batch of the
    // same shape in a row repeats the second exactly and is dropped; the second is kept: its
    // units are gathered with every activation already at the new shape, the first's while
    // the old shapes are being replaced.
    std::vector<int64_t> eval_counts;
    if (evaluates) {
      const int64_t eval_global = c.train.eval_batch_size * world;
      if (eval_n <= 0) {
        eval_counts.assign(2, c.train.eval_batch_size);
        plan.notes.push_back("eval set size unknown: assumed full eval batches of " +
                             std::to_string(c.train.eval_batch_size) + " per rank");
      } else {
        for (int64_t begin = 0; begin < eval_n; begin += eval_global) {
          int64_t count = rank0_count(std::min(eval_global, eval_n - begin), world);
          const size_t k = eval_counts.size();
          if (k < 2 || eval_counts[k - 1] != count || eval_counts[k - 2] != count) eval_counts.push_back(count);
        }
      }
    }

    auto with_batch = [](Shape sample, int64_t b) {
      sample.insert(sample.begin(), b);
      return sample;
    };
    BatchSlots train_batch;  // lives through the whole run, as run()'s `batch` does
    auto load_batch = [&](BatchSlots& slots, int64_t count) {
      PlanTensor in = acts.ensure(&slots, &slots.inputs, with_batch(sample_in, count), in_dtype);
      PlanTensor tg = acts.ensure(&slots, &slots.targets, with_batch(sample_tg, count), DType::i32);
      return std::make_pair(in, tg);
    };

    RunCtx train_ctx;
    train_ctx.training = true;
    train_ctx.dropout = c.train.dropout;
    auto train_step = [&] {
      engine.reset_counters();
      engine.begin_step();
      for (int64_t m = 0; m < c.train.grad_accum; ++m) {
        auto [in, tg] = load_batch(train_batch, c.train.batch_size);
        engine.set_sync_grads(m + 1 == c.train.grad_accum);
        replay.forward(train_ctx, in, tg);
        replay.backward(train_ctx);
      }
      engine.finish_backward();
      plan.all_gather = engine.all_gather;
      plan.reduce_scatter = engine.reduce_scatter;
      plan.all_reduce = engine.all_reduce;
    };
    RunCtx eval_ctx;
    eval_ctx.training = false;
    eval_ctx.dropout = c.train.dropout;
    auto evaluate = [&] {
      BatchSlots b;  // evaluate()'s own buffers, gone when it returns
      for (int64_t count : eval_counts) {
        auto [in, tg] = load_batch(b, count);
        replay.forward(eval_ctx, in, tg);
        engine.end_forward_only();
      }
      acts.drop(&b.inputs);
      acts.drop(&b.targets);
    };

    // Step 2 is the steady state (step 1's buffers all alive while step 2 gathers again); an
    // evaluation then a step cover the shape changes both ways.
    const int64_t first_steps = total_steps < 0 ? 2 : std::min<int64_t>(total_steps, 2);
    for (int64_t s = 0; s < first_steps; ++s) train_step();
    const bool saves = device_shards && !c.checkpoint.dir.empty();
    if (saves && c.checkpoint.every_steps > 0) checkpoint_staging();
    if (evaluates) {
      evaluate();
      if (step_after_eval) {
        train_step();
        evaluate();
      }
    }
    if (saves) checkpoint_staging();  // the closing save (save_best's come after an evaluation too)
    if (!c.output.save_weights.empty()) engine.for_each_gathered_unit(c.train.device == "cuda");
    if (o.activation_checkpointing)
      plan.notes.emplace_back("activation checkpointing: wrapped units recompute in backward");
  }
  for (size_t i = 0; i < kMemCategoryCount; ++i)
    plan.peak_bytes[i] = static_cast<int64_t>(tracker.peak_bytes(static_cast<MemCategory>(i)));
  plan.total_peak_bytes = static_cast<int64_t>(tracker.peak_total_bytes());
  return plan;
}

std::string MemoryPlan::peaks_json() const {
  std::string s = "{";
  for (size_t i = 0; i < kMemCategoryCount; ++i) {
    s += '"';
    s += mem_category_name(static_cast<MemCategory>(i));
    s += "\": ";
    s += std::to_string(peak_bytes[i]);
    s += ", ";
  }
  s += "\"total\": ";
  s += std::to_string(total_peak_bytes);
  s += '}';
  return s;
}

std::string MemoryPlan::text() const {
  std::string t;
  char line[256];
  auto add = [&](const char* fmt, auto... args) {
    std::snprintf(line, sizeof line, fmt, args...);
    t += line;
  };
  const double psi_bytes = 4.0 * static_cast<double>(num_params);
  add("memory plan: %s, %s parameters (%s in f32), %s on %d rank%s: shard group N = %d, %d replica%s, %zu units\n",
      model.c_str(), grouped(num_params).c_str(), human_bytes(psi_bytes).c_str(), strategy.c_str(), world_size,
      world_size == 1 ? "" : "s", shard_group_size, replicas, replicas == 1 ? "" : "s", units.size());
  add("  %-20s %14s %14s %14s\n", "unit", "params", "padded", "shard/rank");
  for (const UnitPlan& u : units)
    add("  %-20s %14s %14s %14s\n", u.name.c_str(), grouped(u.numel).c_str(), grouped(u.padded_numel).c_str(),
        grouped(u.shard_numel).c_str());
  add("per-rank memory, predicted peaks (each category's own peak, as mem_peak_bytes reports them):\n");
  int64_t sum = 0;
  for (size_t i = 0; i < kMemCategoryCount; ++i) {
    sum += peak_bytes[i];
    add("  %-12s %12s %17s\n", std::string(mem_category_name(static_cast<MemCategory>(i))).c_str(),
        human_bytes(static_cast<double>(peak_bytes[i])).c_str(), grouped(peak_bytes[i]).c_str());
  }
  add("  %-12s %12s %17s  peak of the sum (mem_peak_bytes.total); sum of the peaks %s\n", "total",
      human_bytes(static_cast<double>(total_peak_bytes)).c_str(), grouped(total_peak_bytes).c_str(),
      grouped(sum).c_str());
  // The grad shards are the params' size: what stays between steps is params + grads + optim
  // shards, 16 Psi / N with Adam (padding included); full gradients and gathered units come on top.
  const int64_t at_rest = 2 * peak(MemCategory::params) + peak(MemCategory::optim);
  add("  model states between steps (param + grad shards + optimizer state): %s = %.2f x Psi/N bytes\n",
      human_bytes(static_cast<double>(at_rest)).c_str(),
      num_params ? static_cast<double>(at_rest * shard_group_size) / static_cast<double>(num_params) : 0.0);
  add("communication per training step (size: whole arrays, nccl-tests convention; wire: bytes each rank sends;\n"
      "  Psi = parameters x 4 bytes):\n");
  int64_t size_sum = 0, wire_sum = 0;
  auto psi = [&](int64_t b) { return psi_bytes > 0 ? static_cast<double>(b) / psi_bytes : 0.0; };
  auto coll = [&](const char* name, const CollectivePlan& p) {
    size_sum += p.bytes;
    wire_sum += p.wire_bytes;
    add("  %-15s %3lld calls over %3d ranks  size %11s = %.2f Psi  wire %11s = %.2f Psi\n", name,
        static_cast<long long>(p.calls), p.group_size, human_bytes(static_cast<double>(p.bytes)).c_str(), psi(p.bytes),
        human_bytes(static_cast<double>(p.wire_bytes)).c_str(), psi(p.wire_bytes));
  };
  coll("all_gather", all_gather);
  coll("reduce_scatter", reduce_scatter);
  coll("all_reduce", all_reduce);
  add("  %-38s size %11s = %.2f Psi  wire %11s = %.2f Psi\n", "total",
      human_bytes(static_cast<double>(size_sum)).c_str(), psi(size_sum),
      human_bytes(static_cast<double>(wire_sum)).c_str(), psi(wire_sum));
  for (const std::string& note : notes) t += "  note: " + note + "\n";
  return t;
}

}  // namespace fsdp
