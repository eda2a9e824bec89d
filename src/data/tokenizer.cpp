// The byte tokenizer (ByT5's ids). SentencePiece is in data/sentencepiece.cpp.
#include "data/tokenizer.h"

namespace fsdp {

namespace {

constexpr int32_t kByteOffset = 3;

class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<int32_t>(static_cast<uint8_t>(text[i])) + kByteOffset;
    return ids;
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string text;
    for (int32_t id : ids) {
      if (id == eos_id()) break;
      if (id >= kByteOffset && id < kByteOffset + 256) text.push_back(static_cast<char>(id - kByteOffset));
    }
    return text;
  }
  int64_t vocab_size() const override { return 256 + kByteOffset; }
  std::string describe() const override { return "bytes (ByT5 ids: byte + 3, pad 0, eos 1)"; }
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  return path.empty() ? make_byte_tokenizer() : load_sentencepiece(path);
}

}  // namespace fsdp
