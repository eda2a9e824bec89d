#pragma once
// Datasets and the global-batch sampler. A dataset hands out samples by global index; the
// sampler decides which global indices make step s of epoch e, the same whatever the world size,
// and each rank takes its contiguous slice. The loss is then the mean over the global batch.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data/kinds.h"
#include "data/tokenizer.h"
#include "tensor/tensor.h"

namespace fsdp {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;         // number of samples
  virtual Shape input_shape() const = 0;    // one sample: {1, 28, 28} images, {L} tokens
  virtual DType input_dtype() const = 0;    // f32 images, i32 tokens
  virtual Shape target_shape() const = 0;   // {} a class label, {L} next tokens
  virtual int64_t num_classes() const = 0;  // 10 for Fashion-MNIST, 256 for bytes
  // Writes samples `indices` into inputs (len, *input_shape) and targets (len, *target_shape),
  // targets as i32. The tensors are allocated by the caller with exactly that first dimension.
  virtual void fill(std::span<const int64_t> indices, Tensor& inputs, Tensor& targets) const = 0;
  // How many target elements the loss averages over in these samples: all of them (a class
  // label, every next token), or those not ignored (seq2seq labels -100 on padding). The
  // trainer divides by this over the global batch, so the loss is the same at any world size.
  virtual int64_t loss_elements(std::span<const int64_t> indices) const {
    return static_cast<int64_t>(indices.size()) * shape_numel(target_shape());
  }
  // The tokenizer that made the ids (generation decodes with it); nullptr: images, or raw bytes.
  virtual const Tokenizer* tokenizer() const { return nullptr; }
  // How many of sample i's first input tokens are its prompt (supervised fine-tuning: bos and the
  // prompt, which generation continues); 0: none (generation.prompt_len cuts one).
  virtual int64_t prompt_tokens(int64_t /*i*/) const { return 0; }
  // What the run's banner says about the samples beyond their count ("" nothing): causal_lm's
  // tokens read and samples dropped.
  virtual std::string summary() const { return ""; }

 protected:
  // fill()'s argument checks (data/dataset.cpp): a bad index or a mis-allocated batch tensor is a
  // caller bug that would otherwise write out of bounds, so it fails loudly with one line.
  void check_fill(std::span<const int64_t> indices, const Tensor& inputs, const Tensor& targets) const;
};

// Fashion-MNIST from the gzipped IDX files in `dir` (Debian: /usr/share/datasets/fashion-mnist).
// train=true reads train-*, else t10k-*. Pixels -> (x/255 - 0.2860)/0.3530, f32 (1, 28, 28).
// Missing dir/files: Error naming the path and the Debian package dataset-fashion-mnist.
// Corrupt/truncated/mismatched files: Error naming the file and what is wrong.
std::unique_ptr<Dataset> load_fashion_mnist(const std::string& dir, bool train);
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// Byte-level text: `path` is a file or a folder (regular files in it, recursively, sorted by
// path, symlinks and files containing NUL bytes skipped, concatenated). Vocab 256.
// Sample i = bytes [i*L, i*L+L]: input the first L (i32), target the L bytes shifted by one.
// The samples are split: the first (1 - eval_fraction) of them train, the rest evaluate.
struct TextCorpusOptions {
  std::string path;
  int64_t seq_len = 256;
  double eval_fraction = 0.05;
};
std::unique_ptr<Dataset> load_text_corpus(const TextCorpusOptions& options, bool train);
inline constexpr const char* kTextCorpusDir = "/usr/share/games/fortunes";  // Debian: fortunes

// Sequence-to-sequence pairs (data/seq2seq.cpp) from a file: CSV (a name ending in .csv, any
// case: RFC 4180 with a header row naming the columns, data/csv.h) or JSON lines (any other name:
// one object per line); `source` and `target` name the columns or fields. Or, with path "",
// deterministic pairs: synthetic_samples to train, a quarter of that to evaluate.
// Rows whose source or target is empty (after the clean-up) are skipped, as pandas' dropna
// drops a CSV's empty cells. clean wikihow: the PyTorch FSDP tutorial's WikiHow preparation
// (data/clean.h). The evaluation rows: eval_path's, all of them, when given; else the last
// floor(rows * eval_fraction) rows of `path` (file order) evaluate and the others train.
// Tokens from the tokenizer (byte tokens with ByT5's ids by default: byte + 3, pad 0, eos 1):
// inputs (S) i32 source ids truncated to S-1, eos, pad; targets (L) i32 labels truncated to
// L-1, eos, then -100 on padding (HF's ignored label), or pad 0 with loss_on_padding (the
// tutorial's loss, which counts the padding too). A bad row: Error naming the file and line.
struct Seq2SeqOptions {
  std::string path;
  std::string eval_path;  // "": the tail of `path` evaluates (eval_fraction)
  std::string source = "text", target = "headline";
  int64_t source_len = 512, target_len = 150;
  double eval_fraction = 0.05;
  TextClean clean = TextClean::none;
  bool loss_on_padding = false;
  int64_t synthetic_samples = 1024;
  uint64_t seed = 1;
  std::shared_ptr<const Tokenizer> tokenizer;  // null: bytes (make_byte_tokenizer)
};
// What generation and ROUGE read besides the ids: sample i's texts (and tokenizer(), never null).
class Seq2SeqDataset : public Dataset {
 public:
  virtual const std::string& source_text(int64_t i) const = 0;
  virtual const std::string& target_text(int64_t i) const = 0;
};
std::unique_ptr<Seq2SeqDataset> load_seq2seq(const Seq2SeqOptions& options, bool train);

