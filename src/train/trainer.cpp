// The trainer: set-up (the constructor), one training step, the loop of named calls, and the
// memory plan's schedule. Checkpoints and weights: save_resume.cpp; the banner: banner.cpp;
// evaluation: evaluate.cpp; the data and batches: batches.cpp; loss scaling: trainer_state.h.
#include "train/trainer.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>

#include "ckpt/checkpoint.h"
#include "nn/activation_stash.h"
#include "tensor/error.h"
#include "tensor/timeline.h"
#include "train/checkpointing.h"
#include "train/generation.h"
#include "train/model_from_config.h"
#include "train/run_schedule.h"
#include "train/trace_file.h"
#include "train/trainer_state.h"

namespace fsdp {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

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

// The validation pairs of a sequence-to-sequence family, whose data is pairs by construction
// (batches.cpp loads them for ModelTask::seq2seq); nullptr for the other tasks. The one downcast.
const Seq2SeqDataset* eval_pairs(const ModelConfig& model, const Datasets& data) {
  if (model.family().task != ModelTask::seq2seq) return nullptr;
  return &dynamic_cast<const Seq2SeqDataset&>(*data.eval);
}

}  // namespace

// Set-up, in the order failures should surface: the device before the data ("no CUDA device"
// should not wait for a dataset to load), the data before the model (a missing dataset should fail
// before minutes of model set-up). Nothing of the model exists yet.
std::unique_ptr<Trainer::State> Trainer::prepare(const Config& config, const RunEnv& env_in) {
  auto state = std::make_unique<State>(config, env_in.world_size);
  State& s = *state;
  const Config& c = s.c;
  s.env = env_in;
  if (c.train.threads > 0 && !s.env.planning) {
    openblas_set_num_threads(static_cast<int>(c.train.threads));
    omp_set_num_threads(static_cast<int>(c.train.threads));
  }
  const Device device = c.train.device;
  s.runtime =
      s.env.make_runtime ? s.env.make_runtime(s.mem, s.env.local_rank) : make_runtime(device, s.mem, s.env.local_rank);
  s.runtime->kernels().set_matmul_precision(c.train.matmul_precision);
  // Before the plan and the model: both build from the resolved key.
  s.attention_note = resolve_attention(s.c, s.runtime->kernels());
  s.comms = make_run_communicators(c, s.env.mpi_comm, *s.runtime, !s.env.world, s.env.decorate_world);
  if (!s.env.world) s.env.world = s.comms.world.get();
  if (s.env.train_data && s.env.eval_data)
    s.data = {s.env.train_data, s.env.eval_data};
  else
    s.data = load_data_agreed(c, *s.env.world);
  s.node_colors = gather_node_colors(s.env);
  return state;
}

// Plan, check, build: the memory plan runs the real step on the meta device with this run's data
// and node map before anything of the model is allocated, so a run that cannot fit stops here.
// A plan's own trainer (env.planning) is built without one.
std::unique_ptr<Trainer> Trainer::create(const Config& config, const RunEnv& env) {
  std::unique_ptr<State> s = prepare(config, env);
  if (!s->env.planning) {
    PlanRequest request;
    request.world_size = s->env.world_size;
    request.node_color_of_rank = s->node_colors;
    request.train_data = s->data.train;
    request.eval_data = s->data.eval;
    s->plan = plan_memory(s->c, request);
    const auto ranks_here = std::count(s->node_colors.begin(), s->node_colors.end(), s->env.node_color);
    check_plan_fits(s->plan, static_cast<int>(ranks_here), *s->runtime);
  }
  return std::unique_ptr<Trainer>(new Trainer(std::move(s)));
}

Trainer::Trainer(std::unique_ptr<State> prepared) : s_(std::move(prepared)) {
  State& s = *s_;
  const Config& c = s.c;
  const std::vector<int>& node_colors = s.node_colors;
  s.model = make_model(c.model);
  const int64_t outputs = c.model.family().outputs(c.model.args);
  if (s.data.train->num_classes() > outputs)
    throw Error("data has " + std::to_string(s.data.train->num_classes()) + " classes, more than the model's outputs");

  // Units, shards and the mesh; each rank materialises only its own slices.
  FsdpOptions fo = fsdp_options(c.fsdp);
  Communicator* data_world = s.comms.device ? s.comms.device.get() : s.env.world;
  ProcessMesh mesh = make_mesh(*data_world, fo.strategy, fo.shard_group_size, node_colors);
  s.engine = std::make_unique<FsdpEngine>(*s.model, *s.env.world, std::move(mesh), fo, s.mem, s.runtime.get());
  if (!s.env.planning) {
    s.tracer = std::make_unique<Tracer>(*s.runtime, !c.output.trace.empty(), c.output.trace_first_step,
                                        c.output.trace_last_step);
    s.engine->set_tracer(s.tracer.get());
    if (s.tracer->tracing()) s.trace_clock = align_trace_clock(*s.env.world, node_colors);
  }
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

  restore();
}

