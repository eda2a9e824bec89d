#define BOOST_TEST_MODULE train
#include <boost/test/unit_test.hpp>
// End-to-end training in-process on small data: both models learn, runs are deterministic, and
// gradient accumulation matches the same global batch in one piece.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "sanitizer_skip.h"
#include "train/trainer.h"

namespace {

fsdp::Config cfg(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return fsdp::parse_config(yaml, "test.yaml", overrides);
}

std::vector<double> step_losses(const std::string& metrics_path) {
  std::ifstream f(metrics_path);
  std::vector<double> losses;
  std::string line;
  while (std::getline(f, line)) {
    auto at = line.find("\"loss\": ");
    if (at != std::string::npos) losses.push_back(std::stod(line.substr(at + 8)));
  }
  return losses;
}

std::string tmp(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + std::to_string(getpid()))).string();
}

const char* kCnn =
    "model: {kind: mnist_cnn}\n"
    "data: {kind: synthetic, synthetic_samples: 512}\n"
    "train: {batch_size: 32, epochs: 2, eval_every: epoch, eval_batch_size: 64,\n"
    "        optimizer: {kind: adadelta, lr: 1.0}, scheduler: {kind: step, gamma: 0.7}}\n";

const char* kLm =
    "model: {kind: transformer, vocab: 32, d_model: 32, n_layers: 2, n_heads: 4, d_ff: 64, seq_len: 16}\n"
    "data: {kind: synthetic, synthetic_samples: 512}\n"
    "train: {batch_size: 16, steps: 60, eval_every: never, optimizer: {kind: adamw, lr: 0.003}}\n";

}  // namespace

// 32 steps and an evaluation: 29 s of the ASan suite, whose CNN code the shorter CNN cases below
// (dropout, matmul precision) run instrumented.
BOOST_AUTO_TEST_CASE(
    mnist_cnn_learns_synthetic_images,
    *fsdp::testing::not_under_sanitizers("a learning check; the CNN's code runs in the shorter cases")) {
  fsdp::TrainSummary s = fsdp::train(cfg(kCnn), {});
  BOOST_TEST(s.steps == 32);  // 2 epochs x 512/32
  BOOST_TEST(s.eval_accuracy > 0.95, "eval accuracy " << s.eval_accuracy);
  BOOST_TEST(s.eval_loss < 0.3);
}

BOOST_AUTO_TEST_CASE(transformer_learns_synthetic_tokens) {
  std::string m = tmp("lm_metrics");
  fsdp::train(cfg(kLm, {"output.metrics=" + m}), {});
  std::vector<double> l = step_losses(m);
  BOOST_REQUIRE(l.size() == 60u);
  // Starts near ln(32) = 3.47 and the mostly-deterministic token rule is learned well below.
  BOOST_TEST(std::abs(l.front() - std::log(32.0)) < 0.6);
  BOOST_TEST(l.back() < 0.5 * l.front(), "first " << l.front() << " last " << l.back());
  std::filesystem::remove(m);
}

BOOST_AUTO_TEST_CASE(runs_are_bitwise_deterministic) {
  std::string a = tmp("det_a"), b = tmp("det_b");
  fsdp::train(cfg(kLm, {"train.steps=8", "output.metrics=" + a}), {});
  fsdp::train(cfg(kLm, {"train.steps=8", "output.metrics=" + b}), {});
  std::vector<double> la = step_losses(a), lb = step_losses(b);
  BOOST_TEST(la == lb, boost::test_tools::per_element());
  std::filesystem::remove(a);
  std::filesystem::remove(b);
}

// train.matmul_precision rounds every GEMM's operands: the first loss moves by about the
// rounding (bf16's 2^-8, TF32's 2^-11, relative, averaged down over the batch), never more than
// a percent, and the models still learn.
BOOST_AUTO_TEST_CASE(matmul_precision_rounds_gemm_operands) {
  for (const char* model : {kLm, kCnn}) {
    std::vector<std::vector<double>> runs;
    for (const char* p : {"highest", "high", "medium"}) {
      std::string m = tmp(std::string("mp_") + p);
      // Losses only: no evaluation (the CNN's at the end of the run was a fifth of this case).
      // Three steps: enough to see both models learn (six were 23 s of the ASan suite).
      fsdp::train(cfg(model, {"train.epochs=0", "train.steps=3", "train.eval_every=never",
                              std::string("train.matmul_precision=") + p, "output.metrics=" + m}),
                  {});
      runs.push_back(step_losses(m));
      std::filesystem::remove(m);
      BOOST_REQUIRE(runs.back().size() == 3u);
    }
    const double first = runs[0][0];
    for (int r : {1, 2}) {
      BOOST_TEST(runs[r][0] != first, "precision " << r << " changed nothing");
      BOOST_TEST(std::abs(runs[r][0] - first) <= 1e-2 * first);
      BOOST_TEST(runs[r].back() < runs[r].front());
    }
  }
}

