#include "train/generation.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <numeric>
#include <span>

#include "data/data.h"
#include "data/tokenizer.h"
#include "fsdp/fsdp.h"
#include "models/model.h"
#include "train/batches.h"
#include "train/progress.h"

namespace fsdp {

namespace {

// The first `prompt_len` columns of (B, T) i32 inputs, in place of them.
void cut_prompts(BatchBuffers& host, int64_t prompt_len, MemoryTracker& mem) {
  const int64_t B = host.inputs.dim(0), T = host.inputs.dim(1);
  Tensor prompts = Tensor::empty({B, prompt_len}, DType::i32, MemCategory::activations, &mem);
  for (int64_t b = 0; b < B; ++b) std::copy_n(host.inputs.i32() + b * T, prompt_len, prompts.i32() + b * prompt_len);
  host.inputs = prompts;
}

// This rank's slice of samples [0, count), decoded in batches with every unit gathered.
std::vector<std::vector<int32_t>> decode_slice(Model& model, FsdpEngine& engine, const Dataset& data, int64_t count,
                                               const GenerationOptions& o, MemoryTracker& mem) {
  const auto [first, mine] = Sampler::rank_slice(count, o.rank, o.world_size);
  std::vector<std::vector<int32_t>> out;
  out.reserve(static_cast<size_t>(mine));
  // Every rank gathers, also one with no samples: the all_gathers are collective.
  engine.unshard_all();
  RunCtx ctx;
  ctx.mem = &mem;
  ctx.training = false;
  ctx.hooks = nullptr;  // the parameters stay gathered for the whole loop
  ctx.runtime = &engine.runtime();
  ctx.compute_dtype = engine.compute_dtype();
  BatchBuffers host, dev;
  ProgressBar bar(o.progress, "generate", mine);
  for (int64_t start = 0; start < mine;) {
    // Samples with prompts of their own (fine-tuning data) decode in runs of one prompt length:
    // a batch's prompts are one (B, P) tensor, and padding them would change what a causal model
    // attends to.
    const int64_t prompt_len = data.prompt_tokens(first + start) > 0 ? data.prompt_tokens(first + start) : o.prompt_len;
    int64_t n = 1;
    while (n < o.batch_size && start + n < mine &&
           (data.prompt_tokens(first + start + n) > 0 ? data.prompt_tokens(first + start + n) == prompt_len
                                                      : prompt_len == o.prompt_len))
      ++n;
    std::vector<int64_t> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), first + start);
    load_batch(data, idx, host, &mem);
    if (prompt_len > 0) cut_prompts(host, prompt_len, mem);
    const BatchBuffers& in = upload_batch(engine.runtime(), host, dev);
    GenerateOptions search = o.search;
    search.first_sample = first + start;  // sampling's draws are keyed by the sample, not the rank
    for (auto& ids : model.generate(ctx, in.inputs, search)) out.push_back(std::move(ids));
    start += n;
    bar.update(start);
  }
  engine.reshard_all();
  return out;
}

}  // namespace

std::vector<std::vector<int32_t>> generate_samples(Model& model, FsdpEngine& engine, const Dataset& data, int64_t count,
                                                   const GenerationOptions& o, MemoryTracker& mem) {
  const std::vector<std::vector<int32_t>> mine = decode_slice(model, engine, data, count, o, mem);
  // To rank 0: each rank's slice as (rows, width) i32, -1 after a sequence's end, the rows of
  // the largest slice for all (all_gather takes equal counts).
  const int64_t rows = (count + o.world_size - 1) / o.world_size, width = o.search.max_new_tokens;
  std::vector<int32_t> send(static_cast<size_t>(std::max<int64_t>(rows * width, 1)), -1);
  for (size_t r = 0; r < mine.size(); ++r)
    std::copy(mine[r].begin(), mine[r].end(), send.begin() + static_cast<std::ptrdiff_t>(r) * width);
  std::vector<int32_t> all(send.size() * static_cast<size_t>(o.world_size));
  engine.world().all_gather(send.data(), all.data(), send.size(), DType::i32)->wait();
  std::vector<std::vector<int32_t>> out;
  if (o.rank != 0) return out;
  for (int r = 0; r < o.world_size; ++r) {
    const int64_t n = Sampler::rank_slice(count, r, o.world_size).second;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t* row = all.data() + (static_cast<int64_t>(r) * static_cast<int64_t>(send.size()) + i * width);
      std::vector<int32_t>& ids = out.emplace_back();
      for (int64_t t = 0; t < width && row[t] >= 0; ++t) ids.push_back(row[t]);
    }
  }
  return out;
}

