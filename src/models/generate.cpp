// Greedy and beam search over a model's decode steps, transformers 4.36's algorithms
// (generation/utils.py greedy_search and beam_search, beam_search.py BeamSearchScorer and
// BeamHypotheses) restated for one returned sequence per sample and a single eos id.
#include "models/generate.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "tensor/error.h"
#include "tensor/kernel_math.h"

namespace fsdp {

namespace {

// The Philox stream of generation's draws (dropout's streams hash layer names: no overlap).
constexpr uint64_t kSampleStream = 0x67656e6572617465ULL;  // "generate"

// torch.argmax: the first maximum.
int32_t argmax(const float* row, int64_t n) { return static_cast<int32_t>(std::max_element(row, row + n) - row); }

// log_softmax of one row in f32 (as torch computes it: max, then the log of the summed exps).
void log_softmax_row(float* out, const float* row, int64_t n) {
  const float max = *std::max_element(row, row + n);
  float sum = 0.0f;  // >= 1: the max's own term is exp(0)
  for (int64_t v = 0; v < n; ++v) sum += std::exp(row[v] - max);
  const float log_sum = std::log(std::max(sum, 1.0f));
  for (int64_t v = 0; v < n; ++v) out[v] = row[v] - max - log_sum;
}

// The finished hypotheses of one sample (HF's BeamHypotheses): the num_beams best by
// sum_logprobs / generated_len^length_penalty.
struct Hypotheses {
  struct Hyp {
    double score;
    std::vector<int32_t> ids;
  };
  int64_t num_beams;
  double length_penalty;
  std::vector<Hyp> beams;
  double worst_score = 1e9;

  void add(std::vector<int32_t> ids, double sum_logprobs, int64_t generated_len) {
    const double score = sum_logprobs / std::pow(static_cast<double>(generated_len), length_penalty);
    if (static_cast<int64_t>(beams.size()) < num_beams || score > worst_score) {
      beams.push_back({score, std::move(ids)});
      if (static_cast<int64_t>(beams.size()) > num_beams) {
        // Python's sorted() of (score, index) pairs: the worst goes, the next worst is the bar.
        std::vector<size_t> order(beams.size());
        std::iota(order.begin(), order.end(), size_t{0});
        std::stable_sort(order.begin(), order.end(),
                         [&](size_t a, size_t b) { return beams[a].score < beams[b].score; });
        worst_score = beams[order[1]].score;
        beams.erase(beams.begin() + static_cast<std::ptrdiff_t>(order[0]));
      } else {
        worst_score = std::min(score, worst_score);
      }
    }
  }
  // early_stopping false: done when no running beam can still beat the worst kept hypothesis.
  bool is_done(double best_sum_logprobs, int64_t generated_len) const {
    if (static_cast<int64_t>(beams.size()) < num_beams) return false;
    return worst_score >= best_sum_logprobs / std::pow(static_cast<double>(generated_len), length_penalty);
  }
  // The best: Python's sorted(...).pop() takes the last of equal scores.
  const Hyp& best() const {
    size_t b = 0;
    for (size_t i = 1; i < beams.size(); ++i)
      if (beams[i].score >= beams[b].score) b = i;
    return beams[b];
  }
};

}  // namespace

int32_t sample_token(const float* logits, int64_t V, const GenerateOptions& o, float u) {
  // TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper in f32, as HF applies them;
  // a filtered token's score is -inf.
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<float> scores(logits, logits + V);
  if (o.temperature != 1.0)
    for (float& x : scores) x = x / static_cast<float>(o.temperature);
  if (o.top_k > 0 && o.top_k < V) {  // keep scores >= the k-th largest (ties at it stay)
    std::vector<float> sorted = scores;
    std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<>());
    const float kth = sorted[static_cast<size_t>(o.top_k - 1)];
    for (float& x : scores)
      if (x < kth) x = neg_inf;
  }
  if (o.top_p < 1.0) {  // ascending; drop the prefix whose cumulative probability is <= 1 - top_p
    std::vector<int64_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), int64_t{0});
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return scores[static_cast<size_t>(a)] < scores[static_cast<size_t>(b)];
    });
    std::vector<float> probs(static_cast<size_t>(V));
    log_softmax_row(probs.data(), scores.data(), V);
    float cumulative = 0.0f;
    for (int64_t r = 0; r + 1 < V; ++r) {  // the largest is always kept (min_tokens_to_keep 1)
      const auto i = static_cast<size_t>(order[static_cast<size_t>(r)]);
      cumulative += std::exp(probs[i]);
      if (cumulative > static_cast<float>(1.0 - o.top_p)) break;
      scores[i] = neg_inf;
    }
  }
  // softmax, then the first token whose cumulative probability passes u.
  const float max = *std::max_element(scores.begin(), scores.end());
  double total = 0.0;
  for (float& x : scores) total += x = std::exp(x - max);
  const double target = static_cast<double>(u) * total;
  double cumulative = 0.0;
  int32_t last = 0;
  for (int64_t v = 0; v < V; ++v) {
    if (scores[static_cast<size_t>(v)] <= 0.0f) continue;
    last = static_cast<int32_t>(v);
    cumulative += scores[static_cast<size_t>(v)];
    if (cumulative > target) return last;
  }
  return last;  // u at the very top (rounding): the last token with any probability
}

