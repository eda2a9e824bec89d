#include "train/evaluate.h"

#include <numeric>
#include <string>
#include <vector>

#include "data/data.h"
#include "fsdp/fsdp.h"
#include "models/model.h"
#include "train/batches.h"
#include "train/progress.h"

namespace fsdp {

EvalResult evaluate(Model& model, FsdpEngine& engine, const Dataset& data, const EvalOptions& o, MemoryTracker& mem) {
  const int64_t global = o.batch_size * o.world_size;
  Sampler sampler({data.size(), global, false, false, o.seed});
  RunCtx ctx;
  ctx.mem = &mem;
  ctx.training = false;
  ctx.hooks = &engine;
  ctx.runtime = &engine.runtime();
  BatchBuffers b, dev;
  double sums[2] = {0.0, 0.0};  // loss, correct
  ProgressBar bar(o.progress, "eval", sampler.steps_per_epoch());
  for (int64_t s = 0; s < sampler.steps_per_epoch(); ++s) {
    std::vector<int64_t> idx = sampler.global_batch(0, s);
    auto [offset, count] = Sampler::rank_slice(static_cast<int64_t>(idx.size()), o.rank, o.world_size);
    load_batch(data, std::span<const int64_t>(idx.data() + offset, count), b, &mem);
    const BatchBuffers& in = upload_batch(engine.runtime(), b, dev);
    model.forward(ctx, in.inputs, in.targets);
    engine.end_forward_only();
    sums[0] += model.loss().last_sum();
    sums[1] += static_cast<double>(model.loss().last_correct());
    bar.update(s + 1);
  }
  engine.world().all_reduce(sums, sums, 2, DType::f64, ReduceOp::sum)->wait();
  std::vector<int64_t> all(static_cast<size_t>(data.size()));
  std::iota(all.begin(), all.end(), int64_t{0});
  const double elems = static_cast<double>(data.loss_elements(all));
  return {sums[0] / elems, sums[1] / elems};
}

}  // namespace fsdp
