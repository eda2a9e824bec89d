#include "train/trainer.h"

#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <span>

#include "ckpt/checkpoint.h"
#include "ckpt/h5.h"
#include "comm/local.h"
#include "config/config.h"
#include "data/data.h"
#include "fsdp/fsdp.h"
#include "models/model.h"
#include "nn/flat.h"
#include "optim/optim.h"
#include "tensor/error.h"
#include "train/checkpointing.h"
#include "train/metrics.h"
#include "train/plan.h"

namespace fsdp {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Datasets {
  std::shared_ptr<const Dataset> train, eval;
};

Datasets load_data(const Config& c) {
  const DataConfig& d = c.data;
  const bool lm = c.model.kind == "transformer";
  if (d.kind == "fashion_mnist") {
    if (lm) throw Error("data.kind fashion_mnist gives images; model.kind transformer needs tokens (data.kind text)");
    std::string dir = d.path.empty() ? kFashionMnistDir : d.path;
    return {load_fashion_mnist(dir, true), load_fashion_mnist(dir, false)};
  }
  if (d.kind == "text") {
    if (!lm) throw Error("data.kind text gives tokens; model.kind " + c.model.kind + " needs images");
    TextCorpusOptions o{d.path.empty() ? kTextCorpusDir : d.path, c.model.seq_len, d.eval_fraction};
    return {load_text_corpus(o, true), load_text_corpus(o, false)};
  }
  SyntheticOptions o;
  o.kind = lm ? "tokens" : "images";
  o.samples = d.synthetic_samples;
  o.vocab = c.model.vocab;
  o.seq_len = c.model.seq_len;
  o.seed = c.train.seed;
  SyntheticOptions eval_o = o;
  eval_o.samples = std::max<int64_t>(1, o.samples / 4);
  return {make_synthetic(o, true), make_synthetic(eval_o, false)};
}

// Data is read by every rank on its own, so one rank can fail where the others succeed (a file
// it may not read, a damaged local copy). The ranks that loaded go on into the mesh's
// communicator splits, which the failed rank never joins: both would wait forever. So the ranks
// agree on the outcome first (bounded by comm.timeout_s), and every rank fails with the first
// failing rank's message, which fsdp_app's set-up error path then reports once.
Datasets load_data_agreed(const Config& c, Communicator& world) {
  Datasets data;
  std::string error;
  try {
    data = load_data(c);
  } catch (const std::bad_alloc&) {
    error = "data: out of memory while loading";
  } catch (const std::exception& e) {
    error = *e.what() ? e.what() : "data: loading failed";
  }
  if (world.size() == 1) {
    if (!error.empty()) throw Error(error);
    return data;
  }
  int32_t first_and_failing[2] = {error.empty() ? world.size() : world.rank(), error.empty() ? 0 : 1};
  world.all_reduce(&first_and_failing[0], &first_and_failing[0], 1, DType::i32, ReduceOp::min)->wait();
  const int32_t first = first_and_failing[0];
  if (first == world.size()) return data;
  world.all_reduce(&first_and_failing[1], &first_and_failing[1], 1, DType::i32, ReduceOp::sum)->wait();
  int64_t len = static_cast<int64_t>(error.size());
  world.broadcast(&len, 1, DType::i64, first)->wait();
  std::string text = world.rank() == first ? error : std::string(static_cast<size_t>(len), '\0');
  world.broadcast(text.data(), static_cast<size_t>(len), DType::u8, first)->wait();
  // Name the rank only when it matters: when some ranks loaded their data.
  throw Error(first_and_failing[1] < world.size() ? text + " (on rank " + std::to_string(first) + ")" : text);
}

// TEST HOOKS for the fault-injection and crash-safety tests, read here and nowhere else (once,
// at set-up). Unset (always, outside the tests): every field -1, nothing happens.
//   FSDP_TEST_FAULT=skip_collective:RANK:STEP
//     rank RANK leaves out the step-loss all_reduce of step STEP (1-based) and goes on. The other
//     ranks then wait in it for a peer that never arrives, and the skipping rank waits in its next
//     collective for peers that never get there: each side must end by comm.timeout_s.
//   FSDP_TEST_KILL_RANK_DURING_SAVE=RANK[:STEP]
//     rank RANK dies in the middle of every save, or only of the save after STEP.
struct TestFault {
  int rank = -1;  // skip_collective
  int64_t step = -1;
  int kill_rank_during_save = -1;
  int64_t kill_save_step = -1;  // -1: every save
};

TestFault test_fault_from_env() {
  TestFault f;
  if (const char* text = std::getenv("FSDP_TEST_FAULT"); text && *text) {
    long long step = -1;
    // NOLINTNEXTLINE(cert-err34-c): a test hook's value, written by tests/fault; checked below
    if (std::sscanf(text, "skip_collective:%d:%lld", &f.rank, &step) != 2 || f.rank < 0 || step < 1)
      throw Error(std::string("FSDP_TEST_FAULT '") + text + "': expected skip_collective:RANK:STEP (a test hook)");
    f.step = step;
  }
  if (const char* kill = std::getenv("FSDP_TEST_KILL_RANK_DURING_SAVE")) {
    // NOLINTNEXTLINE(cert-err34-c): a test hook's value, written by the crash-safety tests
    f.kill_rank_during_save = std::atoi(kill);
    // NOLINTNEXTLINE(cert-err34-c): as above
    if (const char* colon = std::strchr(kill, ':')) f.kill_save_step = std::atoll(colon + 1);
  }
  return f;
}

// Everything the loop needs for one batch: this rank's slice of a global batch, in the
// buffers the model reads.
struct BatchBuffers {
  Tensor inputs, targets;
};

void load_batch(const Dataset& data, std::span<const int64_t> indices, BatchBuffers& b, MemoryTracker* mem) {
  int64_t n = static_cast<int64_t>(indices.size());
  Shape in = data.input_shape(), tg = data.target_shape();
  in.insert(in.begin(), n);
  tg.insert(tg.begin(), n);
  ensure(b.inputs, in, data.input_dtype(), MemCategory::activations, mem);
  ensure(b.targets, tg, DType::i32, MemCategory::activations, mem);
  data.fill(indices, b.inputs, b.targets);
}

// A device run reads its batch from device buffers: the host batch (read and checked there)
// is copied over, on the compute stream, once per micro-batch. Host runs use it as it is.
const BatchBuffers& upload_batch(DeviceRuntime& rt, const BatchBuffers& host, BatchBuffers& dev) {
  if (rt.device() == Device::cpu) return host;
  ensure(dev.inputs, host.inputs.shape(), host.inputs.dtype(), MemCategory::activations, rt);
  ensure(dev.targets, host.targets.shape(), host.targets.dtype(), MemCategory::activations, rt);
  // Pageable host memory: the copies are synchronous for the host, so `host` may be refilled next.
  rt.copy_async(dev.inputs.raw(), host.inputs.raw(), host.inputs.bytes(), CopyKind::host_to_device,
                rt.compute_stream());
  rt.copy_async(dev.targets.raw(), host.targets.raw(), host.targets.bytes(), CopyKind::host_to_device,
                rt.compute_stream());
  return dev;
}

// output.save_weights, one gathered unit: WeightWriter reads each param's data on the host. A
// host run writes the bound params in place. On a device run the unit's values (the gathered
// buffer, or under NO_SHARD in f32 the shard itself) are device memory: they are copied to a host
// staging buffer (charged `other` until written) and written through stand-in params bound to
// it, so the engine's bindings are never touched. The copy is enqueued on the compute stream,
// which wait_for_unshard made wait for the all_gather and the low-precision cast, and after the
// last optimizer step's kernels; the host waits for it.
// writer null: a plan (or a rank that does not write) stages as the writer's rank does.
void write_gathered_unit(WeightWriter* writer, const Unit& u, DeviceRuntime& rt, MemoryTracker& mem) {
  const FlatLayout& layout = u.layout;
  if (rt.device() == Device::cpu || layout.params.empty()) {
    if (writer) writer->write(layout.params);
    return;
  }
  const float* unit_values = layout.params[0]->data - layout.offsets[0];  // the unit's flat buffer
  Tensor host = Tensor::empty({layout.numel}, DType::f32, MemCategory::other, &mem);
  const Stream s = rt.compute_stream();
  rt.copy_async(host.raw(), unit_values, host.bytes(), CopyKind::device_to_host, s);
  rt.synchronize(s);
  std::vector<Param> staged;
  staged.reserve(layout.params.size());
  std::vector<Param*> staged_ptrs;
  for (size_t i = 0; i < layout.params.size(); ++i) {
    staged.push_back(*layout.params[i]);  // name and shape
    staged.back().data = host.f32() + layout.offsets[i];
    staged.back().grad = nullptr;
    staged_ptrs.push_back(&staged.back());
  }
  if (writer) writer->write(staged_ptrs);
}

struct EvalResult {
  double loss = 0.0, accuracy = 0.0;
};

// Each rank evaluates its slice of every eval batch (through the FSDP hooks, so units are
// gathered as in training); the sums are added over all ranks at the end.
EvalResult evaluate(Model& model, FsdpEngine& engine, const Dataset& data, const Config& c, const RunEnv& env,
                    MemoryTracker& mem) {
  const int64_t global = c.train.eval_batch_size * env.world_size;
  Sampler sampler({data.size(), global, false, false, c.train.seed});
  RunCtx ctx;
  ctx.mem = &mem;
  ctx.training = false;
  ctx.hooks = &engine;
  ctx.runtime = &engine.runtime();
  BatchBuffers b, dev;
  double sums[2] = {0.0, 0.0};  // loss, correct
  for (int64_t s = 0; s < sampler.steps_per_epoch(); ++s) {
    std::vector<int64_t> idx = sampler.global_batch(0, s);
    auto [offset, count] = Sampler::rank_slice(static_cast<int64_t>(idx.size()), env.rank, env.world_size);
    load_batch(data, std::span<const int64_t>(idx.data() + offset, count), b, &mem);
    const BatchBuffers& in = upload_batch(engine.runtime(), b, dev);
    model.forward(ctx, in.inputs, in.targets);
    engine.end_forward_only();
    sums[0] += model.loss().last_sum();
    sums[1] += static_cast<double>(model.loss().last_correct());
  }
  engine.world().all_reduce(sums, sums, 2, DType::f64, ReduceOp::sum)->wait();
  double elems = static_cast<double>(data.size()) * model.loss_elements_per_sample();
  return {sums[0] / elems, sums[1] / elems};
}

// mpirun hands ranks a pseudo-terminal even when its own output goes to a file, so under a
// launcher the progress line would fill logs with carriage returns: plain lines there.
bool interactive_terminal() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID"})
    if (std::getenv(var)) return false;
  return isatty(fileno(stdout));
}

