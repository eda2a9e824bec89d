// Synthetic datasets for tests and benchmarks without files. Samples are generated in fill() from
// counters (seed, split stream, index, element), so any subset in any batching gives the same
// values and nothing is held in memory whatever `samples` is.
#include <algorithm>
#include <climits>
#include <cmath>
#include <string>
#include <vector>

#include "data/data.h"
#include "tensor/error.h"
#include "tensor/rng.h"

namespace fsdp {

namespace {

constexpr float kNoiseStd = 0.5f;  // pixel noise, small next to the +1 class band
constexpr float kBandOffset = 1.0f;
constexpr uint32_t kRandomTokenThreshold = 429496730u;  // ~10% of 2^32: tokens that break the rule

[[noreturn]] void fail(const std::string& problem) { throw Error("synthetic data: " + problem); }

CounterRng split_rng(uint64_t seed, bool train) {
  return CounterRng(seed, hash_name(train ? "synthetic/train" : "synthetic/eval"));
}

// Images: class i % classes; pixels N(0, 1) * 0.5, plus 1.0 on the class's band of the flattened
// image (class c owns [c*P/classes, (c+1)*P/classes)), which a linear model already separates.
class SyntheticImages final : public Dataset {
 public:
  SyntheticImages(const SyntheticOptions& o, bool train)
      : rng_(split_rng(o.seed, train)),
        samples_(o.samples),
        classes_(o.classes),
        shape_(o.image_shape),
        pixel_count_(shape_numel(o.image_shape)) {}
  int64_t size() const override { return samples_; }
  Shape input_shape() const override { return shape_; }
  DType input_dtype() const override { return DType::f32; }
  Shape target_shape() const override { return {}; }
  int64_t num_classes() const override { return classes_; }

  void fill(std::span<const int64_t> indices, Tensor& inputs, Tensor& targets) const override {
    check_fill(indices, inputs, targets);
    // One Philox block gives two normals (Box-Muller cos and sin): pixels 2m and 2m+1.
    const int64_t blocks_per_sample = (pixel_count_ + 1) / 2;
    for (size_t k = 0; k < indices.size(); ++k) {
      const int64_t index = indices[k];
      float* dst = inputs.f32() + static_cast<int64_t>(k) * pixel_count_;
      for (int64_t m = 0; m < blocks_per_sample; ++m) {
        auto b = rng_.block(static_cast<uint64_t>(index * blocks_per_sample + m));
        double radius = std::sqrt(-2.0 * std::log((b[0] + 1.0) * (1.0 / 4294967296.0)));
        double angle = 6.283185307179586 * (b[1] * (1.0 / 4294967296.0));
        dst[2 * m] = kNoiseStd * static_cast<float>(radius * std::cos(angle));
        if (2 * m + 1 < pixel_count_) dst[2 * m + 1] = kNoiseStd * static_cast<float>(radius * std::sin(angle));
      }
      const int64_t label = index % classes_;
      for (int64_t j = label * pixel_count_ / classes_; j < (label + 1) * pixel_count_ / classes_; ++j)
        dst[j] += kBandOffset;
      targets.i32()[k] = static_cast<int32_t>(label);
    }
  }

 private:
  CounterRng rng_;
  int64_t samples_, classes_;
  Shape shape_;
  int64_t pixel_count_;
};

// Tokens: a random first token, then next = (prev * 7 + 3) % vocab, except that ~10% of tokens are
// uniformly random. An LM learns the rule; the random tokens keep the loss above zero.
class SyntheticTokens final : public Dataset {
 public:
  SyntheticTokens(const SyntheticOptions& o, bool train)
      : rng_(split_rng(o.seed, train)), samples_(o.samples), vocab_(o.vocab), seq_len_(o.seq_len) {}
  int64_t size() const override { return samples_; }
  Shape input_shape() const override { return {seq_len_}; }
  DType input_dtype() const override { return DType::i32; }
  Shape target_shape() const override { return {seq_len_}; }
  int64_t num_classes() const override { return vocab_; }

  void fill(std::span<const int64_t> indices, Tensor& inputs, Tensor& targets) const override {
    check_fill(indices, inputs, targets);
    std::vector<int32_t> sequence(static_cast<size_t>(seq_len_ + 1));
    for (size_t k = 0; k < indices.size(); ++k) {
      const uint64_t first_counter = static_cast<uint64_t>(indices[k] * (seq_len_ + 1));
      int64_t token = 0;
      for (int64_t j = 0; j <= seq_len_; ++j) {
        auto b = rng_.block(first_counter + j);
        bool random = j == 0 || b[0] < kRandomTokenThreshold;
        token = random ? static_cast<int64_t>(b[1] % static_cast<uint64_t>(vocab_)) : (token * 7 + 3) % vocab_;
        sequence[j] = static_cast<int32_t>(token);
      }
      int64_t row = static_cast<int64_t>(k) * seq_len_;
      std::copy(sequence.begin(), sequence.end() - 1, inputs.i32() + row);
      std::copy(sequence.begin() + 1, sequence.end(), targets.i32() + row);
    }
  }

 private:
  CounterRng rng_;
  int64_t samples_, vocab_, seq_len_;
};

}  // namespace

std::unique_ptr<Dataset> make_synthetic(const SyntheticOptions& options, bool train) {
  if (options.samples <= 0) fail("samples must be positive, got " + std::to_string(options.samples));
  if (options.kind == "images") {
    if (options.image_shape.empty()) fail("image_shape must have at least one dimension");
    for (int64_t d : options.image_shape)
      if (d <= 0) fail("image_shape " + shape_str(options.image_shape) + " has a dimension <= 0");
    int64_t pixel_count = shape_numel(options.image_shape);
    if (options.classes < 1 || options.classes > pixel_count)
      fail("classes must be in [1, " + std::to_string(pixel_count) + "] (one band of pixels each), got " +
           std::to_string(options.classes));
    return std::make_unique<SyntheticImages>(options, train);
  }
  if (options.kind == "tokens") {
    if (options.vocab < 2 || options.vocab > INT32_MAX)
      fail("vocab must be in [2, 2^31), got " + std::to_string(options.vocab));
    if (options.seq_len <= 0) fail("seq_len must be positive, got " + std::to_string(options.seq_len));
    return std::make_unique<SyntheticTokens>(options, train);
  }
  fail("kind must be 'images' or 'tokens', got '" + options.kind + "'");
}

}  // namespace fsdp