Trainer::~Trainer() = default;

GenerationOptions Trainer::generation_options() const {
  const State& s = *s_;
  const GenerateConfig& g = s.c.generate;
  GenerationOptions o;
  const ModelFamily& family = s.c.model.family();
  if (family.task == ModelTask::causal_lm) {  // prompts cut from the samples
    const int64_t seq_len = s.c.model.args.i64(family.seq_len_key);
    o.prompt_len = g.prompt_len > 0 ? g.prompt_len : std::max<int64_t>(1, seq_len / 2);
    // The reference: the sample's tokens after the prompt, its last target included.
    o.search.max_new_tokens = g.max_new_tokens > 0 ? g.max_new_tokens : seq_len - o.prompt_len + 1;
  } else {
    o.search.max_new_tokens = g.max_new_tokens > 0 ? g.max_new_tokens : s.c.data.target_len;
  }
  o.search.num_beams = g.num_beams;
  o.search.length_penalty = g.length_penalty;
  o.search.do_sample = g.do_sample;
  o.search.temperature = g.temperature;
  o.search.top_k = g.top_k;
  o.search.top_p = g.top_p;
  o.search.seed = s.c.train.seed;
  o.batch_size = g.batch_size > 0 ? g.batch_size : s.c.train.eval_batch_size;
  o.rank = s.env.rank;
  o.world_size = s.env.world_size;
  o.progress = s.progress.tty;
  return o;
}

int64_t Trainer::rouge_samples() const {
  const State& s = *s_;
  if (!eval_pairs(s.c.model, s.data)) return 0;
  const int64_t n = s.c.generate.rouge_samples;
  const int64_t all = s.data.eval->size();
  if (n < 0) return s.c.data.kind == DataKind::seq2seq ? all : 0;  // synthetic pairs: no text to score
  return std::min(n, all);
}

void Trainer::generate(int64_t count) {
  State& s = *s_;
  if (!s.c.model.family().generates)
    throw Error("--generate needs a model that generates (model.kind " + generating_family_names() + ")");
  const Seq2SeqDataset* data = eval_pairs(s.c.model, s.data);
  if (!data) {  // a causal LM: prompts from the validation samples
    const GenerationOptions o = generation_options();
    count = std::min(count, s.data.eval->size());
    const std::vector<std::vector<int32_t>> ids = generate_samples(*s.model, *s.engine, *s.data.eval, count, o, s.mem);
    for (size_t i = 0; i < ids.size(); ++i)
      std::printf("%s\n", lm_generation_json(static_cast<int64_t>(i), *s.data.eval, o.prompt_len,
                                             s.c.data.kind == DataKind::text, ids[i])
                              .c_str());
    std::fflush(stdout);
    return;
  }
  count = std::min(count, data->size());
  const std::vector<std::vector<int32_t>> ids =
      generate_samples(*s.model, *s.engine, *data, count, generation_options(), s.mem);
  for (size_t i = 0; i < ids.size(); ++i)
    std::printf("%s\n", generation_json(static_cast<int64_t>(i), *data, ids[i]).c_str());
  std::fflush(stdout);
}