bool eval_due(const std::string& every, int64_t step_done, bool epoch_end) {
  if (every == "never") return false;
  if (every == "epoch") return epoch_end;
  return step_done % std::stoll(every) == 0;
}

// torch.cuda.amp.GradScaler's rule, for f16 parameters or reductions: start at init_loss_scale
// (2^16 by default), halve and
// skip the step on an overflow, double after 2000 good steps in a row.
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

}  // namespace

struct Trainer::State {
  const Config c;  // a copy: the caller's Config may be gone before run()
  RunEnv env;
  MemoryTracker mem;
  std::unique_ptr<DeviceRuntime> runtime;     // train.device: where tensors live, kernels run
  std::unique_ptr<Communicator> local_world;  // when env.world is null
  // A device run: comm.backend over the world's ranks, taking device buffers (NCCL natively,
  // MPI/UCX through staging or CUDA-aware MPI). FSDP's shard and replicate groups split from it.
  std::unique_ptr<Communicator> device_world;
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
  TestFault fault;          // FSDP_TEST_* hooks (tests only)
  State(const Config& config, int world_size) : c(for_world_size(config, world_size)) {}
};

namespace {

// Every rank's node color, in world order (the mesh and the mesh report need the whole list).
std::vector<int> gather_node_colors(const RunEnv& env) {
  if (!env.node_color_of_rank.empty()) return env.node_color_of_rank;
  std::vector<int32_t> colors(static_cast<size_t>(env.world_size), env.node_color);
  if (env.world_size > 1) {
    int32_t mine = env.node_color;
    env.world->all_gather(&mine, colors.data(), 1, DType::i32)->wait();
  }
  return {colors.begin(), colors.end()};
}

// Host memory this node can still give (MemAvailable), or 0 when /proc/meminfo does not say.
int64_t host_available_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  long long kib = 0;
  while (std::fgets(line, sizeof line, f))
    // NOLINTNEXTLINE(cert-err34-c): a kernel file's fixed format; no match leaves kib 0
    if (std::sscanf(line, "MemAvailable: %lld kB", &kib) == 1) break;
  std::fclose(f);
  return kib * 1024;
}

