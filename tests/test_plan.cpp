#define BOOST_TEST_MODULE plan
#include <boost/test/unit_test.hpp>
// The memory plan: predicted per-category peaks against the MemoryTracker's measured ones
// (in-process runs, one rank: equal to the byte, since the plan runs the same code on the meta
// device), the meta device's charges against the host runtime's layer by layer, and the
// formulas at larger world sizes — shard sizes with padding, the 16 Psi / N model states, and
// bytes moved per step by each collective.
#include <unistd.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "config/config.h"
#include "models/mnist_cnn/mnist_cnn.h"
#include "models/model.h"
#include "models/transformer/transformer.h"
#include "nn/layers.h"
#include "sanitizer_skip.h"
#include "tensor/host_runtime.h"
#include "tensor/meta_runtime.h"
#include "train/plan.h"
#include "train/run_schedule.h"
#include "train/trainer.h"

namespace {

using fsdp::MemCategory;

fsdp::Config cfg(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return fsdp::parse_config(yaml, "test.yaml", overrides);
}

// A plan for `world` ranks, `per_node` to a node (0: one node).
fsdp::PlanRequest req(int world, int per_node = 0) {
  fsdp::PlanRequest r;
  r.world_size = world;
  r.ranks_per_node = per_node;
  return r;
}

std::string tmp(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + std::to_string(getpid()))).string();
}

int64_t json_int(const std::string& obj, const std::string& key) {
  auto at = obj.find("\"" + key + "\": ");
  BOOST_REQUIRE_MESSAGE(at != std::string::npos, "no " << key << " in " << obj);
  return std::stoll(obj.substr(at + key.size() + 4));
}

struct Measured {
  std::array<int64_t, fsdp::kMemCategoryCount> peak{};
  int64_t total = 0;
};

// The peaks of the final {"event": "done"} line of a metrics file.
Measured measured_peaks(const std::string& metrics_path) {
  std::ifstream f(metrics_path);
  std::string line, done;
  while (std::getline(f, line))
    if (line.find("\"event\": \"done\"") != std::string::npos) done = line;
  BOOST_REQUIRE_MESSAGE(!done.empty(), "no done line in " << metrics_path);
  std::string obj = done.substr(done.find("\"mem_peak_bytes\""));
  obj = obj.substr(obj.find('{'));
  Measured m;
  for (size_t c = 0; c < fsdp::kMemCategoryCount; ++c)
    m.peak[c] = json_int(obj, std::string(fsdp::mem_category_name(static_cast<MemCategory>(c))));
  m.total = json_int(obj, "total");
  return m;
}

// Trains in-process, then checks the plan for the same config against what was measured.
void check_plan_against_run(const std::string& yaml, const std::vector<std::string>& overrides) {
  std::string metrics = tmp("plan_metrics");
  std::vector<std::string> all = overrides;
  all.push_back("output.metrics=" + metrics);
  fsdp::Config c = cfg(yaml, all);
  fsdp::train(c, {});
  Measured m = measured_peaks(metrics);
  std::filesystem::remove(metrics);
  fsdp::MemoryPlan plan = fsdp::plan_memory(c, req(1));

  std::string label;
  for (const std::string& o : overrides) label += o + " ";
  for (size_t i = 0; i < fsdp::kMemCategoryCount; ++i) {
    auto cat = static_cast<MemCategory>(i);
    BOOST_TEST_MESSAGE(label << fsdp::mem_category_name(cat) << ": planned " << plan.peak_bytes[i] << " measured "
                             << m.peak[i]);
    BOOST_TEST(plan.peak_bytes[i] == m.peak[i],
               label << fsdp::mem_category_name(cat) << " planned " << plan.peak_bytes[i] << " measured " << m.peak[i]);
  }
  BOOST_TEST_MESSAGE(label << "total: planned " << plan.total_peak_bytes << " measured " << m.total);
  BOOST_TEST(plan.total_peak_bytes == m.total,
             label << "total planned " << plan.total_peak_bytes << " measured " << m.total);
}

// Evaluation between steps (eval_every 3 of 6 steps) and a short last eval batch (50 eval
// samples in batches of 32 / 12): the activation buffers change shape both ways.
const char* kCnn =
    "model: {kind: mnist_cnn}\n"
    "data: {kind: synthetic, synthetic_samples: 200}\n"
    "train: {batch_size: 16, steps: 6, eval_every: '3', eval_batch_size: 32,\n"
    "        optimizer: {kind: adadelta, lr: 1.0}}\n";

const char* kLm =
    "model: {kind: transformer, vocab: 32, d_model: 32, n_layers: 3, n_heads: 4, d_ff: 64, seq_len: 16}\n"
    "data: {kind: synthetic, synthetic_samples: 200}\n"
    "train: {batch_size: 8, steps: 4, eval_every: '2', eval_batch_size: 12,\n"
    "        optimizer: {kind: adamw, lr: 0.003}}\n"
    "fsdp: {auto_wrap: {policy: transformer_layer}}\n";