// Causal-LM text (data.kind causal_lm) for a decoder-only model, as transformers' examples
// prepare it. `path` is a file or a folder (data/files.h); a file whose name ends in .jsonl or
// .json (any case) holds JSON lines, any other plain text whose rows are its lines, each with
// its line break (datasets' text loader with keep_linebreaks, run_clm.py's default). Binary files
// (a NUL byte) in a folder are skipped. Tokens from the tokenizer (bytes, ids byte + 3, by default).
//   pretraining (sft false): row = a line, or the JSON field `field`; each row is tokenized as
//     [bos] + ids, the rows are concatenated and cut into blocks of seq_len, the remainder dropped
//     (run_clm.py's group_texts). Sample = block: inputs the block, targets the block shifted by
//     one with -100 last (HF's labels = input_ids, shifted inside the model: seq_len - 1 counted).
//   supervised fine-tuning (sft true, JSON lines {prompt, response}, field names `prompt` and
//     `response`): [bos] + prompt + response + [eos], the prompt and response encoded apart,
//     labels -100 on bos and the prompt. pack false: one example per sample, truncated to
//     seq_len, padded (eos) with -100 labels; pack true: the examples concatenated and cut into
//     blocks of seq_len as in pretraining. Targets are the labels shifted by one, -100 last.
//     A sample left with no counted label (a prompt that fills seq_len) is dropped: its loss
//     would divide by zero (dropped_samples() counts them).
// The split: eval_path's rows, all of them, evaluate when given; else the last
// floor(rows * eval_fraction) rows of `path` (file order). A bad row: Error naming the file and line.
struct CausalLmOptions {
  std::string path;
  std::string eval_path;
  double eval_fraction = 0.05;
  int64_t seq_len = 128;
  bool sft = false;
  bool pack = false;  // sft: concatenate examples into full blocks instead of padding each
  std::string field = "text", prompt = "prompt", response = "response";
  std::shared_ptr<const Tokenizer> tokenizer;  // null: bytes (make_byte_tokenizer(TokenStyle::llama))
};
class CausalLmDataset : public Dataset {
 public:
  virtual int64_t dropped_samples() const = 0;  // sft: samples with no counted label, dropped
  virtual int64_t tokens() const = 0;           // tokens of the rows read, bos/eos included
};
std::unique_ptr<CausalLmDataset> load_causal_lm(const CausalLmOptions& options, bool train);

// Deterministic synthetic data for tests: images (classes, C, H, W) or tokens (vocab, L).
// Sample i depends only on (seed, i). Images: class = i % classes, pixels N(0,1) plus a class
// dependent offset, so a model can learn them. Tokens: a fixed random walk over the vocab.
struct SyntheticOptions {
  std::string kind = "images";  // images | tokens
  int64_t samples = 1024;
  int64_t classes = 10;  // images
  Shape image_shape = {1, 28, 28};
  int64_t vocab = 256;  // tokens
  int64_t seq_len = 64;
  uint64_t seed = 1;
};
std::unique_ptr<Dataset> make_synthetic(const SyntheticOptions& options, bool train);

struct SamplerOptions {
  int64_t dataset_size = 0;
  int64_t global_batch = 0;  // per-rank batch * data-parallel ranks
  bool shuffle = false;
  bool drop_last = true;  // a short last batch is dropped (training); evaluation keeps it
  uint64_t seed = 1;
};

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& options);  // Error on global_batch <= 0, etc.
  int64_t steps_per_epoch() const;
  // Global indices of step `step` in epoch `epoch`: with shuffle off [s*B, min((s+1)*B, N));
  // with shuffle on the same positions of a permutation of [0, N) seeded by (seed, epoch).
  std::vector<int64_t> global_batch(int64_t epoch, int64_t step) const;
  // Rank r's contiguous slice of a global batch of n samples over `ranks` ranks: the first
  // n % ranks ranks get one more. {offset, count} into the global batch.
  static std::pair<int64_t, int64_t> rank_slice(int64_t n, int rank, int ranks);

 private:
  SamplerOptions options_;
  // The last epoch's permutation: rebuilding it costs ~1 ms per step at N = 60000. Makes
  // global_batch unsafe to call from two threads at once on one Sampler.
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> cached_order_;
};

}  // namespace fsdp
