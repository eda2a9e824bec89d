#pragma once
// Decoding for sequence-to-sequence models, as Hugging Face transformers 4.36's generate() does
// it with do_sample off: greedy search (num_beams 1), or beam search (BeamSearchScorer with
// length_penalty, early_stopping false, one returned sequence). The model supplies the steps: the
// next-token logits of N running sequences, its encoder run once and its decoder's keys and
// values cached; the search sees only those host logits.
#include <cstdint>
#include <span>
#include <vector>

namespace fsdp {

struct GenerateOptions {
  int64_t max_new_tokens = 20;  // tokens generated at most (HF's max_new_tokens)
  int64_t num_beams = 1;        // 1: greedy
  double length_penalty = 1.0;  // beam: a finished hypothesis scores sum_logprobs / length^this
  int32_t pad_id = 0, eos_id = 1, decoder_start_id = 0;
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
// no padding. greedy_search's steps run batch sequences, beam_search's batch * num_beams.
std::vector<std::vector<int32_t>> greedy_search(DecodeSteps& steps, int64_t batch, const GenerateOptions& o);
std::vector<std::vector<int32_t>> beam_search(DecodeSteps& steps, int64_t batch, const GenerateOptions& o);

}  // namespace fsdp