// T5 v1.1-style (gated, untied) and v1.0-style (tied) on synthetic pairs, with evaluation.
const char* kT5 =
    "model: {kind: t5, vocab_size: 259, d_model: 32, d_kv: 8, num_heads: 4, d_ff: 40, num_layers: 2,\n"
    "        num_decoder_layers: 3, relative_attention_num_buckets: 8, relative_attention_max_distance: 16}\n"
    "data: {kind: synthetic, synthetic_samples: 100, source_len: 12, target_len: 6}\n"
    "train: {batch_size: 4, steps: 4, eval_every: '2', eval_batch_size: 10,\n"
    "        optimizer: {kind: adamw, lr: 0.003}}\n"
    "fsdp: {auto_wrap: {policy: transformer_layer}}\n";

// Llama with grouped-query attention (2 key/value heads for 4) on synthetic tokens, with evaluation.
const char* kLlama =
    "model: {kind: llama, vocab_size: 64, hidden_size: 32, intermediate_size: 40, num_hidden_layers: 3,\n"
    "        num_attention_heads: 4, num_key_value_heads: 2, seq_len: 12}\n"
    "data: {kind: synthetic, synthetic_samples: 100}\n"
    "train: {batch_size: 4, steps: 4, eval_every: '2', eval_batch_size: 10,\n"
    "        optimizer: {kind: adamw, lr: 0.003}}\n"
    "fsdp: {auto_wrap: {policy: transformer_layer}}\n";

}  // namespace

// The run's schedule (train/run_schedule.h): steps, the evaluations and saves between them, the
// closing events; and the plan's filter of it.
std::string schedule_text(const fsdp::RunScheduleFacts& f, bool planned) {
  static const char* kNames[] = {"s", "E", "S", "e", "c", "w"};
  std::string out;
  fsdp::PlanFilter filter;
  fsdp::for_each_run_event(f, [&](const fsdp::RunEvent& e) {
    if (planned && !filter.wanted(e)) return;
    out += std::string(out.empty() ? "" : " ") + kNames[static_cast<int>(e.kind)] + std::to_string(e.step);
  });
  return out;
}

BOOST_AUTO_TEST_CASE(run_schedule_and_its_plan) {
  fsdp::RunScheduleFacts f;
  f.end_step = f.total_steps = 6;
  f.steps_per_epoch = 3;
  f.eval_every = fsdp::EvalEvery{fsdp::EvalEvery::When::steps, 2};
  f.saves = true;
  f.save_every_steps = 4;
  f.save_weights = true;
  // Evaluations after 2, 4, 6 steps (none closing: one just ran), a save after 4, the closing one.
  BOOST_TEST(schedule_text(f, false) == "s0 s1 E2 s2 s3 E4 S4 s4 s5 E6 c6 w6");
  BOOST_TEST(schedule_text(f, true) == "s0 s1 E2 s2 E4 S4 c6 w6");
  // Per epoch: the closing evaluation is the last epoch's; a launch stopped early has none.
  f.eval_every = fsdp::EvalEvery{};
  f.save_every_steps = 0;
  BOOST_TEST(schedule_text(f, false) == "s0 s1 s2 E3 s3 s4 s5 E6 c6 w6");
  f.end_step = 4;
  BOOST_TEST(schedule_text(f, false) == "s0 s1 s2 E3 s3 c4 w4");
  // Never: no evaluation at all; a resumed launch saves at its end; a save at the end is not repeated.
  f.eval_every = fsdp::EvalEvery{fsdp::EvalEvery::When::never, 0};
  f.start_step = 2;
  f.end_step = 6;
  f.save_every_steps = 3;
  BOOST_TEST(schedule_text(f, false) == "s2 S3 s3 s4 s5 S6 w6");
  BOOST_TEST(schedule_text(f, true) == "s2 S3 s3 w6");
  // Evaluated only at the end: no step after it, so the plan's second evaluation never comes.
  f = {};
  f.end_step = f.total_steps = 3;
  f.steps_per_epoch = 3;
  BOOST_TEST(schedule_text(f, true) == "s0 s1 E3");
}

BOOST_AUTO_TEST_CASE(plan_matches_measured_llama) {
  check_plan_against_run(kLlama, {});
  check_plan_against_run(
      kLlama, {"model.tie_word_embeddings=true", "model.attention_bias=true", "fsdp.sharding_strategy=SHARD_GRAD_OP"});
  // Nested units (single projections) under size_based, recomputed in backward.
  check_plan_against_run(kLlama, {"fsdp.auto_wrap.policy=size_based", "fsdp.auto_wrap.min_num_params=300",
                                  "fsdp.activation_checkpointing=true"});
}