Trainer::StepResult Trainer::train_step(int64_t step, double lr) {
  State& s = *s_;
  const Config& c = s.c;
  const RunEnv& env = s.env;
  FsdpEngine& engine = *s.engine;
  Tracer& trace = engine.tracer();
  RunCtx ctx;
  ctx.mem = &s.mem;
  ctx.seed = c.train.seed;
  ctx.dropout = c.train.dropout;
  ctx.hooks = &engine;
  ctx.runtime = &engine.runtime();
  ctx.compute_dtype = engine.compute_dtype();
  ctx.training = true;
  ctx.step = step;
  ctx.loss_scale = s.scaler.enabled ? s.scaler.scale : 1.0;
  const int64_t epoch = step / s.steps_per_epoch, step_in_epoch = step % s.steps_per_epoch;
  std::vector<int64_t> global = s.sampler->global_batch(epoch, step_in_epoch);
  ctx.loss_normalizer = static_cast<double>(s.data.train->loss_elements(global));

  // bf16/f16 activations between forward and backward (nn/activation_stash.h).
  std::optional<ActivationStash> stash;
  if (const DType held = saved_activation_dtype(c.fsdp.mixed_precision); held != DType::f32) {
    stash.emplace(held);
    ctx.stash = &*stash;
  }

  // Forward/backward per micro-batch; only the last one reduces gradients (no_sync).
  StepResult r;
  r.loss_scale = ctx.loss_scale;
  engine.begin_step();
  for (int64_t m = 0; m < c.train.grad_accum; ++m) {
    auto [offset, count] = Sampler::rank_slice(s.micro_global, env.rank, env.world_size);
    std::span<const int64_t> mine(global.data() + m * s.micro_global + offset, count);
    ctx.sample_offset = step * s.global_batch + m * s.micro_global + offset;
    trace.begin(Track::host, "data");
    load_batch(*s.data.train, mine, s.batch, &s.mem);
    const BatchBuffers& in = upload_batch(engine.runtime(), s.batch, s.dev_batch);
    trace.end(Track::host);
    engine.set_sync_grads(m + 1 == c.train.grad_accum);
    if (stash) stash->begin_forward();
    r.loss += s.model->forward(ctx, in.inputs, in.targets);
    if (stash) stash->begin_backward();
    s.model->backward(ctx);
  }
  engine.finish_backward();
  trace
      .collective({"all_reduce", CommGroup::world, sizeof r.loss, DType::f64, nullptr, true}, {},
                  [&] { return env.world->all_reduce(&r.loss, &r.loss, 1, DType::f64, ReduceOp::sum); })
      ->wait();

  // With f16 loss scaling a non-finite step is the rule (the scaler skips it and lowers the
  // scale); otherwise it means divergence: stop before the optimizer writes it into the weights.
  // The loss and the norm are all-reduced values, so every rank stops at the same step.
  auto number = [](double v) {
    return std::isnan(v) ? std::string("nan") : std::isinf(v) ? (v > 0 ? "inf" : "-inf") : std::to_string(v);
  };
  if (!s.scaler.enabled && !std::isfinite(r.loss))
    throw AgreedError(diverged(step + 1, "the loss is " + number(r.loss)));
  r.applied = s.scaler.update(engine);  // false: an f16 overflow, the step is skipped
  if (r.applied) {
    if (c.train.clip_grad_norm > 0.0) r.grad_norm = engine.clip_grad_norm(c.train.clip_grad_norm);
    if (!s.scaler.enabled && !std::isfinite(r.grad_norm))
      throw AgreedError(diverged(step + 1, "the gradient norm is " + number(r.grad_norm)));
    const auto span = trace.scope(Track::compute, "optimizer");
    s.optimizer->step(engine.param_shards(), engine.grad_shards(), lr);
  }
  return r;
}