// A run that cannot fit is refused before it allocates, with the numbers, instead of being
// killed by the kernel's OOM killer minutes later. Host memory only: on a device run the tracker
// mixes device memory and host staging, and the device's free memory is not asked for here.
void check_plan_fits(const MemoryPlan& plan, const RunEnv& env, const std::vector<int>& node_colors,
                     Device device) {
  if (device != Device::cpu) return;
  const int64_t available = host_available_bytes();
  if (available <= 0) return;
  const auto ranks_here = static_cast<int64_t>(std::count(node_colors.begin(), node_colors.end(), env.node_color));
  const int64_t need = ranks_here * plan.total_peak_bytes;
  if (need <= available) return;
  throw Error("memory plan: " + std::to_string(ranks_here) + " rank" + (ranks_here == 1 ? "" : "s") +
              " on this node would need " + std::to_string(ranks_here) + " x " +
              human_bytes(static_cast<double>(plan.total_peak_bytes)) + " = " +
              human_bytes(static_cast<double>(need)) + " at their peak, and the node has " +
              human_bytes(static_cast<double>(available)) +
              " available (MemAvailable); see fsdp_app --plan: shard more (FULL_SHARD, more ranks or nodes) or "
              "lower train.batch_size");
}

}  // namespace

Trainer::Trainer(const Config& config, const RunEnv& env_in) : s_(std::make_unique<State>(config, env_in.world_size)) {
  State& s = *s_;
  const Config& c = s.c;
  s.env = env_in;
  if (!s.env.world) {
    s.local_world = make_local_communicator({c.comm.timeout_s});
    s.env.world = s.local_world.get();
  }
  if (c.train.threads > 0 && !s.env.planning) {
    openblas_set_num_threads(static_cast<int>(c.train.threads));
    omp_set_num_threads(static_cast<int>(c.train.threads));
  }
  if (!s.env.planning) s.fault = test_fault_from_env();
  // The device before the data: "no CUDA device" should not wait for a dataset to load.
  const Device device = parse_device(c.train.device);
  s.runtime = s.env.make_runtime ? s.env.make_runtime(s.mem, s.env.local_rank)
                                 : make_runtime(device, s.mem, s.env.local_rank);
  // Data first: a missing dataset should fail before minutes of model set-up.
  if (s.env.train_data && s.env.eval_data)
    s.data = {s.env.train_data, s.env.eval_data};
  else
    s.data = load_data_agreed(c, *s.env.world);
  s.node_colors = gather_node_colors(s.env);
  const std::vector<int>& node_colors = s.node_colors;
  // The plan, before anything of the model is allocated: a run that cannot fit stops here.
  if (!s.env.planning) {
    PlanRequest request;
    request.world_size = s.env.world_size;
    request.node_color_of_rank = node_colors;
    request.train_data = s.data.train;
    request.eval_data = s.data.eval;
    s.plan = plan_memory(c, request);
    check_plan_fits(s.plan, s.env, node_colors, device);
  }
  s.model = make_model(c.model);
  if (s.data.train->num_classes() > (c.model.kind == "transformer" ? c.model.vocab : 10))
    throw Error("data has " + std::to_string(s.data.train->num_classes()) + " classes, more than the model's outputs");

  // Units, shards and the mesh; each rank materialises only its own slices.
  FsdpOptions fo = fsdp_options(c.fsdp);
  Communicator* data_world = s.env.world;
  if (s.runtime->device() != Device::cpu && s.env.mpi_comm != MPI_COMM_NULL) {
    CommOptions co{c.comm.timeout_s};
    co.runtime = s.runtime.get();
    s.device_world = make_communicator(c.comm.backend, s.env.mpi_comm, co);
    data_world = s.device_world.get();
  }
  ProcessMesh mesh = make_mesh(*data_world, fo.strategy, fo.shard_group_size, node_colors);
  s.engine = std::make_unique<FsdpEngine>(*s.model, *s.env.world, std::move(mesh), fo, s.mem, s.runtime.get());
  s.engine->init_shards(c.train.seed);
  s.scaler.enabled = fo.param_dtype == DType::f16 || fo.reduce_dtype == DType::f16;
  s.scaler.scale = c.fsdp.mixed_precision.init_loss_scale;
  // The optimizer steps where the shards are: the device, or the host under cpu_offload.
  s.optimizer = make_optimizer(c.train.optimizer, static_cast<int64_t>(s.engine->param_shards().size()),
                               s.engine->shard_runtime());

  // The schedule of global batches: the same for any world size.
  s.micro_global = c.train.batch_size * s.env.world_size;
  s.global_batch = s.micro_global * c.train.grad_accum;
  s.sampler = std::make_unique<Sampler>(
      SamplerOptions{s.data.train->size(), s.global_batch, c.train.shuffle, true, c.train.seed});
  s.steps_per_epoch = s.sampler->steps_per_epoch();
  s.total_steps = c.train.steps > 0 ? c.train.steps : c.train.epochs * s.steps_per_epoch;
  s.schedule = std::make_unique<LrSchedule>(c.train.scheduler, c.train.optimizer.lr, s.total_steps);

  if (s.env.planning) {
    // A plan touches no file. A resume is assumed to find its file: what it costs is the staging
    // of the state it loads (device shards), held while the file is read.
    if (!c.checkpoint.resume.empty()) HostCheckpointState(*s.engine, *s.optimizer, s.mem).copy_to_device(true);
    if (!c.model.init_from.empty()) s.engine->load_full_weights(c.model.init_from);  // reads nothing on meta
    return;
  }
  // Resume last: it overwrites the shards and optimizer state just made. Collective, and its
  // errors are agreed on inside, so a bad file is still a set-up error reported once.
  if (!c.checkpoint.dir.empty()) prepare_checkpoint_dir(c.checkpoint.dir);
  if (!c.checkpoint.resume.empty()) {
    // auto: the newest complete file whose values are finite; a diverged one (written by an older
    // version, or by another tool) is passed over with a note. Every rank sees the same list and
    // the same load outcome (errors are agreed on inside the load), so all take the same branch.
    const std::vector<std::string> paths = resolve_resume(c.checkpoint, s.env.mpi_comm, &s.resume_note);
    for (size_t i = 0; i < paths.size() && !s.resumed; ++i) {
      try {
        resume(paths[i]);
      } catch (const NonFiniteCheckpoint& e) {
        if (c.checkpoint.resume != "auto") throw;
        s.resume_note.append("checkpoint: skipping ").append(e.what()).append("\n");
        // The shards now hold that file's values: only another complete load may follow.
        if (i + 1 == paths.size())
          throw Error("checkpoint.resume auto: every checkpoint in " + c.checkpoint.dir +
                      " holds non-finite values; move them away to start fresh");
      }
    }
  }
  // model.init_from: rank 0 checks the file and tells everyone before any data moves, so a bad
  // file fails every rank alike — a set-up error reported once. A resumed run has its weights.
  if (!c.model.init_from.empty() && !s.resumed) s.engine->load_full_weights(c.model.init_from);
}