BOOST_AUTO_TEST_CASE(plan_matches_measured_t5) {
  check_plan_against_run(kT5, {"model.feed_forward_proj=gated-gelu", "model.tie_word_embeddings=false"});
  check_plan_against_run(kT5, {"fsdp.sharding_strategy=SHARD_GRAD_OP"});
  // Nested units under the recursing size_based policy, recomputed in backward.
  check_plan_against_run(kT5, {"fsdp.auto_wrap.policy=size_based", "fsdp.auto_wrap.min_num_params=300",
                               "fsdp.activation_checkpointing=true"});
  // ROUGE at each evaluation decodes with every unit gathered (and beam caches per sequence).
  check_plan_against_run(kT5, {"generate.rouge_samples=7", "generate.num_beams=2", "generate.batch_size=3"});
}

// Four CNN trainings: 14 s of the ASan suite for the plan's arithmetic, which the transformer and
// T5 cases run instrumented, and CNN code that tests/test_train.cpp's cases run.
BOOST_AUTO_TEST_CASE(plan_matches_measured_mnist_cnn,
                     *fsdp::testing::not_under_sanitizers("the plan's arithmetic runs in the other models' cases")) {
  for (const char* s : {"NO_SHARD", "FULL_SHARD", "SHARD_GRAD_OP"})
    check_plan_against_run(kCnn, {std::string("fsdp.sharding_strategy=") + s});
  // sgd with momentum (one state), no evaluation.
  check_plan_against_run(kCnn, {"train.optimizer.kind=sgd", "train.optimizer.lr=0.01", "train.optimizer.momentum=0.9",
                                "train.eval_every=never"});
}

BOOST_AUTO_TEST_CASE(plan_matches_measured_transformer) {
  for (const char* s : {"NO_SHARD", "FULL_SHARD", "SHARD_GRAD_OP"})
    check_plan_against_run(kLm, {std::string("fsdp.sharding_strategy=") + s});
  // Gradient accumulation keeps the full gradients of every unit between micro-batches.
  check_plan_against_run(kLm, {"train.grad_accum=2", "fsdp.mixed_precision.reduce_dtype=bf16"});
  // Attention's recompute mode: row statistics kept, one row block's scratch during each call
  // (seq_len 40: host blocks of 32 and 8 rows), also under activation checkpointing.
  check_plan_against_run(kLm, {"model.attention=recompute", "model.seq_len=40"});
  check_plan_against_run(kLm, {"model.attention=recompute", "fsdp.activation_checkpointing=true"});
}

BOOST_AUTO_TEST_CASE(plan_matches_measured_low_precision_on_one_rank) {
  // bf16 gathers and reductions gather and stage even on one rank: gathered, grads and comm
  // are all non-zero here.
  check_plan_against_run(kLm, {"fsdp.mixed_precision.param_dtype=bf16", "fsdp.mixed_precision.reduce_dtype=bf16"});
  check_plan_against_run(kCnn, {"fsdp.mixed_precision.param_dtype=bf16", "fsdp.mixed_precision.reduce_dtype=bf16",
                                "fsdp.sharding_strategy=SHARD_GRAD_OP"});
}

BOOST_AUTO_TEST_CASE(plan_matches_measured_activation_checkpointing) {
  check_plan_against_run(kLm, {"fsdp.activation_checkpointing=true", "fsdp.mixed_precision.param_dtype=bf16"});
}

namespace {

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Every "loss" of a metrics file as written (%.17g: the double's bits).
std::vector<std::string> loss_texts(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(f, line)) {
    auto at = line.find("\"loss\": ");
    if (at != std::string::npos) out.push_back(line.substr(at + 8, line.find_first_of(",}", at) - at - 8));
  }
  return out;
}

}  // namespace

