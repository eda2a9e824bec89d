#pragma once
// Text <-> token ids. The seq2seq data encodes with one, and generation decodes with the same.
// Ids follow T5's conventions: pad 0, eos 1, unk 2 (ByT5's byte ids and every HF T5
// SentencePiece model agree on these).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // The ids of `text`, no eos appended (the dataset appends it after truncating).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The text of `ids`, stopping at the first eos and skipping pad (HF's
  // decode(skip_special_tokens=True) for what generation produces).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  int32_t pad_id() const { return 0; }
  int32_t eos_id() const { return 1; }
  // One line for the banner: "bytes (ByT5 ids)" or "sentencepiece FILE (N pieces)".
  virtual std::string describe() const = 0;
};

// ByT5's byte ids: byte + 3 (pad 0, eos 1, unk 2); vocab 259.
std::unique_ptr<Tokenizer> make_byte_tokenizer();

// A SentencePiece model file (the spiece.model HF T5 folders ship, or spm_train's output) through
// Debian's libsentencepiece: encode = its ids for the text; decode = HF T5Tokenizer's
// decode(ids, skip_special_tokens=True) up to the first eos (data/sentencepiece.cpp says how).
// Error naming the file when it cannot be read, is not a model, or has not T5's pad 0 and eos 1.
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path);

// data.tokenizer: "" for bytes, else a SentencePiece model file.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

}  // namespace fsdp
