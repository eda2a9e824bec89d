// The byte tokenizer. SentencePiece is in data/sentencepiece.cpp.
#include "data/tokenizer.h"

namespace fsdp {

namespace {

constexpr int32_t kByteOffset = 3;

class ByteTokenizer final : public Tokenizer {
 public:
  explicit ByteTokenizer(TokenStyle style) : Tokenizer(special_ids(style)), style_(style) {}
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
  std::string describe() const override {
    return style_ == TokenStyle::t5 ? "bytes (ByT5 ids: byte + 3, pad 0, eos 1)"
                                    : "bytes (ids byte + 3, unk 0, bos 1, eos 2)";
  }

 private:
  TokenStyle style_;
};

}  // namespace

SpecialIds special_ids(TokenStyle style) {
  return style == TokenStyle::t5 ? SpecialIds{0, 1, -1} : SpecialIds{2, 2, 1};
}

std::unique_ptr<Tokenizer> make_byte_tokenizer(TokenStyle style) { return std::make_unique<ByteTokenizer>(style); }

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, TokenStyle style, int32_t bos, int32_t eos) {
  return path.empty() ? make_byte_tokenizer(style) : load_sentencepiece(path, style, bos, eos);
}

}  // namespace fsdp
