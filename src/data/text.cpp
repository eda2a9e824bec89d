// Byte-level text corpus: every regular file under a path (data/files.h), concatenated in path
// order. Files with a NUL byte are skipped because they are binary (the strfile .dat indexes next
// to the text).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "data/data.h"
#include "data/files.h"
#include "tensor/error.h"

namespace fsdp {

namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw Error("text corpus " + path + ": " + problem);
}

std::string fraction_str(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

std::vector<uint8_t> read_corpus(const std::string& path) {
  std::vector<uint8_t> corpus;
  for (const fs::path& file : corpus_files(path, "text corpus")) {
    std::ifstream in(file, std::ios::binary);
    if (!in.is_open()) fail(path, "cannot open " + file.string());
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) fail(path, "cannot read " + file.string());
    if (std::find(bytes.begin(), bytes.end(), uint8_t{0}) != bytes.end()) continue;
    corpus.insert(corpus.end(), bytes.begin(), bytes.end());
  }
  return corpus;
}

class TextCorpus final : public Dataset {
 public:
  TextCorpus(std::vector<uint8_t> bytes, int64_t seq_len, int64_t first_sample, int64_t count)
      : bytes_(std::move(bytes)), seq_len_(seq_len), first_sample_(first_sample), count_(count) {}
  int64_t size() const override { return count_; }
  Shape input_shape() const override { return {seq_len_}; }
  DType input_dtype() const override { return DType::i32; }
  Shape target_shape() const override { return {seq_len_}; }
  int64_t num_classes() const override { return 256; }

  void fill(std::span<const int64_t> indices, Tensor& inputs, Tensor& targets) const override {
    check_fill(indices, inputs, targets);
    int32_t* in = inputs.i32();
    int32_t* target = targets.i32();
    for (size_t k = 0; k < indices.size(); ++k) {
      const uint8_t* src = bytes_.data() + (first_sample_ + indices[k]) * seq_len_;
      int64_t row = static_cast<int64_t>(k) * seq_len_;
      for (int64_t j = 0; j < seq_len_; ++j) {
        in[row + j] = src[j];
        target[row + j] = src[j + 1];
      }
    }
  }

 private:
  std::vector<uint8_t> bytes_;
  int64_t seq_len_, first_sample_, count_;
};

}  // namespace

std::unique_ptr<Dataset> load_text_corpus(const TextCorpusOptions& options, bool train) {
  const std::string& path = options.path;
  const int64_t seq_len = options.seq_len;
  const double eval_fraction = options.eval_fraction;
  if (seq_len <= 0) fail(path, "seq_len must be positive, got " + std::to_string(seq_len));
  if (!(eval_fraction > 0.0 && eval_fraction < 1.0))
    fail(path, "eval_fraction must be in (0, 1), got " + fraction_str(eval_fraction));

  std::vector<uint8_t> bytes = read_corpus(path);
  const int64_t size_bytes = static_cast<int64_t>(bytes.size());
  if (size_bytes == 0) fail(path, "no text (every file is empty, binary or a symlink)");
  if (size_bytes <= seq_len)  // not size < seq_len + 1: seq_len may be INT64_MAX
    fail(path, std::to_string(size_bytes) + " bytes is shorter than seq_len+1 = " +
                   std::to_string(static_cast<uint64_t>(seq_len) + 1) + " bytes");

  // Each sample needs one byte past its last input for the final target, hence bytes - 1.
  const int64_t samples = (size_bytes - 1) / seq_len;
  const int64_t train_samples = static_cast<int64_t>(std::floor(static_cast<double>(samples) * (1.0 - eval_fraction)));
  const int64_t eval_samples = samples - train_samples;
  if (train_samples < 1 || eval_samples < 1)
    fail(path, std::to_string(samples) + " samples of " + std::to_string(seq_len) + " bytes split with eval_fraction " +
                   fraction_str(eval_fraction) + " leave " + std::to_string(train_samples) + " train and " +
                   std::to_string(eval_samples) + " eval samples; need at least 1 of each");
  if (train) return std::make_unique<TextCorpus>(std::move(bytes), seq_len, 0, train_samples);
  return std::make_unique<TextCorpus>(std::move(bytes), seq_len, train_samples, eval_samples);
}

}  // namespace fsdp
