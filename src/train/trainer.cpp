#include "train/trainer.h"

#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <span>

#include "ckpt/h5.h"
#include "config/config.h"
#include "data/data.h"
#include "models/model.h"
#include "nn/flat.h"
#include "optim/optim.h"
#include "tensor/error.h"
#include "train/metrics.h"

namespace fsdp {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Datasets {
  std::unique_ptr<Dataset> train, eval;
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

double grad_norm(std::span<const float> grads) {
  double s = 0.0;
  for (float g : grads) s += static_cast<double>(g) * g;
  return std::sqrt(s);
}

struct EvalResult {
  double loss = 0.0, accuracy = 0.0;
};

EvalResult evaluate(Model& model, const Dataset& data, const Config& c, MemoryTracker& mem) {
  SamplerOptions so{data.size(), c.train.eval_batch_size, false, false, c.train.seed};
  Sampler sampler(so);
  RunCtx ctx;
  ctx.mem = &mem;
  ctx.training = false;
  BatchBuffers b;
  double loss_sum = 0.0;
  int64_t correct = 0;
  for (int64_t s = 0; s < sampler.steps_per_epoch(); ++s) {
    std::vector<int64_t> idx = sampler.global_batch(0, s);
    load_batch(data, idx, b, &mem);
    model.forward(ctx, b.inputs, b.targets);
    loss_sum += model.loss().last_sum();
    correct += model.loss().last_correct();
  }
  double elems = static_cast<double>(data.size()) * model.loss_elements_per_sample();
  return {loss_sum / elems, static_cast<double>(correct) / elems};
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

}  // namespace

TrainSummary train(const Config& c, const RunEnv& env) {
  if (env.world_size != 1)
    throw Error("running on " + std::to_string(env.world_size) +
                " ranks needs the FSDP engine, which this build does not have yet; run with one rank");
  const bool leader = env.rank == 0;
  if (c.train.threads > 0) {
    openblas_set_num_threads(static_cast<int>(c.train.threads));
    omp_set_num_threads(static_cast<int>(c.train.threads));
  }
  MemoryTracker mem;

  // Data first: a missing dataset should fail before minutes of model set-up.
  Datasets data = load_data(c);
  std::unique_ptr<Model> model = make_model(c.model);
  if (data.train->num_classes() > (c.model.kind == "transformer" ? c.model.vocab : 10))
    throw Error("data has " + std::to_string(data.train->num_classes()) + " classes, more than the model's outputs");

  // Parameters: one flat buffer (one FSDP unit per rank later), initialised by the counter RNG.
  FlatLayout layout = make_flat_layout(model->params());
  Tensor flat = Tensor::empty({layout.numel}, DType::f32, MemCategory::params, &mem);
  Tensor flat_grad = Tensor::zeros({layout.numel}, DType::f32, MemCategory::grads, &mem);
  init_flat_range(layout, flat.f32(), 0, layout.numel, c.train.seed);
  bind_flat(layout, flat.f32(), flat_grad.f32());
  if (!c.model.init_from.empty()) load_model_weights(c.model.init_from, layout.params);
  std::unique_ptr<Optimizer> optimizer = make_optimizer(c.train.optimizer, layout.numel, &mem);

  // The schedule of global batches: the same for any world size.
  const int64_t micro_global = c.train.batch_size * env.world_size;
  const int64_t global_batch = micro_global * c.train.grad_accum;
  Sampler sampler({data.train->size(), global_batch, c.train.shuffle, true, c.train.seed});
  const int64_t steps_per_epoch = sampler.steps_per_epoch();
  const int64_t total_steps = c.train.steps > 0 ? c.train.steps : c.train.epochs * steps_per_epoch;
  LrSchedule schedule(c.train.scheduler, c.train.optimizer.lr, total_steps);
  MetricsFile metrics(leader ? c.output.metrics : "");
  const bool tty = leader && interactive_terminal();
  const bool lm = c.model.kind == "transformer";
  const int64_t elems_per_sample = model->loss_elements_per_sample();

  if (leader)
    std::printf("fsdp_app: %s, %lld parameters, %s, %lld train / %lld eval samples, %lld steps (%lld per epoch)\n",
                c.model.kind.c_str(), static_cast<long long>(layout.numel), c.data.kind.c_str(),
                static_cast<long long>(data.train->size()), static_cast<long long>(data.eval->size()),
                static_cast<long long>(total_steps), static_cast<long long>(steps_per_epoch));

  TrainSummary summary;
  RunCtx ctx;
  ctx.mem = &mem;
  ctx.seed = c.train.seed;
  ctx.dropout = c.train.dropout;
  ctx.loss_normalizer = static_cast<double>(global_batch) * elems_per_sample;
  BatchBuffers batch;
  double timed_s = 0.0;
  int64_t timed_samples = 0;
  int64_t last_eval_step = -1;
  auto run_eval = [&](int64_t step_done, int64_t epoch) {
    EvalResult r = evaluate(*model, *data.eval, c, mem);
    summary.eval_loss = r.loss;
    summary.eval_accuracy = r.accuracy;
    last_eval_step = step_done;
    if (!leader) return;
    if (tty) std::printf("\n");
    std::printf("eval step %lld epoch %lld: loss %.6f accuracy %.2f%%\n", static_cast<long long>(step_done),
                static_cast<long long>(epoch + 1), r.loss, 100.0 * r.accuracy);
    std::fflush(stdout);
    metrics.write(JsonLine().integer("step", step_done).integer("epoch", epoch + 1).num("eval_loss", r.loss)
                      .num("eval_accuracy", r.accuracy));
  };

  for (int64_t step = 0; step < total_steps; ++step) {
    const int64_t epoch = step / steps_per_epoch, step_in_epoch = step % steps_per_epoch;
    const auto t0 = Clock::now();
    const double lr = schedule.lr(step, epoch);
    std::vector<int64_t> global = sampler.global_batch(epoch, step_in_epoch);

    // Forward/backward per micro-batch; gradients accumulate in flat_grad.
    flat_grad.zero();
    double loss = 0.0;
    ctx.training = true;
    ctx.step = step;
    for (int64_t m = 0; m < c.train.grad_accum; ++m) {
      auto [offset, count] = Sampler::rank_slice(micro_global, env.rank, env.world_size);
      std::span<const int64_t> mine(global.data() + m * micro_global + offset, count);
      ctx.sample_offset = step * global_batch + m * micro_global + offset;
      load_batch(*data.train, mine, batch, &mem);
      loss += model->forward(ctx, batch.inputs, batch.targets);
      model->backward(ctx);
    }

    std::span<float> grads(flat_grad.f32(), layout.numel);
    if (c.train.clip_grad_norm > 0.0) {
      // torch.nn.utils.clip_grad_norm_: scale by min(1, max_norm / (norm + 1e-6)).
      double norm = grad_norm(grads);
      float coef = static_cast<float>(std::min(1.0, c.train.clip_grad_norm / (norm + 1e-6)));
      for (float& g : grads) g *= coef;
    }
    optimizer->step(std::span<float>(flat.f32(), layout.numel), grads, lr);

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
      j.raw("mem_peak_bytes", mem_peaks_json(mem));
      metrics.write(j);
      if (tty) {
        std::printf("\r[epoch %lld] step %lld/%lld  loss %.4f  lr %.3g  %.0f %s/s   ", static_cast<long long>(epoch + 1),
                    static_cast<long long>(done), static_cast<long long>(total_steps), loss, lr,
                    lm ? rate * elems_per_sample : rate, lm ? "tokens" : "samples");
        std::fflush(stdout);
      } else if (done % c.output.log_every == 0 || done == total_steps) {
        std::printf("step %lld/%lld epoch %lld loss %.6f lr %.6g %.1f %s/s\n", static_cast<long long>(done),
                    static_cast<long long>(total_steps), static_cast<long long>(epoch + 1), loss, lr,
                    lm ? rate * elems_per_sample : rate, lm ? "tokens" : "samples");
        std::fflush(stdout);
      }
    }
    const bool epoch_end = step_in_epoch == steps_per_epoch - 1;
    if (eval_due(c.train.eval_every, done, epoch_end)) run_eval(done, epoch);
  }
  if (c.train.eval_every != "never" && last_eval_step != summary.steps && total_steps > 0)
    run_eval(summary.steps, (total_steps - 1) / steps_per_epoch);
  if (tty && c.train.eval_every == "never") std::printf("\n");
  summary.samples_per_s = timed_s > 0 ? timed_samples / timed_s : 0.0;
  if (leader) {
    std::printf("done: %lld steps, %.1f samples/s, peak memory %.1f MiB\n", static_cast<long long>(summary.steps),
                summary.samples_per_s, mem.peak_total_bytes() / 1048576.0);
    metrics.write(JsonLine().str("event", "done").integer("steps", summary.steps).num("samples_per_s", summary.samples_per_s)
                      .raw("mem_peak_bytes", mem_peaks_json(mem)));
  }
  return summary;
}

}  // namespace fsdp
