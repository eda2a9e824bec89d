#pragma once
// Text <-> token ids. The seq2seq and causal-LM data encode with one, and generation decodes with
// the same. Two conventions for the special ids, the families' own:
//   t5:    pad 0, eos 1, unk 2, no bos (ByT5's byte ids and every HF T5 SentencePiece model);
//   llama: unk 0, bos 1, eos 2, no pad (Llama's tokenizer.model; bos/eos are config.json's
//          bos_token_id/eos_token_id, checked against the model file). Padding, which the loss
//          ignores, is written with eos.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp {

enum class TokenStyle { t5, llama };

// The special ids a tokenizer's model has; -1: none.
struct SpecialIds {
  int32_t pad = 0, eos = 1, bos = -1;
};
SpecialIds special_ids(TokenStyle style);  // t5 {0, 1, -1}, llama {2, 2, 1} (pad written as eos)

class Tokenizer {
 public:
  explicit Tokenizer(SpecialIds ids) : ids_(ids) {}
  virtual ~Tokenizer() = default;
  // The ids of `text`, neither bos nor eos added (the datasets add them).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The text of `ids`, stopping at the first eos and skipping the special ids (HF's
  // decode(skip_special_tokens=True) for what generation produces).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  int32_t pad_id() const { return ids_.pad; }
  int32_t eos_id() const { return ids_.eos; }
  int32_t bos_id() const { return ids_.bos; }  // -1: none (T5)
  // One line for the banner: "bytes (ByT5 ids)" or "sentencepiece FILE (N pieces)".
  virtual std::string describe() const = 0;

 private:
  SpecialIds ids_;
};

// Byte ids: byte + 3. t5 (ByT5's): pad 0, eos 1, unk 2; llama: unk 0, bos 1, eos 2. Vocab 259.
std::unique_ptr<Tokenizer> make_byte_tokenizer(TokenStyle style = TokenStyle::t5);

// A SentencePiece model file (the spiece.model of HF T5 folders, Llama's tokenizer.model, or
// spm_train's output) through Debian's libsentencepiece: encode = its ids for the text; decode =
// HF's decode(ids, skip_special_tokens=True) up to the first eos (data/sentencepiece.cpp says
// how; T5Tokenizer's clean-up of spaces before punctuation for t5, none for llama, whose
// tokenizer_config.json turns it off). The model's ids must be the style's: t5 pad 0 and eos 1;
// llama the bos and eos given (config.json's). Error naming the file when it cannot be read, is
// not a model, or has other ids.
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path, TokenStyle style = TokenStyle::t5,
                                              int32_t bos = 1, int32_t eos = 2);

// data.tokenizer: "" for bytes, else a SentencePiece model file; bos/eos as load_sentencepiece.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, TokenStyle style = TokenStyle::t5, int32_t bos = 1,
                                          int32_t eos = 2);

}  // namespace fsdp