void Trainer::resume(const std::string& path) {
  State& s = *s_;
  LoadOptions options;
  options.optimizer = s.c.train.optimizer.kind;
  CheckpointStats stats;
  HostCheckpointState staged(*s.engine, *s.optimizer, s.mem);
  CheckpointMeta m = load_checkpoint(path, staged.state(), options, s.env.mpi_comm, &stats);
  staged.copy_to_device(options.optimizer_state);  // a load that threw left the device values as they were
  s.resumed = true;
  s.last_good = path;
  s.start_step = m.step;
  s.optimizer->set_step_count(m.optimizer_step);
  if (s.scaler.enabled && m.loss_scale > 0) {
    s.scaler.scale = m.loss_scale;
    s.scaler.good_steps = m.loss_scale_good_steps;
  }
  s.best_eval_loss = m.best_eval_loss;
  char line[512];
  std::snprintf(line, sizeof line,
                "checkpoint: resumed from %s at step %lld (written by %lld rank%s, %s); %.1f MB in %.2f s\n",
                path.c_str(), static_cast<long long>(m.step), static_cast<long long>(m.world_size),
                m.world_size == 1 ? "" : "s", m.strategy.c_str(), stats.bytes / 1e6, stats.seconds);
  s.resume_note += line;
  if (m.global_batch_size != s.global_batch)
    s.resume_note += "checkpoint: note: global batch " + std::to_string(m.global_batch_size) + " -> " +
                     std::to_string(s.global_batch) + "; the sample order from here on differs from the original run\n";
}