// fsdp.mixed_precision.saved_activations: param_dtype (nn/activation_stash.h) holds each FSDP
// unit's activations in bf16 from the end of its forward to its backward. Lossless: every loss and
// every saved weight byte equal saved_activations: f32's, in every model and attention mode, with
// activation checkpointing and gradient accumulation; the activation peak is lower (the stash
// packs, and frees the f32 memory); and the plan equals the measured peaks to the byte.
BOOST_AUTO_TEST_CASE(saved_activations_in_bf16_same_bits_less_memory) {
  struct Case {
    const char* yaml;
    std::vector<std::string> overrides;
    bool lower_peak = true;  // the CNN's activation peak is conv2's im2col scratch in its forward
  };
  const std::vector<Case> cases = {
      {kLm, {}},
      {kLm, {"model.attention=recompute", "fsdp.activation_checkpointing=true"}},
      {kLm, {"train.grad_accum=2"}},
      // medium: every Linear's dW GEMM takes its packed input's bf16 values as they are.
      {kLm, {"train.matmul_precision=medium"}},
      {kLlama, {"train.matmul_precision=medium"}},
      // Units inside units (every Linear of a block its own): an inner unit's end packs what the
      // block rounded before it, which the block reads again (unpacked on access).
      {kLm, {"fsdp.auto_wrap.policy=size_based", "fsdp.auto_wrap.min_num_params=1000"}},
      {kCnn, {"fsdp.auto_wrap.min_num_params=1000"}, false},
      {kT5, {}},
      {kLlama, {}},
      {kLlama, {"fsdp.auto_wrap.policy=size_based", "fsdp.auto_wrap.min_num_params=500"}},
  };
  for (const Case& k : cases) {
    std::string label = std::string(k.yaml).substr(13, 12);
    for (const std::string& o : k.overrides) label += " " + o;
    std::vector<std::string> losses[2], weights(2);
    Measured peaks[2];
    for (int packed = 0; packed < 2; ++packed) {
      const std::string metrics = tmp("stash_metrics"), saved = tmp("stash_weights") + ".h5";
      std::vector<std::string> o = k.overrides;
      o.insert(o.end(), {"fsdp.mixed_precision.param_dtype=bf16", "train.eval_every=never",
                         std::string("fsdp.mixed_precision.saved_activations=") + (packed ? "param_dtype" : "f32"),
                         "output.metrics=" + metrics, "output.save_weights=" + saved});
      fsdp::Config c = cfg(k.yaml, o);
      fsdp::train(c, {});
      losses[packed] = loss_texts(metrics);
      weights[packed] = file_bytes(saved);
      peaks[packed] = measured_peaks(metrics);
      const fsdp::MemoryPlan plan = fsdp::plan_memory(c, req(1));
      BOOST_TEST(plan.total_peak_bytes == peaks[packed].total, label << " packed " << packed << ": planned "
                                                                     << plan.total_peak_bytes << " measured "
                                                                     << peaks[packed].total);
      const auto act = static_cast<size_t>(MemCategory::activations);
      BOOST_TEST(plan.peak_bytes[act] == peaks[packed].peak[act], label << " packed " << packed);
      std::filesystem::remove(metrics);
      std::filesystem::remove(saved);
    }
    BOOST_TEST_MESSAGE(label << ": activations peak " << peaks[0].peak[static_cast<size_t>(MemCategory::activations)]
                             << " f32, " << peaks[1].peak[static_cast<size_t>(MemCategory::activations)] << " packed");
    BOOST_TEST(!losses[0].empty());
    BOOST_TEST(losses[0] == losses[1], boost::test_tools::per_element());
    BOOST_TEST(!weights[0].empty());
    BOOST_TEST((weights[0] == weights[1]), label << ": saved weights differ");
    const auto act = static_cast<size_t>(MemCategory::activations);
    if (k.lower_peak)
      BOOST_TEST(peaks[1].peak[act] < peaks[0].peak[act], label);
    else
      BOOST_TEST(peaks[1].peak[act] <= peaks[0].peak[act], label);
  }
}

// ---- formulas at world sizes the test cannot run ----

namespace {

// Odd sizes so that units need padding: C 24, F 50, V 37, T 10, 3 blocks.
constexpr int64_t V = 37, C = 24, F = 50, T = 10, L = 3;
const char* kOdd =
    "model: {kind: transformer, vocab: 37, d_model: 24, n_layers: 3, n_heads: 4, d_ff: 50, seq_len: 10}\n"
    "data: {kind: synthetic, synthetic_samples: 64}\n"
    "train: {batch_size: 4, steps: 2, eval_every: never, optimizer: {kind: adamw, lr: 0.001}}\n"
    "fsdp: {auto_wrap: {policy: transformer_layer}}\n";

constexpr int64_t kBlock = 4 * C * C + 2 * C * F + 9 * C + F;  // ln1, in_proj, out_proj, ln2, fc1, fc2
constexpr int64_t kRoot = V * C + T * C + 2 * C + C * V + V;   // tok_emb, pos_emb, ln_f, head
int64_t pad(int64_t n, int64_t N) { return (n + N - 1) / N * N; }

}  // namespace

BOOST_AUTO_TEST_CASE(shard_sizes_and_model_states) {
  for (int N : {2, 4, 8}) {
    fsdp::MemoryPlan p = fsdp::plan_memory(cfg(kOdd), req(N));
    BOOST_TEST_MESSAGE(p.text());
    BOOST_REQUIRE(p.units.size() == size_t(L + 1));
    BOOST_TEST(p.num_params == kRoot + L * kBlock);
    BOOST_TEST(p.units[0].numel == kRoot);
    int64_t padded = 0;
    for (const fsdp::UnitPlan& u : p.units) {
      BOOST_TEST(u.padded_numel == pad(u.numel, N));
      BOOST_TEST(u.shard_numel * N == u.padded_numel);
      padded += u.padded_numel;
      if (&u != &p.units[0]) BOOST_TEST(u.numel == kBlock);
    }
    // f32 master shard + grad shard + adamw's two states = 16 bytes per padded param / N.
    const int64_t shard_bytes = 4 * padded / N;
    BOOST_TEST(p.peak(MemCategory::params) == shard_bytes);
    BOOST_TEST(p.peak(MemCategory::optim) == 2 * shard_bytes);
    BOOST_TEST(p.peak(MemCategory::params) + p.peak(MemCategory::optim) + shard_bytes == 16 * padded / N);
    // Full gradients: the root's, alive through the whole backward, plus three blocks: two whose
    // reduce_scatter is in flight and the one in backward; and the grad shards of those two (each
    // allocated when its reduction is issued, freed when the next step begins): none before.
    BOOST_TEST(p.peak(MemCategory::grads) ==
               4 * (L - 1) * pad(kBlock, N) / N + 4 * (pad(kRoot, N) + 3 * pad(kBlock, N)));
    // The root stays gathered; limit_all_gathers allows two more (computing + prefetched).
    BOOST_TEST(p.peak(MemCategory::gathered) == 4 * (pad(kRoot, N) + 2 * pad(kBlock, N)));
    BOOST_TEST(p.peak(MemCategory::comm) == 0);

    // Bytes per step: every block gathered twice (forward, backward), the root once (kept
    // from forward to backward); one reduce_scatter per unit; no all_reduce.
    BOOST_TEST(p.all_gather.calls == 2 * L + 1);
    BOOST_TEST(p.all_gather.bytes == 4 * (pad(kRoot, N) + 2 * L * pad(kBlock, N)));
    BOOST_TEST(p.all_gather.wire_bytes == p.all_gather.bytes * (N - 1) / N);
    BOOST_TEST(p.reduce_scatter.calls == L + 1);
    BOOST_TEST(p.reduce_scatter.bytes == 4 * padded);
    BOOST_TEST(p.all_reduce.calls == 0);
  }
}