BOOST_AUTO_TEST_CASE(grad_accum_equals_one_big_batch) {
  // 2 micro-batches of 16 see the same 32 samples with the same normaliser as one batch of 32.
  std::string a = tmp("acc_a"), b = tmp("acc_b");
  fsdp::train(cfg(kLm, {"train.steps=6", "train.batch_size=32", "output.metrics=" + a}), {});
  fsdp::train(cfg(kLm, {"train.steps=6", "train.batch_size=16", "train.grad_accum=2", "output.metrics=" + b}), {});
  std::vector<double> la = step_losses(a), lb = step_losses(b);
  BOOST_REQUIRE(la.size() == 6u);
  BOOST_REQUIRE(lb.size() == 6u);
  for (size_t i = 0; i < la.size(); ++i) BOOST_TEST(std::abs(la[i] - lb[i]) <= 1e-5 * std::abs(la[i]), "step " << i);
  std::filesystem::remove(a);
  std::filesystem::remove(b);
}

BOOST_AUTO_TEST_CASE(dropout_changes_training_only_when_on) {
  std::string a = tmp("do_a"), b = tmp("do_b");
  // One step each: the first loss is what differs (3 steps were 8.5 s of the ASan suite).
  fsdp::train(cfg(kCnn, {"train.epochs=0", "train.steps=1", "train.dropout=false", "train.eval_every=never",
                         "output.metrics=" + a}),
              {});
  fsdp::train(cfg(kCnn, {"train.epochs=0", "train.steps=1", "train.dropout=true", "train.eval_every=never",
                         "output.metrics=" + b}),
              {});
  std::vector<double> la = step_losses(a), lb = step_losses(b);
  BOOST_REQUIRE(la.size() == 1u);
  BOOST_REQUIRE(lb.size() == 1u);
  BOOST_TEST(la[0] != lb[0]);  // same weights, same batch: only the masks differ
  std::filesystem::remove(a);
  std::filesystem::remove(b);
}

BOOST_AUTO_TEST_CASE(transformer_trains_on_the_text_corpus) {
  std::string m = tmp("text_metrics");
  fsdp::TrainSummary s =
      fsdp::train(cfg("model: {kind: transformer, d_model: 32, n_layers: 1, n_heads: 2, d_ff: 64, seq_len: 32}\n"
                      "data: {kind: text, path: /usr/share/games/fortunes/fortunes}\n"
                      "train: {batch_size: 8, steps: 30, eval_every: 30, eval_batch_size: 64, optimizer: {kind: adamw, "
                      "lr: 0.003}}\n",
                      {"output.metrics=" + m}),
                  {});
  std::vector<double> l = step_losses(m);
  BOOST_REQUIRE(l.size() == 30u);
  BOOST_TEST(std::abs(l.front() - std::log(256.0)) < 1.0);  // uniform-ish start over bytes
  BOOST_TEST(l.back() < l.front() - 1.0);
  BOOST_TEST(s.eval_loss > 0.0);
  BOOST_TEST(s.eval_loss < l.front());
  std::filesystem::remove(m);
}

BOOST_AUTO_TEST_CASE(f16_dynamic_loss_scaling_skips_overflowing_steps) {
  // Gradients times an initial scale of 2^28 overflow f16 in the reduction: those steps are
  // skipped and the scale halves until the gradients fit; then training proceeds.
  std::string m = tmp("f16_metrics");
  fsdp::train(
      cfg(kLm, {"train.steps=30", "fsdp.mixed_precision.param_dtype=f16", "fsdp.mixed_precision.reduce_dtype=f16",
                "fsdp.mixed_precision.init_loss_scale=268435456", "output.metrics=" + m}),
      {});
  std::ifstream f(m);
  std::string line;
  int skipped = 0, steps = 0;
  double first_scale = 0, last_scale = 0, first_loss = 0, last_loss = 0;
  while (std::getline(f, line)) {
    if (line.find("\"loss_scale\"") == std::string::npos) continue;
    double scale = std::stod(line.substr(line.find("\"loss_scale\": ") + 14));
    double loss = std::stod(line.substr(line.find("\"loss\": ") + 8));
    skipped += line.find("\"step_skipped\": 1") != std::string::npos;
    if (steps++ == 0) first_scale = scale, first_loss = loss;
    last_scale = scale;
    last_loss = loss;
  }
  BOOST_TEST(steps == 30);
  BOOST_TEST(first_scale == 268435456.0);
  BOOST_TEST(skipped >= 1);
  BOOST_TEST(last_scale < first_scale);
  BOOST_TEST(std::isfinite(last_loss));
  BOOST_TEST(last_loss < first_loss);
  std::filesystem::remove(m);
}