MemoryPlan Trainer::plan() {
  State& s = *s_;
  const Config& c = s.c;
  FsdpEngine& engine = *s.engine;
  MemoryPlan plan;
  // The run's own schedule, filtered (run_schedule.h): the events that reach every peak.
  const double lr = c.train.optimizer.lr;
  PlanFilter filter;
  for_each_run_event(schedule_facts(0, s.total_steps), [&](const RunEvent& e) {
    if (!filter.wanted(e)) return;
    switch (e.kind) {
      case RunEvent::Kind::step: {
        Timeline* clock = s.env.timeline;
        const double t0 = clock ? clock->latest() : 0;
        const Timeline::Busy busy0 = clock ? clock->busy() : Timeline::Busy{};
        train_step(e.step, lr);
        if (clock) {  // the last step planned is the steady state's (the second)
          const Timeline::Busy& b = clock->busy();
          TimePlan t;
          t.step_s = clock->latest() - t0;
          t.gemm_s = b.gemm_s - busy0.gemm_s;
          t.memory_bound_s = b.memory_bound_s - busy0.memory_bound_s;
          t.copy_s = b.copy_s - busy0.copy_s;
          t.gemm_flops = b.gemm_flops - busy0.gemm_flops;
          t.kernels = b.kernels - busy0.kernels;
          for (size_t k = 0; k < t.collective_s.size(); ++k) {
            t.collective_s[k] = b.collective_s[k] - busy0.collective_s[k];
            t.collective_calls[k] = b.collective_calls[k] - busy0.collective_calls[k];
          }
          t.samples_per_step = static_cast<double>(s.global_batch);
          if (c.model.family().task != ModelTask::image_classification)
            t.tokens_per_sample = static_cast<double>(shape_numel(s.data.train->target_shape()));
          plan.time = t;
        }
        const StepTraffic& t = engine.step_traffic();
        plan.all_gather = t.all_gather;
        plan.reduce_scatter = t.reduce_scatter;
        plan.all_reduce = t.all_reduce;
        return;
      }
      case RunEvent::Kind::evaluate:
      case RunEvent::Kind::close_evaluate:
        evaluate();
        // ROUGE decodes with every unit gathered: one decoding batch per rank reaches its peak.
        if (const int64_t n = rouge_samples(); n > 0) {
          const GenerationOptions g = generation_options();
          rouge_of_samples(*s.model, engine, *eval_pairs(s.c.model, s.data),
                           std::min(n, g.batch_size * s.env.world_size), g, s.mem);
        }
        return;
      case RunEvent::Kind::save:
      case RunEvent::Kind::close_save: save("", e.step, lr); return;
      case RunEvent::Kind::save_weights: write_weights(); return;
    }
  });

  plan.model = c.model.kind;
  plan.strategy = std::string(name_of(kStrategies, engine.options().strategy));
  plan.world_size = s.env.world_size;
  plan.shard_group_size = engine.mesh().shard->size();
  plan.replicas = engine.mesh().replicate->size();
  plan.num_params = s.model->num_params();
  for (const auto& u : engine.units())
    plan.units.push_back({u->spec.name, u->layout.numel, u->padded_numel, u->shard_numel});
  for (size_t i = 0; i < kMemCategoryCount; ++i)
    plan.peak_bytes[i] = static_cast<int64_t>(s.mem.peak_bytes(static_cast<MemCategory>(i)));
  plan.total_peak_bytes = static_cast<int64_t>(s.mem.peak_total_bytes());
  plan.host_peak_bytes = static_cast<int64_t>(s.mem.peak_bytes(MemSpace::host));
  plan.device_peak_bytes = static_cast<int64_t>(s.mem.peak_bytes(MemSpace::device));
  if (engine.options().activation_checkpointing)
    plan.notes.emplace_back("activation checkpointing: wrapped units recompute in backward");
  return plan;
}

TrainSummary Trainer::run() {
  State& s = *s_;
  Progress& p = s.progress;
  const bool leader = s.env.rank == 0;
  p.metrics = std::make_unique<MetricsFile>(leader ? s.c.output.metrics : "", s.resumed);
  p.tty = leader && interactive_terminal();
  p.summary.start_step = p.summary.steps = s.start_step;
  p.lr = s.schedule->lr(s.start_step, s.start_step / s.steps_per_epoch);
  print_banner();
  if (leader && !s.resume_note.empty()) std::fputs(s.resume_note.c_str(), stdout);

  const int64_t end_step = s.c.train.stop_after_steps > 0
                               ? std::min(s.total_steps, s.start_step + s.c.train.stop_after_steps)
                               : s.total_steps;
  Tracer& trace = *s.tracer;
  try {
    for_each_run_event(schedule_facts(s.start_step, end_step), [&](const RunEvent& e) {
      switch (e.kind) {
        case RunEvent::Kind::step: {
          const int64_t step = e.step;
          trace.begin_step(step);
          const auto t0 = Clock::now();
          p.lr = s.schedule->lr(step, step / s.steps_per_epoch);
          const StepResult r = train_step(step, p.lr);
          // On a device the step's backward and optimizer are still queued when train_step
          // returns (the loss is read after the forward): wait, so step_time_s is the step's own
          // time. On the first H200 run, without this, step 1 read 0.49 s and every later step
          // 1.11 s (each one paying for the tail of the one before).
          if (s.runtime->device() != Device::cpu) s.runtime->synchronize(s.runtime->compute_stream());
          report_step(step, r, seconds_since(t0), trace.end_step());
          return;
        }
        case RunEvent::Kind::evaluate:
        case RunEvent::Kind::close_evaluate: evaluate_and_report(e.step, (e.step - 1) / s.steps_per_epoch); return;
        case RunEvent::Kind::save:
        case RunEvent::Kind::close_save: save_step(e.step); return;
        case RunEvent::Kind::save_weights:
          p.bar.reset();
          write_weights();
          return;
      }
    });
    finish();
  } catch (...) {
    // No gather now (a rank may be gone): each rank that gets here keeps its own spans.
    if (trace.tracing()) try {
        write_rank_trace(s.c.output.trace, s.env.rank, trace.take_events(), s.trace_clock, trace.on_device());
      } catch (...) {  // the run's own error is the one to report
      }
    throw;
  }
  write_trace_file();
  return p.summary;
}

