#pragma once
// Decoding, as Hugging Face transformers 4.36's generate() does it: greedy search (num_beams 1),
// multinomial sampling (do_sample: the temperature, top-k and top-p warpers in HF's order, then
// a draw from the softmax), or beam search (BeamSearchScorer with length_penalty, early_stopping
// false, one returned sequence). The model supplies the steps: the next-token logits of N running
// sequences, a sequence-to-sequence model's encoder run once or a causal LM's prompt read once,
// the keys and values cached; the search sees only those host logits.
#include <cstdint>
#include <span>
#include <vector>

namespace fsdp {

struct GenerateOptions {
  int64_t max_new_tokens = 20;  // tokens generated at most (HF's max_new_tokens)
  int64_t num_beams = 1;        // 1: greedy
  double length_penalty = 1.0;  // beam: a finished hypothesis scores sum_logprobs / length^this
  int32_t pad_id = 0, eos_id = 1, decoder_start_id = 0;
  // Sampling (num_beams 1): logits / temperature, the top_k largest kept (0: all), the smallest
  // set whose probability reaches top_p kept (1: all), then one draw per step. The draw of
  // sample i (its index among all samples, first_sample + its row) at step t is the counter
  // (i, t) of a Philox stream keyed by seed: the same at any world size and batch size. It is
  // not torch.multinomial's stream: sampled text equals HF's in distribution, not token for token.
  bool do_sample = false;
  double temperature = 1.0;
  int64_t top_k = 50;
  double top_p = 1.0;
  uint64_t seed = 0;
  int64_t first_sample = 0;
};

// N = batch * beams running sequences. step() feeds tokens[i] to sequence i after its cache has
// taken the state of sequence origin[i] (beam search's reordering; origin[i] == i in greedy) and
// returns the next-token logits (N, vocab_size()) in host memory, valid until the next call.
class DecodeSteps {
 public:
  virtual ~DecodeSteps() = default;
  virtual int64_t vocab_size() const = 0;
  virtual const float* step(std::span<const int32_t> tokens, std::span<const int32_t> origin) = 0;
};

// The generated ids of each of `batch` samples: no start token, the eos when one was produced,
// no padding. greedy_search's steps run batch sequences (argmax, or a draw with do_sample),
// beam_search's batch * num_beams.
std::vector<std::vector<int32_t>> greedy_search(DecodeSteps& steps, int64_t batch, const GenerateOptions& o);
// The token that sampling draws from one row of logits (V) with uniform u in [0, 1): exposed for
// the tests of the warpers.
int32_t sample_token(const float* logits, int64_t V, const GenerateOptions& o, float u);
std::vector<std::vector<int32_t>> beam_search(DecodeSteps& steps, int64_t batch, const GenerateOptions& o);

}  // namespace fsdp