// ---- ROUGE (train/rouge.h): rouge_score 0.1.2's numbers, worked by hand ----------------------
#include "models/generate.h"
#include "train/rouge.h"

BOOST_AUTO_TEST_SUITE(rouge_scores)

BOOST_AUTO_TEST_CASE(tokenizer_is_rouge_scores) {
  // Lowercase; every run outside [a-z0-9] separates (punctuation, apostrophes, non-ASCII bytes).
  const std::vector<std::string> want = {"hello", "world", "42x", "don", "t", "caf"};
  BOOST_CHECK(fsdp::rouge_tokenize("Hello, WORLD!\n42x -- don't caf\xc3\xa9") == want);
  BOOST_CHECK(fsdp::rouge_tokenize(" ,;  ").empty());
}

BOOST_AUTO_TEST_CASE(f_measures) {
  // ref: the cat sat on the mat / pred: the cat is on the mat
  // unigrams: the 2 + cat + on + mat = 5 of 6 each side -> 5/6; bigrams: the cat, on the,
  // the mat = 3 of 5 -> 3/5; LCS the cat on the mat = 5 -> 5/6.
  const fsdp::RougeScores s = fsdp::rouge("The cat sat on the mat.", "the cat is on the mat");
  BOOST_CHECK_CLOSE(s.rouge1, 5.0 / 6.0, 1e-12);
  BOOST_CHECK_CLOSE(s.rouge2, 3.0 / 5.0, 1e-12);
  BOOST_CHECK_CLOSE(s.rougeL, 5.0 / 6.0, 1e-12);
  // Counts clip: "a a a" against "a": P 1/3, R 1 -> F 0.5; no bigram in the reference -> 0.
  const fsdp::RougeScores clip = fsdp::rouge("a", "a a a");
  BOOST_CHECK_CLOSE(clip.rouge1, 0.5, 1e-12);
  BOOST_CHECK_EQUAL(clip.rouge2, 0.0);
  BOOST_CHECK_CLOSE(clip.rougeL, 0.5, 1e-12);
  // LCS keeps order: ref a b c d, pred d c b a -> LCS 1 -> 1/4.
  BOOST_CHECK_CLOSE(fsdp::rouge("a b c d", "d c b a").rougeL, 0.25, 1e-12);
  const fsdp::RougeScores empty = fsdp::rouge("something", "");
  BOOST_CHECK_EQUAL(empty.rouge1 + empty.rouge2 + empty.rougeL, 0.0);
}

BOOST_AUTO_TEST_SUITE_END()

// ---- greedy and beam search (models/generate.h) over a fixed next-token table ---------------
namespace {

// Tokens: 0 pad, 1 eos, 2 "a", 3 "b". The next-token probabilities depend on the last token:
// start: a .5, b .4, eos .1; after a: eos .3, a .35, b .35; after b: eos .9, a .05, b .05.
// Greedy takes a, then a (a and b tie: the first), then a. Beam search with 2 beams finds
// "b eos" (log .36 / 2 = -0.51) over every continuation of a.
class TableSteps : public fsdp::DecodeSteps {
 public:
  explicit TableSteps(int64_t n) : last_(static_cast<size_t>(n), -1), logits_(static_cast<size_t>(n) * 4) {}
  int64_t vocab_size() const override { return 4; }
  const float* step(std::span<const int32_t> tokens, std::span<const int32_t> origin) override {
    ++calls;
    std::vector<int32_t> prev(last_.size());
    for (size_t i = 0; i < last_.size(); ++i) prev[i] = last_[static_cast<size_t>(origin[i])];
    for (size_t i = 0; i < last_.size(); ++i) {
      // the start token (0 at the first step) reads as "start"
      const int32_t last = prev[i] < 0 ? -1 : tokens[i];
      const float* p = last == 2 ? kAfterA : last == 3 ? kAfterB : kStart;
      for (int v = 0; v < 4; ++v) logits_[i * 4 + static_cast<size_t>(v)] = std::log(p[v]);
      last_[i] = tokens[i];
    }
    return logits_.data();
  }
  int calls = 0;

 private:
  static constexpr float kStart[4] = {1e-6f, 0.1f, 0.5f, 0.4f};
  static constexpr float kAfterA[4] = {1e-6f, 0.3f, 0.35f, 0.35f};
  static constexpr float kAfterB[4] = {1e-6f, 0.9f, 0.05f, 0.05f};
  std::vector<int32_t> last_;  // each sequence's last fed token, -1 before the first step
  std::vector<float> logits_;
};

}  // namespace

BOOST_AUTO_TEST_SUITE(search)