void Trainer::write_trace_file() {
  State& s = *s_;
  Tracer& trace = *s.tracer;
  if (!trace.tracing()) return;
  write_trace(*s.env.world, s.c.output.trace, trace.take_events(), s.trace_clock, trace.on_device());
  if (s.env.rank == 0) std::printf("trace: %s\n", s.c.output.trace.c_str());
}

void Trainer::report_step(int64_t step, const StepResult& r, double step_s, const StepBreakdown& b) {
  State& s = *s_;
  Progress& p = s.progress;
  const Config& c = s.c;
  const int64_t done = step + 1, epoch = step / s.steps_per_epoch;
  if (step > 0) {  // the first step pays for allocations
    p.timed_s += step_s;
    p.timed_samples += s.global_batch;
  }
  p.summary.steps = done;
  p.summary.last_loss = r.loss;
  if (s.env.rank != 0) return;
  const bool lm = c.model.family().task != ModelTask::image_classification;
  const int64_t elems_per_sample = shape_numel(s.data.train->target_shape());
  const double rate = static_cast<double>(s.global_batch) / step_s;
  JsonLine j;
  j.integer("step", done).integer("epoch", epoch + 1).num("loss", r.loss).num("lr", p.lr).num("step_time_s", step_s);
  j.num("samples_per_s", rate);
  if (lm) j.num("tokens_per_s", rate * elems_per_sample);
  if (r.grad_norm >= 0.0) j.num("grad_norm", r.grad_norm);  // before clipping, as PyTorch returns it
  if (s.scaler.enabled) j.num("loss_scale", r.loss_scale).integer("step_skipped", r.applied ? 0 : 1);
  j.object("mem_peak_bytes", mem_peaks_json(s.mem)).object("mem_plan_bytes", s.plan.peaks_json());
  if (const auto st = s.runtime->allocator_stats()) j.object("device_memory_bytes", allocator_json(*st));
  if (s.tracer->tracing()) {  // rank 0's breakdown (fsdp/trace.h defines the fields)
    j.num("compute_s", b.compute_s).num("exposed_comm_s", b.exposed_comm_s).num("optimizer_s", b.optimizer_s);
    j.num("comm_s", b.comm_s).num("overlap", b.overlap());
  }
  p.metrics->write(j);
  if (p.tty) {
    const int64_t in_epoch = step % s.steps_per_epoch;
    if (!p.bar || in_epoch == 0)
      p.bar = std::make_unique<ProgressBar>(true, "epoch " + std::to_string(epoch + 1), s.steps_per_epoch);
    char extra[96];
    std::snprintf(extra, sizeof extra, "loss %.4f lr %.3g %.0f %s/s", r.loss, p.lr, lm ? rate * elems_per_sample : rate,
                  lm ? "tokens" : "samples");
    p.bar->update(in_epoch + 1, extra);
    if (in_epoch + 1 == s.steps_per_epoch) p.bar.reset();
  } else if (done % c.output.log_every == 0 || done == s.total_steps) {
    std::printf("step %lld/%lld epoch %lld loss %.6f lr %.6g %.1f %s/s\n", static_cast<long long>(done),
                static_cast<long long>(s.total_steps), static_cast<long long>(epoch) + 1, r.loss, p.lr,
                lm ? rate * elems_per_sample : rate, lm ? "tokens" : "samples");
    std::fflush(stdout);
  }
}

RunScheduleFacts Trainer::schedule_facts(int64_t start_step, int64_t end_step) const {
  const State& s = *s_;
  RunScheduleFacts f;
  f.start_step = start_step;
  f.end_step = end_step;
  f.total_steps = s.total_steps;
  f.steps_per_epoch = s.steps_per_epoch;
  f.eval_every = s.c.train.eval_every;
  f.save_every_steps = s.c.checkpoint.every_steps;
  f.saves = !s.c.checkpoint.dir.empty();
  f.save_weights = !s.c.output.save_weights.empty();
  return f;
}

