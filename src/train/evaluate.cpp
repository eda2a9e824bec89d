// Evaluation: each rank runs its slice of every eval batch through the FSDP hooks (units are
// gathered as in training); the sums are added over all ranks at the end.
#include <numeric>
#include <string>
#include <vector>

#include "train/trainer_state.h"

namespace fsdp {

Trainer::EvalResult Trainer::evaluate() {
  State& s = *s_;
  const Dataset& data = *s.data.eval;
  FsdpEngine& engine = *s.engine;
  const int64_t global = s.c.train.eval_batch_size * s.env.world_size;
  Sampler sampler({data.size(), global, false, false, s.c.train.seed});
  RunCtx ctx;
  ctx.mem = &s.mem;
  ctx.training = false;
  ctx.hooks = &engine;
  ctx.runtime = &engine.runtime();
  ctx.compute_dtype = engine.compute_dtype();
  BatchBuffers b, dev;
  double sums[2] = {0.0, 0.0};  // loss, correct
  ProgressBar bar(s.progress.tty, "eval", sampler.steps_per_epoch());
  for (int64_t step = 0; step < sampler.steps_per_epoch(); ++step) {
    std::vector<int64_t> idx = sampler.global_batch(0, step);
    auto [offset, count] = Sampler::rank_slice(static_cast<int64_t>(idx.size()), s.env.rank, s.env.world_size);
    load_batch(data, std::span<const int64_t>(idx.data() + offset, count), b, &s.mem);
    const BatchBuffers& in = upload_batch(engine.runtime(), b, dev);
    s.model->forward(ctx, in.inputs, in.targets);
    engine.end_forward_only();
    sums[0] += s.model->loss().last_sum();
    sums[1] += static_cast<double>(s.model->loss().last_correct());
    bar.update(step + 1);
  }
  engine.world().all_reduce(sums, sums, 2, DType::f64, ReduceOp::sum)->wait();
  std::vector<int64_t> all(static_cast<size_t>(data.size()));
  std::iota(all.begin(), all.end(), int64_t{0});
  const double elems = static_cast<double>(data.loss_elements(all));
  return {sums[0] / elems, sums[1] / elems};
}

}  // namespace fsdp
