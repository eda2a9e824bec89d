// SentencePiece tokens (the spiece.model of HF T5 folders, Llama's tokenizer.model, or
// spm_train's output) through Debian's libsentencepiece, with the family's ids checked at load:
// T5's pad 0, eos 1 (unk 2 by convention); Llama's bos and eos as its config.json says (unk 0,
// bos 1, eos 2 in every Llama model). Encoding is the library's (Python's sentencepiece gives the
// same ids, tests/reference checks it). Decoding follows HF's decode(ids,
// skip_special_tokens=True), transformers 4.36, so that generated text reads as it would there:
//   1. stop at the first eos (generation pads after it; HF would skip eos and go on);
//   2. drop pad, eos, unk and every other control id, and ids outside the model (HF's sentinels
//      <extra_id_N> sit there, special tokens too; a model's spare logits have no piece);
//   3. the library's decode of the rest; T5Tokenizer then strips leading and trailing whitespace
//      and applies clean_up_tokenization (" ." -> "." and the like, on by default there);
//      LlamaTokenizer does neither (its clean_up_tokenization_spaces is off).
#include <sentencepiece_processor.h>

#include <fstream>
#include <iterator>
#include <utility>

#include "data/clean.h"
#include "data/tokenizer.h"
#include "tensor/error.h"

namespace fsdp {

namespace {

// HF's PreTrainedTokenizerBase.clean_up_tokenization, in its order: English tokenization
// artifacts (a space before punctuation and before the short forms).
std::string clean_up_tokenization(std::string text) {
  static constexpr std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) text = replace_all(text, from, to);
  return text;
}

std::string id_text(int id) { return id < 0 ? "none" : std::to_string(id); }

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& path, TokenStyle style, int32_t bos, int32_t eos)
      : Tokenizer(style == TokenStyle::t5 ? special_ids(style) : SpecialIds{eos, eos, bos}),
        path_(path),
        style_(style) {
    // Read here rather than by the library's Load(path): a missing file gets one plain line, and
    // the bytes are what the library checks either way.
    std::ifstream in(path, std::ios::binary);
    if (!in.is_open()) throw Error("sentencepiece model " + path + ": cannot open");
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) throw Error("sentencepiece model " + path + ": cannot read");
    if (bytes.empty()) throw Error("sentencepiece model " + path + ": empty file");
    const sentencepiece::util::Status status = processor_.LoadFromSerializedProto(bytes);
    if (!status.ok())
      throw Error("sentencepiece model " + path + ": not a SentencePiece model (" + status.ToString() + ")");
    if (style == TokenStyle::llama && (processor_.bos_id() != bos || processor_.eos_id() != eos))
      throw Error("sentencepiece model " + path + ": bos id " + id_text(processor_.bos_id()) + ", eos id " +
                  id_text(processor_.eos_id()) + "; the model's config says bos_token_id " + std::to_string(bos) +
                  " and eos_token_id " + std::to_string(eos));
    if (style == TokenStyle::t5 && (processor_.pad_id() != pad_id() || processor_.eos_id() != eos_id()))
      throw Error("sentencepiece model " + path + ": pad id " + id_text(processor_.pad_id()) + ", eos id " +
                  id_text(processor_.eos_id()) + ", unk id " + id_text(processor_.unk_id()) + ", bos id " +
                  id_text(processor_.bos_id()) +
                  "; T5 needs pad 0 and eos 1 (spm_train --pad_id=0 --eos_id=1 --unk_id=2 --bos_id=-1)");
    pieces_ = processor_.GetPieceSize();
  }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    const sentencepiece::util::Status status = processor_.Encode(text, &ids);
    if (!status.ok()) throw Error("sentencepiece model " + path_ + ": cannot encode (" + status.ToString() + ")");
    return {ids.begin(), ids.end()};
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::vector<int> kept;
    for (int32_t id : ids) {
      if (id == eos_id()) break;
      if (id < 0 || id >= pieces_ || processor_.IsControl(id) || processor_.IsUnknown(id)) continue;
      kept.push_back(id);
    }
    std::string text;
    const sentencepiece::util::Status status = processor_.Decode(kept, &text);
    if (!status.ok()) throw Error("sentencepiece model " + path_ + ": cannot decode (" + status.ToString() + ")");
    return style_ == TokenStyle::t5 ? clean_up_tokenization(strip_space(text)) : text;
  }

  int64_t vocab_size() const override { return pieces_; }
  std::string describe() const override {
    return "sentencepiece " + path_ + " (" + std::to_string(pieces_) + " pieces, " +
           (style_ == TokenStyle::t5 ? "pad 0, eos 1)"
                                     : "bos " + std::to_string(bos_id()) + ", eos " + std::to_string(eos_id()) + ")");
  }

 private:
  std::string path_;
  TokenStyle style_;
  sentencepiece::SentencePieceProcessor processor_;  // owns the model; freed with this object
  int pieces_ = 0;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path, TokenStyle style, int32_t bos, int32_t eos) {
  return std::make_unique<SentencePieceTokenizer>(path, style, bos, eos);
}

}  // namespace fsdp