BOOST_AUTO_TEST_CASE(strategies_at_world_size_eight) {
  const int64_t psi = kRoot + L * kBlock, N = 8;
  int64_t padded = pad(kRoot, N) + L * pad(kBlock, N);

  fsdp::MemoryPlan ns = fsdp::plan_memory(cfg(kOdd, {"fsdp.sharding_strategy=NO_SHARD"}), req(8));
  BOOST_TEST_MESSAGE(ns.text());
  BOOST_TEST(ns.shard_group_size == 1);
  BOOST_TEST(ns.replicas == 8);
  // 16 Psi, nothing gathered, gradients accumulate in the (whole) grad shard.
  BOOST_TEST(ns.peak(MemCategory::params) + ns.peak(MemCategory::grads) + ns.peak(MemCategory::optim) == 16 * psi);
  BOOST_TEST(ns.peak(MemCategory::gathered) == 0);
  BOOST_TEST(ns.all_gather.calls == 0);
  BOOST_TEST(ns.reduce_scatter.calls == 0);
  BOOST_TEST(ns.all_reduce.calls == L + 1);                     // one per unit's grad shard
  BOOST_TEST(ns.all_reduce.bytes == 4 * psi);                   // all the gradients
  BOOST_TEST(ns.all_reduce.wire_bytes == 2 * 4 * psi * 7 / 8);  // ~2 Psi per rank

  fsdp::MemoryPlan zero2 = fsdp::plan_memory(cfg(kOdd, {"fsdp.sharding_strategy=SHARD_GRAD_OP"}), req(8));
  // Every unit gathered by the end of forward: 4 Psi (padded) on top of 16 Psi / N.
  BOOST_TEST(zero2.peak(MemCategory::gathered) == 4 * padded);
  BOOST_TEST(zero2.peak(MemCategory::params) + zero2.peak(MemCategory::optim) == 12 * padded / N);
  BOOST_TEST(zero2.all_gather.calls == L + 1);  // once per unit, in forward
  BOOST_TEST(zero2.all_gather.bytes == 4 * padded);

  // bf16 gathers and reductions: half the bytes; the bf16 gather buffer of the prefetched block
  // is alive on top of the f32 copies; reduce_scatter stages in comm.
  fsdp::MemoryPlan mp = fsdp::plan_memory(
      cfg(kOdd, {"fsdp.mixed_precision.param_dtype=bf16", "fsdp.mixed_precision.reduce_dtype=bf16"}), req(8));
  BOOST_TEST(mp.all_gather.bytes == 2 * (pad(kRoot, N) + 2 * L * pad(kBlock, N)));
  BOOST_TEST(mp.reduce_scatter.bytes == 2 * padded);
  BOOST_TEST(mp.peak(MemCategory::gathered) == 4 * (pad(kRoot, N) + 2 * pad(kBlock, N)) + 2 * pad(kBlock, N));
  // The largest unit (a block here) stages padded + shard bf16 elements.
  BOOST_TEST(mp.peak(MemCategory::comm) == 2 * (pad(kBlock, N) + pad(kBlock, N) / N));
  // Waited reductions: the root's full gradient and the block in backward, no more, and the
  // grad shards of the blocks reduced before it.
  BOOST_TEST(mp.peak(MemCategory::grads) == 4 * (L - 1) * pad(kBlock, N) / N + 4 * (pad(kRoot, N) + pad(kBlock, N)));

  // HYBRID_SHARD, 8 ranks in shard groups of 4: pad to 4, all_reduce the shards over 2 replicas.
  fsdp::MemoryPlan hy = fsdp::plan_memory(cfg(kOdd, {"fsdp.sharding_strategy=HYBRID_SHARD"}), req(8, 4));
  const int64_t padded4 = pad(kRoot, 4) + L * pad(kBlock, 4);
  BOOST_TEST(hy.shard_group_size == 4);
  BOOST_TEST(hy.replicas == 2);
  BOOST_TEST(hy.peak(MemCategory::params) == padded4);  // 4 bytes * padded / 4
  BOOST_TEST(hy.all_reduce.calls == L + 1);
  BOOST_TEST(hy.all_reduce.group_size == 2);
  BOOST_TEST(hy.all_reduce.bytes == padded4);
  BOOST_CHECK_THROW(fsdp::plan_memory(cfg(kOdd, {"fsdp.sharding_strategy=HYBRID_SHARD"}), req(8, 3)), fsdp::Error);
}