void Trainer::evaluate_and_report(int64_t step_done, int64_t epoch) {
  State& s = *s_;
  Progress& p = s.progress;
  const CheckpointConfig& ck = s.c.checkpoint;
  p.bar.reset();  // the evaluation draws its own bars below the epoch's
  EvalResult r;
  RougeResult rouge;
  {
    const auto span = s.tracer->scope(Track::host, "evaluate");
    r = evaluate();
    if (const int64_t n = rouge_samples(); n > 0)
      rouge = rouge_of_samples(*s.model, *s.engine, *eval_pairs(s.c.model, s.data), n, generation_options(), s.mem);
  }
  p.summary.eval_loss = r.loss;
  p.summary.eval_accuracy = r.accuracy;
  if (rouge.count > 0) p.summary.eval_rougeL = rouge.mean.rougeL;
  p.last_eval_step = step_done;
  if (ck.save_best && (s.best_eval_loss < 0 || r.loss < s.best_eval_loss)) {
    s.best_eval_loss = r.loss;
    save(best_checkpoint_path(ck.dir), step_done, p.lr);
  }
  if (s.env.rank != 0) return;
  std::printf("eval step %lld epoch %lld: loss %.6f accuracy %.2f%%", static_cast<long long>(step_done),
              static_cast<long long>(epoch) + 1, r.loss, 100.0 * r.accuracy);
  if (rouge.count > 0)
    std::printf(" rouge1 %.4f rouge2 %.4f rougeL %.4f (%lld samples, %.1f s)", rouge.mean.rouge1, rouge.mean.rouge2,
                rouge.mean.rougeL, static_cast<long long>(rouge.count), rouge.seconds);
  std::printf("\n");
  std::fflush(stdout);
  JsonLine j;
  j.integer("step", step_done).integer("epoch", epoch + 1).num("eval_loss", r.loss).num("eval_accuracy", r.accuracy);
  if (rouge.count > 0)
    j.num("rouge1", rouge.mean.rouge1)
        .num("rouge2", rouge.mean.rouge2)
        .num("rougeL", rouge.mean.rougeL)
        .integer("rouge_samples", rouge.count)
        .num("generate_s", rouge.seconds);
  j.object("mem_peak_bytes", mem_peaks_json(s.mem));
  p.metrics->write(j);
}

void Trainer::save_step(int64_t done) {
  State& s = *s_;
  Progress& p = s.progress;
  const CheckpointConfig& ck = s.c.checkpoint;
  if (done == p.last_saved_step) return;
  const CheckpointStats st = save(checkpoint_path(ck.dir, done), done, p.lr);
  p.last_saved_step = done;
  if (s.env.rank != 0) return;
  prune_checkpoints(ck.dir, ck.keep, done);
  p.metrics->write(JsonLine()
                       .str("event", "checkpoint")
                       .integer("step", done)
                       .str("path", checkpoint_path(ck.dir, done))
                       .integer("bytes", st.bytes)
                       .num("save_s", st.seconds));
}

void Trainer::finish() {
  State& s = *s_;
  Progress& p = s.progress;
  TrainSummary& summary = p.summary;
  p.bar.reset();
  summary.samples_per_s = p.timed_s > 0 ? static_cast<double>(p.timed_samples) / p.timed_s : 0.0;
  if (s.env.rank != 0) return;
  const std::optional<AllocatorStats> st = s.runtime->allocator_stats();
  // The allocator's reserved peak (rank 0's) beside the tracked peak: what the cache and the
  // segments' fragments add on a device (PyTorch's max_memory_reserved).
  char reserved[96] = "";
  if (st)
    std::snprintf(reserved, sizeof reserved, "; device reserved peak %.1f MiB (allocated peak %.1f MiB)",
                  static_cast<double>(st->peak_reserved_bytes) / 1048576.0,
                  static_cast<double>(st->peak_allocated_bytes) / 1048576.0);
  std::printf("done: %lld steps, %.1f samples/s, peak memory %.1f MiB (planned %.1f MiB)%s\n",
              static_cast<long long>(summary.steps), summary.samples_per_s, s.mem.peak_total_bytes() / 1048576.0,
              static_cast<double>(s.plan.total_peak_bytes) / 1048576.0, reserved);
  JsonLine done;
  done.str("event", "done")
      .integer("steps", summary.steps)
      .num("samples_per_s", summary.samples_per_s)
      .object("mem_peak_bytes", mem_peaks_json(s.mem))
      .object("mem_plan_bytes", s.plan.peaks_json());
  if (st) done.object("device_memory_bytes", allocator_json(*st));
  p.metrics->write(done);
}

TrainSummary train(const Config& config, const RunEnv& env) { return Trainer::create(config, env)->run(); }

}  // namespace fsdp