RougeResult rouge_of_samples(Model& model, FsdpEngine& engine, const Seq2SeqDataset& data, int64_t count,
                             const GenerationOptions& o, MemoryTracker& mem) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<std::vector<int32_t>> mine = decode_slice(model, engine, data, count, o, mem);
  const int64_t first = Sampler::rank_slice(count, o.rank, o.world_size).first;
  double sums[3] = {0.0, 0.0, 0.0};
  for (size_t i = 0; i < mine.size(); ++i) {
    const RougeScores s = rouge(data.target_text(first + static_cast<int64_t>(i)), data.tokenizer()->decode(mine[i]));
    sums[0] += s.rouge1;
    sums[1] += s.rouge2;
    sums[2] += s.rougeL;
  }
  engine.world().all_reduce(sums, sums, 3, DType::f64, ReduceOp::sum)->wait();
  RougeResult r;
  r.count = count;
  const double n = static_cast<double>(std::max<int64_t>(count, 1));
  r.mean = {sums[0] / n, sums[1] / n, sums[2] / n};
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::string generation_json(int64_t index, const Seq2SeqDataset& data, const std::vector<int32_t>& ids) {
  nlohmann::ordered_json j;
  j["index"] = index;
  j["source"] = data.source_text(index);
  j["reference"] = data.target_text(index);
  j["generated"] = data.tokenizer()->decode(ids);
  j["generated_ids"] = ids;
  // Invalid UTF-8 (a byte model can generate any bytes) becomes U+FFFD instead of an exception.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string lm_generation_json(int64_t index, const Dataset& data, int64_t prompt_len, bool bytes,
                               const std::vector<int32_t>& ids) {
  BatchBuffers sample;
  const int64_t at[1] = {index};
  load_batch(data, at, sample, nullptr);
  const int64_t T = sample.inputs.dim(1);
  if (data.prompt_tokens(index) > 0) prompt_len = data.prompt_tokens(index);
  // The continuation after the prompt: the targets from the prompt's last position (the token
  // after it) to the first ignored one (a block's last position, padding) or the end.
  std::vector<int32_t> prompt(sample.inputs.i32(), sample.inputs.i32() + prompt_len);
  std::vector<int32_t> reference;
  for (int64_t t = prompt_len - 1; t < T && sample.targets.i32()[t] >= 0; ++t)
    reference.push_back(sample.targets.i32()[t]);
  nlohmann::ordered_json j;
  j["index"] = index;
  if (const Tokenizer* tok = data.tokenizer()) {
    j["prompt"] = tok->decode(prompt);
    j["reference"] = tok->decode(reference);
    j["generated"] = tok->decode(ids);
  } else if (bytes) {
    auto text = [](const std::vector<int32_t>& v) {
      std::string t;
      for (const int32_t id : v) t += id >= 0 && id < 256 ? std::string(1, static_cast<char>(id)) : "\xEF\xBF\xBD";
      return t;
    };
    j["prompt"] = text(prompt);
    j["reference"] = text(reference);
    j["generated"] = text(ids);
  }
  j["prompt_ids"] = prompt;
  j["reference_ids"] = reference;
  j["generated_ids"] = ids;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace fsdp