namespace {

// Activation bytes a layer holds after forward (and backward) on a runtime, and its output shape.
struct LayerCharge {
  int64_t activations = 0;     // held between the forward and the backward (the output included)
  int64_t after_backward = 0;  // held once the backward returned: nothing (Layer::backward frees)
  int64_t peak_total = 0;
  fsdp::Shape output;
};

LayerCharge charge(fsdp::Layer& layer, bool meta, const fsdp::Shape& in, fsdp::DType dtype, bool training,
                   fsdp::Device meta_device = fsdp::Device::cpu) {
  fsdp::MemoryTracker tracker;
  std::unique_ptr<fsdp::DeviceRuntime> rt =
      meta ? fsdp::make_meta_runtime(meta_device, tracker) : std::make_unique<fsdp::HostRuntime>(tracker);
  // Parameters in the runtime's memory, zero: values do not matter to what is allocated.
  std::vector<fsdp::Param*> params = layer.params();
  std::vector<fsdp::Tensor> storage;
  for (fsdp::Param* p : params) {
    storage.push_back(fsdp::Tensor::zeros(*rt, p->shape, fsdp::DType::f32, MemCategory::other));
    storage.push_back(fsdp::Tensor::zeros(*rt, p->shape, fsdp::DType::f32, MemCategory::other));
    p->data = storage[storage.size() - 2].f32();
    p->grad = storage.back().f32();
  }
  fsdp::RunCtx ctx;
  ctx.mem = &tracker;
  ctx.runtime = rt.get();
  ctx.training = training;
  fsdp::Tensor x = fsdp::Tensor::zeros(*rt, in, dtype, MemCategory::other);
  LayerCharge c;
  fsdp::Tensor y = layer.forward(ctx, x);
  c.output = y.shape();
  c.activations = static_cast<int64_t>(tracker.current_bytes(MemCategory::activations));
  if (training) {
    const fsdp::Tensor dy = fsdp::Tensor::zeros(*rt, y.shape(), fsdp::DType::f32, MemCategory::other);
    y = fsdp::Tensor();  // the caller's handle on the output goes, as the next layer's would
    layer.backward(ctx, dy);
    c.after_backward = static_cast<int64_t>(tracker.current_bytes(MemCategory::activations));
  }
  c.peak_total = static_cast<int64_t>(tracker.peak_total_bytes());
  layer.release_activations();
  for (fsdp::Param* p : params) p->data = p->grad = nullptr;
  return c;
}

}  // namespace

// The meta device charges what the host runtime charges, layer by layer: the same buffers at
// the same moments, with nothing computed.
BOOST_AUTO_TEST_CASE(meta_device_charges_as_the_host_runtime) {
  std::unique_ptr<fsdp::Model> cnn = fsdp::make_mnist_cnn();
  std::unique_ptr<fsdp::Model> lm = fsdp::make_transformer(37, 24, 2, 4, 50, 10);
  for (bool training : {false, true}) {
    fsdp::Shape image{3, 1, 28, 28};
    int64_t held = 0;
    for (fsdp::Layer* l : cnn->layers()) {
      LayerCharge host = charge(*l, false, image, fsdp::DType::f32, training);
      LayerCharge meta = charge(*l, true, image, fsdp::DType::f32, training);
      BOOST_TEST(host.activations == meta.activations, l->name() << " training " << training);
      BOOST_TEST(host.peak_total == meta.peak_total, l->name() << " training " << training);
      BOOST_TEST(host.after_backward == 0, l->name() << " training " << training);
      BOOST_TEST(meta.after_backward == 0, l->name() << " training " << training);
      BOOST_TEST(host.output == meta.output, l->name());
      held += host.activations;
      image = host.output;
    }
    BOOST_TEST(held > 0);  // the comparison compared something
    fsdp::Shape tokens{2, 10};
    fsdp::DType dtype = fsdp::DType::i32;
    for (fsdp::Layer* l : lm->layers()) {
      LayerCharge host = charge(*l, false, tokens, dtype, training);
      LayerCharge meta = charge(*l, true, tokens, dtype, training);
      BOOST_TEST(host.activations == meta.activations, l->name() << " training " << training);
      BOOST_TEST(host.peak_total == meta.peak_total, l->name() << " training " << training);
      BOOST_TEST(host.after_backward == 0, l->name() << " training " << training);
      BOOST_TEST(meta.after_backward == 0, l->name() << " training " << training);
      BOOST_TEST(host.output == meta.output, l->name());
      tokens = host.output;
      dtype = fsdp::DType::f32;
    }
  }
}