BOOST_AUTO_TEST_CASE(greedy_takes_the_first_maximum_and_stops_at_max_new_tokens) {
  TableSteps steps(2);
  fsdp::GenerateOptions o;
  o.max_new_tokens = 3;
  const auto out = fsdp::greedy_search(steps, 2, o);
  const std::vector<int32_t> want = {2, 2, 2};
  BOOST_CHECK(out.at(0) == want);
  BOOST_CHECK(out.at(1) == want);
  BOOST_CHECK_EQUAL(steps.calls, 3);
}

// The warpers of do_sample, on logits whose softmax is (0.05, 0.1, 0.15, 0.3, 0.4) over tokens
// 0..4: the draw u picks the first token whose cumulative probability (of the kept tokens,
// renormalised) passes u.
BOOST_AUTO_TEST_CASE(sampling_applies_temperature_top_k_and_top_p_in_order) {
  const std::vector<double> p = {0.05, 0.1, 0.15, 0.3, 0.4};
  std::vector<float> logits;
  for (double x : p) logits.push_back(static_cast<float>(std::log(x)));
  fsdp::GenerateOptions o;
  o.top_k = 0;  // all five: cumulative 0.05, 0.15, 0.3, 0.6, 1.0
  auto draw = [&](float u) { return fsdp::sample_token(logits.data(), 5, o, u); };
  BOOST_TEST(draw(0.0f) == 0);
  BOOST_TEST(draw(0.04f) == 0);
  BOOST_TEST(draw(0.06f) == 1);
  BOOST_TEST(draw(0.29f) == 2);
  BOOST_TEST(draw(0.59f) == 3);
  BOOST_TEST(draw(0.999f) == 4);
  o.top_k = 2;  // tokens 3 and 4: 3/7 and 4/7
  BOOST_TEST(draw(0.42f) == 3);
  BOOST_TEST(draw(0.44f) == 4);
  o.top_k = 0;
  o.top_p = 0.75;  // ascending cumulative 0.05, 0.15, 0.3 <= 0.25 goes for the first two only: 2, 3, 4 kept
  BOOST_TEST(draw(0.0f) == 2);
  BOOST_TEST(draw(0.5f) == 3);  // 0.15/0.85 = 0.18, 0.45/0.85 = 0.53
  BOOST_TEST(draw(0.6f) == 4);
  o.top_p = 0.01;  // the most likely alone (min_tokens_to_keep 1)
  BOOST_TEST(draw(0.0f) == 4);
  BOOST_TEST(draw(0.99f) == 4);
  o.top_p = 1.0;
  o.temperature = 1e-3;  // the largest takes all the mass
  BOOST_TEST(draw(0.0f) == 4);
  o.temperature = 1e3;  // nearly uniform: u 0.5 lands in the middle token
  BOOST_TEST(draw(0.5f) == 2);
}

// greedy_search with do_sample: the draws depend on (seed, sample, step) only, so a batch split
// differently (first_sample) draws the same tokens for the same sample.
BOOST_AUTO_TEST_CASE(sampled_tokens_are_keyed_by_the_sample_not_the_batch) {
  fsdp::GenerateOptions o;
  o.max_new_tokens = 6;
  o.do_sample = true;
  o.top_k = 0;
  o.seed = 7;
  TableSteps both(2);
  const auto pair = fsdp::greedy_search(both, 2, o);
  TableSteps second(1);
  o.first_sample = 1;
  const auto alone = fsdp::greedy_search(second, 1, o);
  BOOST_CHECK(alone.at(0) == pair.at(1));
  o.seed = 8;  // another seed: another draw somewhere in 40 samples
  bool differs = false;
  for (int64_t i = 0; i < 40 && !differs; ++i) {
    TableSteps a(1), b(1);
    o.first_sample = i;
    o.seed = 7;
    const auto x = fsdp::greedy_search(a, 1, o);
    o.seed = 8;
    differs = x != fsdp::greedy_search(b, 1, o);
  }
  BOOST_TEST(differs);
}

BOOST_AUTO_TEST_CASE(beam_search_finds_the_better_finished_hypothesis) {
  TableSteps steps(2 * 2);
  fsdp::GenerateOptions o;
  o.max_new_tokens = 10;
  o.num_beams = 2;
  const auto out = fsdp::beam_search(steps, 2, o);
  const std::vector<int32_t> want = {3, 1};  // b eos
  BOOST_CHECK(out.at(0) == want);
  BOOST_CHECK(out.at(1) == want);
  // Step 2 finishes "b eos"; step 3 finishes "a b eos" (-1.848 / 3), and with two hypotheses
  // no running beam can beat the worst: done after 3 steps, not 10.
  BOOST_CHECK_EQUAL(steps.calls, 3);
}

BOOST_AUTO_TEST_SUITE_END()