CheckpointMeta Trainer::position(int64_t steps_done, double lr) const {
  const State& s = *s_;
  const Config& c = s.c;
  CheckpointMeta m;
  m.step = steps_done;
  m.epoch = steps_done / s.steps_per_epoch;
  m.step_in_epoch = steps_done % s.steps_per_epoch;
  m.steps_per_epoch = s.steps_per_epoch;
  m.world_size = s.env.world_size;
  m.shard_group_size = s.engine->mesh().shard->size();
  m.global_batch_size = s.global_batch;
  m.seed = static_cast<int64_t>(c.train.seed);
  m.strategy = c.fsdp.sharding_strategy;
  m.backend = c.comm.backend;
  m.wrap_policy = c.fsdp.wrap_policy;
  m.model_kind = c.model.kind;
  m.optimizer = c.train.optimizer.kind;
  m.optimizer_step = s.optimizer->step_count();
  m.scheduler = c.train.scheduler.kind;
  m.lr = lr;
  m.loss_scale = s.scaler.enabled ? s.scaler.scale : 0.0;
  m.loss_scale_good_steps = s.scaler.good_steps;
  m.best_eval_loss = s.best_eval_loss;
  m.config_yaml = c.yaml_text;
  return m;
}

std::string Trainer::diverged(int64_t step, const std::string& what) const {
  const std::string& good = s_->last_good;
  return "step " + std::to_string(step) + ": " + what + "; the run diverged and stops (" +
         (good.empty() ? std::string("no checkpoint of this run to go back to") : "last good checkpoint: " + good) +
         ")";
}

CheckpointStats Trainer::save(const std::string& path, int64_t steps_done, double lr) {
  State& s = *s_;
  HostCheckpointState staged(*s.engine, *s.optimizer, s.mem);
  staged.copy_from_device();
  if (s.env.planning) return {};  // a plan stages the state as a save does and writes nothing
  SaveOptions options;
  options.format = parse_checkpoint_format(s.c.checkpoint.format);
  options.collective = s.c.checkpoint.io == "collective";
  if (s.fault.kill_save_step < 0 || s.fault.kill_save_step == steps_done)  // FSDP_TEST_KILL_RANK_DURING_SAVE
    options.kill_rank = s.fault.kill_rank_during_save;
  CheckpointStats stats;
  try {
    stats = save_checkpoint(path, staged.state(), position(steps_done, lr), options, s.env.mpi_comm);
  } catch (const NonFiniteCheckpoint& e) {
    throw AgreedError(diverged(steps_done, e.what()));
  }
  s.last_good = path;
  if (s.env.rank == 0) {
    std::printf("checkpoint: step %lld saved to %s, %.1f MB in %.2f s (%.2f GB/s)\n",
                static_cast<long long>(steps_done), path.c_str(), stats.bytes / 1e6, stats.seconds,
                stats.bytes / 1e9 / std::max(stats.seconds, 1e-9));
    std::fflush(stdout);
  }
  return stats;
}

Trainer::~Trainer() = default;