// model.attention: fused, planned for a GPU (the meta device as cuda): the forward keeps each row's
// log-sum-exp (B, H, T) where recompute keeps its max and 1/sum and materialized the (B, H, T, T)
// probabilities, and q | k | v as the bf16 copy cuDNN read (B, T, 3C) where the others keep the
// f32 projections; everything else it holds is the same. o's bf16 copy lives during the call only.
// On the host (the CPU's kernels, or a plan for the CPU) it stops with the CPU's one line.
BOOST_AUTO_TEST_CASE(fused_attention_on_a_planned_gpu) {
  const int64_t B = 2, T = 10, C = 24, H = 3;
  const fsdp::Shape x{B, T, C};
  fsdp::MultiheadAttention mat("attn", C, H), rec("attn", C, H, fsdp::AttentionMode::recompute),
      fused("attn", C, H, fsdp::AttentionMode::fused);
  for (bool training : {false, true}) {
    const LayerCharge m = charge(mat, true, x, fsdp::DType::f32, training, fsdp::Device::cuda);
    const LayerCharge r = charge(rec, true, x, fsdp::DType::f32, training, fsdp::Device::cuda);
    const LayerCharge f = charge(fused, true, x, fsdp::DType::f32, training, fsdp::Device::cuda);
    const int64_t row_stat = B * H * T * 4, qkv_half = B * T * 3 * C * 2;  // bf16 instead of f32
    BOOST_TEST(r.activations - f.activations == row_stat + qkv_half, "training " << training);
    BOOST_TEST(m.activations - f.activations == B * H * T * T * 4 - row_stat + qkv_half, "training " << training);
    BOOST_TEST(m.after_backward + r.after_backward + f.after_backward == 0, "training " << training);
    // The scratch during the forward: the f32 projections until their bf16 copy is made.
    BOOST_TEST(f.peak_total >= f.activations + B * T * 3 * C * 4);
    BOOST_TEST(f.output == x);
  }
  fsdp::MemoryTracker tracker;
  fsdp::HostRuntime host(tracker);
  std::vector<fsdp::Tensor> storage;
  for (fsdp::Param* p : fused.params()) {
    storage.push_back(fsdp::Tensor::zeros(host, p->shape, fsdp::DType::f32, MemCategory::other));
    p->data = p->grad = storage.back().f32();
  }
  fsdp::RunCtx ctx;
  ctx.mem = &tracker;
  ctx.runtime = &host;
  ctx.training = true;
  try {
    fused.forward(ctx, fsdp::Tensor::zeros(host, x, fsdp::DType::f32, MemCategory::other));
    BOOST_ERROR("fused attention ran on the host");
  } catch (const fsdp::Error& e) {
    BOOST_TEST(std::string(e.what()).find("attn: model.attention: fused: fused attention runs on a GPU (cuDNN)") == 0,
               e.what());
  }
  fused.release_activations();  // before the runtime that holds them goes
  for (fsdp::Param* p : fused.params()) p->data = p->grad = nullptr;
}