std::vector<std::vector<int32_t>> greedy_search(DecodeSteps& steps, int64_t batch, const GenerateOptions& o) {
  const int64_t V = steps.vocab_size();
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(batch));
  std::vector<int32_t> tokens(static_cast<size_t>(batch), o.decoder_start_id), origin(tokens.size());
  std::iota(origin.begin(), origin.end(), 0);
  std::vector<bool> finished(tokens.size(), false);
  for (int64_t t = 0; t < o.max_new_tokens; ++t) {
    const float* logits = steps.step(tokens, origin);
    bool all_done = true;
    for (size_t b = 0; b < tokens.size(); ++b) {
      if (finished[b]) {  // HF feeds finished sequences pad and drops what they produce
        tokens[b] = o.pad_id;
        continue;
      }
      const float* row = logits + static_cast<int64_t>(b) * V;
      if (o.do_sample) {
        const auto sample = static_cast<uint64_t>(o.first_sample + static_cast<int64_t>(b));
        const float u = kmath::philox_uniform(
            o.seed, kSampleStream, sample * static_cast<uint64_t>(o.max_new_tokens) + static_cast<uint64_t>(t));
        tokens[b] = sample_token(row, V, o, u);
      } else {
        tokens[b] = argmax(row, V);
      }
      out[b].push_back(tokens[b]);
      finished[b] = tokens[b] == o.eos_id;
      all_done = all_done && finished[b];
    }
    if (all_done) break;
  }
  return out;
}

std::vector<std::vector<int32_t>> beam_search(DecodeSteps& steps, int64_t batch, const GenerateOptions& o) {
  if (o.num_beams < 1) throw Error("generate: num_beams " + std::to_string(o.num_beams) + " is not at least 1");
  const int64_t V = steps.vocab_size(), K = o.num_beams, N = batch * K;
  // Running beams: their ids so far (no start token) and summed log-probabilities. All beams of
  // a sample start equal; all but the first at -1e9, so the first step draws from one only.
  std::vector<std::vector<int32_t>> ids(static_cast<size_t>(N));
  std::vector<float> beam_scores(static_cast<size_t>(N), 0.0f);
  for (int64_t i = 0; i < N; ++i)
    if (i % K != 0) beam_scores[static_cast<size_t>(i)] = -1e9f;
  std::vector<Hypotheses> hyps(static_cast<size_t>(batch), Hypotheses{K, o.length_penalty, {}, 1e9});
  std::vector<bool> done(static_cast<size_t>(batch), false);
  std::vector<int32_t> tokens(static_cast<size_t>(N), o.decoder_start_id), origin(static_cast<size_t>(N));
  std::iota(origin.begin(), origin.end(), 0);
  std::vector<float> scores(static_cast<size_t>(K * V));
  std::vector<int64_t> order(static_cast<size_t>(K * V));
  for (int64_t generated = 1; generated <= o.max_new_tokens; ++generated) {
    const float* logits = steps.step(tokens, origin);
    std::vector<std::vector<int32_t>> next_ids(static_cast<size_t>(N));
    std::vector<float> next_scores(static_cast<size_t>(N));
    for (int64_t b = 0; b < batch; ++b) {
      const size_t sb = static_cast<size_t>(b);
      if (done[sb]) {  // a finished sample's beams keep running on pad, scores 0 (HF)
        std::fill_n(tokens.begin() + b * K, K, o.pad_id);
        std::fill_n(origin.begin() + b * K, K, static_cast<int32_t>(b * K));
        std::fill_n(next_scores.begin() + b * K, K, 0.0f);
        continue;
      }
      // scores (K * V) = log_softmax(logits) + the beam's score; the 2K best, best first.
      for (int64_t j = 0; j < K; ++j) {
        float* row = scores.data() + j * V;
        log_softmax_row(row, logits + (b * K + j) * V, V);
        for (int64_t v = 0; v < V; ++v) row[v] += beam_scores[static_cast<size_t>(b * K + j)];
      }
      const int64_t top = std::min<int64_t>(2 * K, K * V);
      std::iota(order.begin(), order.end(), int64_t{0});
      std::partial_sort(order.begin(), order.begin() + top, order.end(), [&](int64_t x, int64_t y) {
        return scores[static_cast<size_t>(x)] > scores[static_cast<size_t>(y)] ||
               (scores[static_cast<size_t>(x)] == scores[static_cast<size_t>(y)] && x < y);
      });
      int64_t kept = 0;
      for (int64_t rank = 0; rank < top && kept < K; ++rank) {
        const int64_t flat = order[static_cast<size_t>(rank)];
        const auto token = static_cast<int32_t>(flat % V);
        const int64_t from = b * K + flat / V;
        const float score = scores[static_cast<size_t>(flat)];
        if (token == o.eos_id) {
          if (rank >= K) continue;  // an eos below the K best candidates does not finish a beam
          std::vector<int32_t> hyp = ids[static_cast<size_t>(from)];
          hyp.push_back(token);
          hyps[sb].add(std::move(hyp), score, generated);
          continue;
        }
        const size_t dst = static_cast<size_t>(b * K + kept);
        next_ids[dst] = ids[static_cast<size_t>(from)];
        next_ids[dst].push_back(token);
        next_scores[dst] = score;
        tokens[dst] = token;
        origin[dst] = static_cast<int32_t>(from);
        ++kept;
      }
      done[sb] = hyps[sb].is_done(scores[static_cast<size_t>(order[0])], generated);
    }
    ids = std::move(next_ids);
    beam_scores = next_scores;
    if (std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
  }
  // Samples still open at max_new_tokens: every running beam competes as it is.
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const size_t sb = static_cast<size_t>(b);
    if (!done[sb])
      for (int64_t j = 0; j < K; ++j) {
        const size_t i = static_cast<size_t>(b * K + j);
        const auto len = static_cast<int64_t>(ids[i].size());
        hyps[sb].add(ids[i], beam_scores[i], len);
      }
    out[sb] = hyps[sb].best().ids;
  }
  return out;
}

}  // namespace fsdp