Trainer::StepResult Trainer::train_step(int64_t step, double lr) {
  State& s = *s_;
  const Config& c = s.c;
  const RunEnv& env = s.env;
  FsdpEngine& engine = *s.engine;
  RunCtx ctx;
  ctx.mem = &s.mem;
  ctx.seed = c.train.seed;
  ctx.dropout = c.train.dropout;
  ctx.hooks = &engine;
  ctx.runtime = &engine.runtime();
  ctx.loss_normalizer = static_cast<double>(s.global_batch) * s.model->loss_elements_per_sample();
  ctx.training = true;
  ctx.step = step;
  ctx.loss_scale = s.scaler.enabled ? s.scaler.scale : 1.0;
  const int64_t epoch = step / s.steps_per_epoch, step_in_epoch = step % s.steps_per_epoch;
  std::vector<int64_t> global = s.sampler->global_batch(epoch, step_in_epoch);

  // Forward/backward per micro-batch; only the last one reduces gradients (no_sync).
  StepResult r;
  r.loss_scale = ctx.loss_scale;
  engine.begin_step();
  for (int64_t m = 0; m < c.train.grad_accum; ++m) {
    auto [offset, count] = Sampler::rank_slice(s.micro_global, env.rank, env.world_size);
    std::span<const int64_t> mine(global.data() + m * s.micro_global + offset, count);
    ctx.sample_offset = step * s.global_batch + m * s.micro_global + offset;
    load_batch(*s.data.train, mine, s.batch, &s.mem);
    const BatchBuffers& in = upload_batch(engine.runtime(), s.batch, s.dev_batch);
    engine.set_sync_grads(m + 1 == c.train.grad_accum);
    r.loss += s.model->forward(ctx, in.inputs, in.targets);
    s.model->backward(ctx);
  }
  engine.finish_backward();
  if (env.rank == s.fault.rank && step + 1 == s.fault.step) {  // FSDP_TEST_FAULT (tests only)
    std::fprintf(stderr, "fsdp_app: rank %d: FSDP_TEST_FAULT: skipping the loss all_reduce of step %lld\n", env.rank,
                 static_cast<long long>(step) + 1);
    std::fflush(stderr);
  } else {
    env.world->all_reduce(&r.loss, &r.loss, 1, DType::f64, ReduceOp::sum)->wait();
  }

  // With f16 loss scaling a non-finite step is the rule (the scaler skips it and lowers the
  // scale); otherwise it means divergence: stop before the optimizer writes it into the weights.
  // The loss and the norm are all-reduced values, so every rank stops at the same step.
  auto number = [](double v) {
    return std::isnan(v) ? std::string("nan") : std::isinf(v) ? (v > 0 ? "inf" : "-inf") : std::to_string(v);
  };
  if (!s.scaler.enabled && !std::isfinite(r.loss)) throw AgreedError(diverged(step + 1, "the loss is " + number(r.loss)));
  r.applied = s.scaler.update(engine);  // false: an f16 overflow, the step is skipped
  if (r.applied) {
    if (c.train.clip_grad_norm > 0.0) r.grad_norm = engine.clip_grad_norm(c.train.clip_grad_norm);
    if (!s.scaler.enabled && !std::isfinite(r.grad_norm))
      throw AgreedError(diverged(step + 1, "the gradient norm is " + number(r.grad_norm)));
    s.optimizer->step(engine.param_shards(), engine.grad_shards(), lr);
  }
  return r;
}

void Trainer::write_weights() {
  State& s = *s_;
  const bool leader = s.env.rank == 0;
  std::unique_ptr<WeightWriter> writer;
  if (leader && !s.env.planning) writer = std::make_unique<WeightWriter>(s.c.output.save_weights);
  s.engine->for_each_gathered_unit([&](const Unit& u) {
    if (leader) write_gathered_unit(writer.get(), u, s.engine->runtime(), s.mem);
  });
  if (writer) writer->commit();
}

MemoryPlan Trainer::plan() {
  State& s = *s_;
  const Config& c = s.c;
  FsdpEngine& engine = *s.engine;
  MemoryPlan plan;
  // The schedule: two steps (the second gathers while the first's buffers are all alive: the
  // steady state); a periodic save; an evaluation, then a step after it and another evaluation
  // (activation buffers change shape both ways); the closing save; output.save_weights.
  const double lr = c.train.optimizer.lr;
  int64_t step = 0;
  auto step_once = [&] {
    train_step(step++, lr);
    const StepTraffic& t = engine.step_traffic();
    plan.all_gather = t.all_gather;
    plan.reduce_scatter = t.reduce_scatter;
    plan.all_reduce = t.all_reduce;
  };
  auto evaluate_once = [&] { evaluate(*s.model, engine, *s.data.eval, c, s.env, s.mem); };
  while (step < std::min<int64_t>(s.total_steps, 2)) step_once();
  const bool saves = !c.checkpoint.dir.empty();
  if (saves && c.checkpoint.every_steps > 0) save("", step, lr);
  if (c.train.eval_every != "never" && s.total_steps > 0) {
    evaluate_once();
    const bool step_after_eval = c.train.eval_every == "epoch" ? s.total_steps > s.steps_per_epoch
                                                               : std::stoll(c.train.eval_every) < s.total_steps;
    if (step_after_eval) {
      step_once();
      evaluate_once();
    }
  }
  if (saves) save("", step, lr);
  if (!c.output.save_weights.empty()) write_weights();

  plan.model = c.model.kind;
  plan.strategy = std::string(strategy_name(engine.options().strategy));
  plan.world_size = s.env.world_size;
  plan.shard_group_size = engine.mesh().shard->size();
  plan.replicas = engine.mesh().replicate->size();
  plan.num_params = s.model->num_params();
  for (const auto& u : engine.units())
    plan.units.push_back({u->spec.name, u->layout.numel, u->padded_numel, u->shard_numel});
  for (size_t i = 0; i < kMemCategoryCount; ++i)
    plan.peak_bytes[i] = static_cast<int64_t>(s.mem.peak_bytes(static_cast<MemCategory>(i)));
  plan.total_peak_bytes = static_cast<int64_t>(s.mem.peak_total_bytes());
  if (engine.options().activation_checkpointing)
    plan.notes.emplace_back("activation checkpointing: wrapped units recompute in backward");
  return plan;
}