// A planned GPU's GEMMs at matmul_precision high and medium charge the rounded operand copies the
// CUDA kernels hold while each runs (TF32 in f32: 4 bytes an element; bf16: 2), freed at once:
// op(A) of M x K and op(B) of K x N per batch (both run tensor/gemm_steps.h). highest and a planned CPU charge nothing
// (the CPU's copies are transient host memory outside the tracker).
BOOST_AUTO_TEST_CASE(planned_gpu_charges_rounded_gemm_operands) {
  const int64_t M = 7, N = 5, K = 3, batch = 4, rows = 6, in = 9, out = 11;
  for (fsdp::Device device : {fsdp::Device::cuda, fsdp::Device::cpu}) {
    for (fsdp::MatmulPrecision p :
         {fsdp::MatmulPrecision::highest, fsdp::MatmulPrecision::high, fsdp::MatmulPrecision::medium}) {
      BOOST_TEST_CONTEXT(fsdp::device_name(device) << " " << fsdp::matmul_precision_name(p)) {
        const int64_t e = device == fsdp::Device::cpu          ? 0
                          : p == fsdp::MatmulPrecision::medium ? 2
                          : p == fsdp::MatmulPrecision::high   ? 4
                                                               : 0;
        auto peak_of = [&](auto&& call) {
          fsdp::MemoryTracker tracker;
          auto rt = fsdp::make_meta_runtime(device, tracker);
          rt->kernels().set_matmul_precision(p);
          call(rt->kernels());
          BOOST_TEST(tracker.current_bytes(MemCategory::activations) == 0u);
          return static_cast<int64_t>(tracker.peak_bytes(MemCategory::activations));
        };
        BOOST_TEST(peak_of([&](fsdp::Kernels& k) {
                     k.gemm(true, false, M, N, K, 1.0f, nullptr, M, nullptr, N, 0.0f, nullptr, N);
                   }) == e * (M * K + K * N));
        BOOST_TEST(peak_of([&](fsdp::Kernels& k) {
                     k.gemm_strided_batched(false, true, M, N, K, 1.0f, nullptr, K, M * K, nullptr, K, 0, 0.0f, nullptr,
                                            N, M * N, batch);
                   }) == e * batch * (M * K + K * N));
        BOOST_TEST(peak_of([&](fsdp::Kernels& k) {
                     k.linear_forward(nullptr, nullptr, nullptr, nullptr, rows, in, out);
                   }) == e * (rows * in + out * in));
        // The backward rounds dY once for both GEMMs: dY's copy with X's (dW), then with W's (dX).
        BOOST_TEST(peak_of([&](fsdp::Kernels& k) {
                     float dx = 0;
                     k.linear_backward(&dx, nullptr, nullptr, nullptr, nullptr, nullptr, rows, in, out);
                   }) == e * (rows * out + std::max(rows * in, out * in)));
        BOOST_TEST(peak_of([&](fsdp::Kernels& k) {
                     k.linear_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, rows, in, out);
                   }) == e * (out * rows + rows * in));
        // A packed bf16 input (medium only) is dW's operand as it is: no copy of X at all.
        const uint16_t x_bf16 = 0;
        auto bf16_x = [&](bool with_dx) {
          float dx = 0;
          return peak_of([&](fsdp::Kernels& k) {
            k.linear_backward_bf16_x(with_dx ? &dx : nullptr, nullptr, nullptr, nullptr, &x_bf16, nullptr, rows, in,
                                     out);
          });
        };
        if (p == fsdp::MatmulPrecision::medium) {
          BOOST_TEST(bf16_x(true) == e * (rows * out + out * in));
          BOOST_TEST(bf16_x(false) == e * rows * out);
        } else {
          BOOST_CHECK_EXCEPTION(bf16_x(true), fsdp::Error, [](const fsdp::Error& err) {
            return std::string(err.what()).find("is the GEMM's rounded operand only at medium") != std::string::npos;
          });
        }
      }
    }
  }
}

// The meta device computes nothing and reads back zeros; a plan of a model far larger than the
// machine allocates address space only.
BOOST_AUTO_TEST_CASE(meta_device_holds_no_values) {
  fsdp::MemoryTracker tracker;
  auto rt = fsdp::make_meta_runtime(fsdp::Device::cuda, tracker);
  BOOST_TEST(!rt->holds_values());
  BOOST_TEST((rt->device() == fsdp::Device::cuda));
  // 64 GiB on a 24 GiB machine: reserved, charged, never committed.
  const size_t huge = size_t{64} << 30;
  void* p = rt->allocate(huge, MemCategory::gathered, rt->compute_stream());
  BOOST_TEST(tracker.current_bytes(MemCategory::gathered) == huge);
  float host[4] = {1, 2, 3, 4};
  rt->copy_async(host, p, sizeof host, fsdp::CopyKind::device_to_host, rt->compute_stream());
  BOOST_TEST(host[0] == 0.0f);
  BOOST_TEST(host[3] == 0.0f);
  rt->deallocate(p, huge, MemCategory::gathered, rt->compute_stream());
  BOOST_TEST(tracker.current_bytes(MemCategory::gathered) == 0u);
  BOOST_TEST(tracker.peak_bytes(MemCategory::gathered) == huge);
}

// fsdp.node_shared_params in a plan: the node's copy is charged only where the run's backend maps
// node-shared memory (the mpi backend); on another (ucx) the run all_gathers as usual, and so
// does the plan (it charged the copy for every backend before).
BOOST_AUTO_TEST_CASE(node_shared_params_planned_only_where_the_backend_maps_them) {
  const std::vector<std::string> built = fsdp::built_backends();
  for (const std::string& backend : built) {
    const bool maps = fsdp::find_backend(backend)->maps_node_memory;
    BOOST_TEST(maps == (backend == "mpi"), backend);
    if (backend == "nccl") continue;  // a device backend: node_shared_params is a host run's
    const fsdp::MemoryPlan off = fsdp::plan_memory(cfg(kOdd, {"comm.backend=" + backend}), req(4));
    const fsdp::MemoryPlan on =
        fsdp::plan_memory(cfg(kOdd, {"comm.backend=" + backend, "fsdp.node_shared_params=true"}), req(4));
    BOOST_TEST_MESSAGE(backend << ": gathered " << off.peak(MemCategory::gathered) << " -> "
                               << on.peak(MemCategory::gathered));
    if (maps)
      BOOST_TEST(on.peak(MemCategory::gathered) != off.peak(MemCategory::gathered), backend);
    else
      BOOST_TEST(on.peak(MemCategory::gathered) == off.peak(MemCategory::gathered), backend);
    BOOST_TEST(on.all_gather.calls == (maps ? 0 : off.all_gather.calls), backend);
  }
}