TrainSummary Trainer::run() {
  State& s = *s_;
  const Config& c = s.c;
  const RunEnv& env = s.env;
  Model& model = *s.model;
  FsdpEngine& engine = *s.engine;
  MemoryTracker& mem = s.mem;
  const bool leader = env.rank == 0;
  MetricsFile metrics(leader ? c.output.metrics : "", s.resumed);
  const bool tty = leader && interactive_terminal();
  const bool lm = c.model.kind == "transformer";
  const int64_t elems_per_sample = model.loss_elements_per_sample();
  const int64_t total_steps = s.total_steps, steps_per_epoch = s.steps_per_epoch, global_batch = s.global_batch;
  if (leader)
    std::printf(
        "fsdp_app: %s, %lld parameters, %s on %d rank%s (%s, %zu units), %s, %lld train / %lld eval samples, %lld "
        "steps (%lld per epoch)\n",
        c.model.kind.c_str(), static_cast<long long>(model.num_params()), c.fsdp.sharding_strategy.c_str(),
        env.world_size, env.world_size == 1 ? "" : "s", c.comm.backend.c_str(), engine.units().size(),
        c.data.kind.c_str(), static_cast<long long>(s.data.train->size()), static_cast<long long>(s.data.eval->size()),
        static_cast<long long>(total_steps), static_cast<long long>(steps_per_epoch));
  if (env.world_size > 1) {
    // The nodes MPI found (MPI_COMM_TYPE_SHARED: node_color), each named by its first rank's
    // host name, and the mesh made of them: HYBRID's shard groups are those nodes, and a log
    // should show what was detected. Counted by node_color, not by name: containers or emulated
    // nodes may share a host name.
    constexpr size_t kHostBytes = 64;
    char host[kHostBytes] = {};
    gethostname(host, kHostBytes - 1);
    std::vector<char> hosts(kHostBytes * env.world_size);
    const std::vector<int>& colors = s.node_colors;
    env.world->all_gather(host, hosts.data(), kHostBytes, DType::u8)->wait();
    if (leader) {
      std::string nodes;
      std::vector<int> seen;
      for (int r = 0; r < env.world_size; ++r) {
        if (std::find(seen.begin(), seen.end(), colors[r]) != seen.end()) continue;
        seen.push_back(colors[r]);
        std::string ranks;
        for (int q = r; q < env.world_size; ++q)
          if (colors[q] == colors[r]) ranks += (ranks.empty() ? "" : ",") + std::to_string(q);
        nodes += (nodes.empty() ? "" : "; ") + std::string(hosts.data() + r * kHostBytes) + ": ranks " + ranks;
      }
      const bool hybrid = engine.options().strategy == Strategy::hybrid_shard ||
                          engine.options().strategy == Strategy::hybrid_shard_zero2;
      const char* how = !hybrid ? "" : c.fsdp.shard_group_size == 0 ? " (one per node, detected)" : " (configured)";
      std::printf("mesh: %zu node%s (%s); shard groups of %d%s, %d replica%s\n", seen.size(),
                  seen.size() == 1 ? "" : "s", nodes.c_str(), engine.mesh().shard->size(), how,
                  engine.mesh().replicate->size(), engine.mesh().replicate->size() == 1 ? "" : "s");
    }
  }
  if (leader && !s.resume_note.empty()) std::fputs(s.resume_note.c_str(), stdout);

  const CheckpointConfig& ck = c.checkpoint;
  int64_t last_saved_step = -1;
  auto save_step = [&](int64_t done, double lr) {
    if (done == last_saved_step) return;
    CheckpointStats st = save(checkpoint_path(ck.dir, done), done, lr);
    last_saved_step = done;
    if (leader) {
      prune_checkpoints(ck.dir, ck.keep, done);
      metrics.write(JsonLine()
                        .str("event", "checkpoint")
                        .integer("step", done)
                        .str("path", checkpoint_path(ck.dir, done))
                        .integer("bytes", st.bytes)
                        .num("save_s", st.seconds));
    }
  };

  TrainSummary summary;
  summary.start_step = s.start_step;
  summary.steps = s.start_step;
  double timed_s = 0.0;
  int64_t timed_samples = 0;
  int64_t last_eval_step = -1;
  double lr = s.schedule->lr(s.start_step, s.start_step / steps_per_epoch);
  auto run_eval = [&](int64_t step_done, int64_t epoch) {
    EvalResult r = evaluate(model, engine, *s.data.eval, c, env, mem);
    summary.eval_loss = r.loss;
    summary.eval_accuracy = r.accuracy;
    last_eval_step = step_done;
    if (ck.save_best && (s.best_eval_loss < 0 || r.loss < s.best_eval_loss)) {
      s.best_eval_loss = r.loss;
      save(best_checkpoint_path(ck.dir), step_done, lr);
    }
    if (!leader) return;
    if (tty) std::printf("\n");
    std::printf("eval step %lld epoch %lld: loss %.6f accuracy %.2f%%\n", static_cast<long long>(step_done),
                static_cast<long long>(epoch) + 1, r.loss, 100.0 * r.accuracy);
    std::fflush(stdout);
    metrics.write(JsonLine()
                      .integer("step", step_done)
                      .integer("epoch", epoch + 1)
                      .num("eval_loss", r.loss)
                      .num("eval_accuracy", r.accuracy));
  };

  const int64_t end_step =
      c.train.stop_after_steps > 0 ? std::min(total_steps, s.start_step + c.train.stop_after_steps) : total_steps;
  for (int64_t step = s.start_step; step < end_step; ++step) {
    const int64_t epoch = step / steps_per_epoch, step_in_epoch = step % steps_per_epoch;
    const auto t0 = Clock::now();
    lr = s.schedule->lr(step, epoch);
    const StepResult r = train_step(step, lr);
    const double loss = r.loss, grad_norm = r.grad_norm;
    const bool step_ok = r.applied;

    const double step_s = seconds_since(t0);
    const int64_t done = step + 1;
    if (step > 0) {  // the first step pays for allocations
      timed_s += step_s;
      timed_samples += global_batch;
    }
    summary.steps = done;
    summary.last_loss = loss;
    const double rate = global_batch / step_s;
    if (leader) {
      JsonLine j;
      j.integer("step", done).integer("epoch", epoch + 1).num("loss", loss).num("lr", lr).num("step_time_s", step_s);
      j.num("samples_per_s", rate);
      if (lm) j.num("tokens_per_s", rate * elems_per_sample);
      if (grad_norm >= 0.0) j.num("grad_norm", grad_norm);  // before clipping, as PyTorch returns it
      if (s.scaler.enabled) j.num("loss_scale", r.loss_scale).integer("step_skipped", step_ok ? 0 : 1);
      j.raw("mem_peak_bytes", mem_peaks_json(mem)).raw("mem_plan_bytes", s.plan.peaks_json());
      metrics.write(j);
      if (tty) {
        std::printf("\r[epoch %lld] step %lld/%lld  loss %.4f  lr %.3g  %.0f %s/s   ",
                    static_cast<long long>(epoch) + 1, static_cast<long long>(done),
                    static_cast<long long>(total_steps), loss, lr, lm ? rate * elems_per_sample : rate,
                    lm ? "tokens" : "samples");
        std::fflush(stdout);
      } else if (done % c.output.log_every == 0 || done == total_steps) {
        std::printf("step %lld/%lld epoch %lld loss %.6f lr %.6g %.1f %s/s\n", static_cast<long long>(done),
                    static_cast<long long>(total_steps), static_cast<long long>(epoch) + 1, loss, lr,
                    lm ? rate * elems_per_sample : rate, lm ? "tokens" : "samples");
        std::fflush(stdout);
      }
    }
    const bool epoch_end = step_in_epoch == steps_per_epoch - 1;
    if (eval_due(c.train.eval_every, done, epoch_end)) run_eval(done, epoch);
    if (ck.every_steps > 0 && done % ck.every_steps == 0) save_step(done, lr);
  }
  const bool finished = summary.steps == total_steps;
  // The closing evaluation belongs to the end of training, not to a launch that stops early.
  if (finished && c.train.eval_every != "never" && last_eval_step != summary.steps && total_steps > 0)
    run_eval(summary.steps, (total_steps - 1) / steps_per_epoch);
  if (!ck.dir.empty() && summary.steps > s.start_step) save_step(summary.steps, lr);
  if (tty && c.train.eval_every == "never") std::printf("\n");
  summary.samples_per_s = timed_s > 0 ? timed_samples / timed_s : 0.0;
  if (!c.output.save_weights.empty()) write_weights();
  if (leader) {
    std::printf("done: %lld steps, %.1f samples/s, peak memory %.1f MiB (planned %.1f MiB)\n",
                static_cast<long long>(summary.steps), summary.samples_per_s, mem.peak_total_bytes() / 1048576.0,
                s.plan.total_peak_bytes / 1048576.0);
    metrics.write(JsonLine()
                      .str("event", "done")
                      .integer("steps", summary.steps)
                      .num("samples_per_s", summary.samples_per_s)
                      .raw("mem_peak_bytes", mem_peaks_json(mem))
                      .raw("mem_plan_bytes", s.plan.peaks_json()));
  }
  return summary;
}

TrainSummary train(const Config& config, const RunEnv& env) {
  Trainer trainer(config, env);
  return trainer.run();
}

}  // namespace fsdp
