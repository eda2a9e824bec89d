// Sequence-to-sequence pairs from a CSV file (a header row names the columns; data/csv.h) or a
// JSON-lines file (one object per line), two of whose columns/fields are the source and the
// target, as the tokenizer's ids (bytes with ByT5's ids by default: byte + 3, pad 0, eos 1).
// Sample i: inputs (S) = source ids truncated to S-1, eos, pad; targets (L) = target ids
// truncated to L-1, eos, then -100 (HF's ignored label; pad with loss_on_padding) up to L.
// Texts are kept and encoded when a batch asks for them (a corpus of long texts encoded ahead
// would cost every rank hundreds of MB). The model derives the padding
// mask and the decoder's input (labels shifted right) from these.
#include <strings.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "data/clean.h"
#include "data/csv.h"
#include "data/data.h"
#include "data/jsonl.h"
#include "tensor/error.h"

namespace fsdp {

namespace {

constexpr int32_t kIgnore = -100;

struct Pair {
  std::string source, target;
};

Error bad_row(const std::string& path, int64_t line, const std::string& what) {
  return fsdp::bad_row("seq2seq data", path, line, what);
}

// A file's rows as (source, target), or an Error naming the file, the line and the problem.
std::vector<Pair> read_jsonl(std::istream& in, const std::string& path, const Seq2SeqOptions& o) {
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error("seq2seq data " + path + ": cannot read");
  std::vector<Pair> pairs;
  read_json_lines(text, "seq2seq data", path, [&](const JsonRow& row) {
    pairs.push_back({row.string(o.source), row.string(o.target)});
  });
  return pairs;
}

std::vector<Pair> read_csv(std::istream& in, const std::string& path, const Seq2SeqOptions& o) {
  CsvReader reader(in, "seq2seq data " + path);
  std::vector<std::string> header, fields;
  if (!reader.next(header)) return {};
  auto column = [&](const std::string& name) {
    size_t found = header.size();
    for (size_t k = 0; k < header.size(); ++k) {
      if (header[k] != name) continue;
      if (found < header.size()) throw bad_row(path, reader.line(), "column \"" + name + "\" twice in the header");
      found = k;
    }
    if (found == header.size()) {
      std::string names;
      for (const std::string& h : header) names += (names.empty() ? "" : ", ") + h;
      throw bad_row(path, reader.line(), "no column \"" + name + "\" in the header (columns: " + names + ")");
    }
    return found;
  };
  const size_t source = column(o.source), target = column(o.target);
  std::vector<Pair> pairs;
  while (reader.next(fields)) {
    if (fields.size() != header.size())
      throw bad_row(path, reader.line(),
                    std::to_string(fields.size()) + (fields.size() == 1 ? " field" : " fields") + ", the header has " +
                        std::to_string(header.size()));
    pairs.push_back({std::move(fields[source]), std::move(fields[target])});
  }
  return pairs;
}

bool ends_with_csv(const std::string& path) {
  return path.size() >= 4 && strcasecmp(path.c_str() + path.size() - 4, ".csv") == 0;
}

// The file's usable pairs: cleaned, those with an empty source or target left out.
std::vector<Pair> read_pairs(const std::string& path, const Seq2SeqOptions& o) {
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) throw Error("seq2seq data " + path + ": cannot open");
  std::vector<Pair> rows = ends_with_csv(path) ? read_csv(in, path, o) : read_jsonl(in, path, o);
  const size_t read = rows.size();
  std::vector<Pair> pairs;
  pairs.reserve(rows.size());
  for (Pair& p : rows) {
    if (o.clean == TextClean::wikihow && !clean_wikihow(p.source, p.target)) continue;
    if (p.source.empty() || p.target.empty()) continue;
    pairs.push_back(std::move(p));
  }
  if (pairs.empty())
    throw Error("seq2seq data " + path + ": no rows" +
                (read == 0 ? std::string()
                           : " with a source and a target (" + std::to_string(read) + " read, all empty" +
                                 (o.clean == TextClean::wikihow ? " or dropped by data.clean wikihow)" : ")")));
  return pairs;
}

// ids (n) = the text's ids truncated to n-1, eos, then `fill`.
void encode(const Tokenizer& tok, const std::string& text, int32_t* ids, int64_t n, int32_t fill) {
  const std::vector<int32_t> t = tok.encode(text);
  const int64_t used = std::min<int64_t>(static_cast<int64_t>(t.size()), n - 1);
  std::copy_n(t.begin(), used, ids);
  ids[used] = tok.eos_id();
  std::fill(ids + used + 1, ids + n, fill);
}

class Seq2Seq final : public Seq2SeqDataset {
 public:
  Seq2Seq(std::vector<Pair> pairs, const Seq2SeqOptions& o, std::shared_ptr<const Tokenizer> tok)
      : pairs_(std::move(pairs)),
        S_(o.source_len),
        L_(o.target_len),
        label_fill_(o.loss_on_padding ? tok->pad_id() : kIgnore),
        tok_(std::move(tok)) {}
  int64_t size() const override { return static_cast<int64_t>(pairs_.size()); }
  Shape input_shape() const override { return {S_}; }
  DType input_dtype() const override { return DType::i32; }
  Shape target_shape() const override { return {L_}; }
  int64_t num_classes() const override { return tok_->vocab_size(); }
  void fill(std::span<const int64_t> indices, Tensor& inputs, Tensor& targets) const override {
    check_fill(indices, inputs, targets);
    for (size_t n = 0; n < indices.size(); ++n) {
      const Pair& p = pairs_[static_cast<size_t>(indices[n])];
      encode(*tok_, p.source, inputs.i32() + static_cast<int64_t>(n) * S_, S_, tok_->pad_id());
      encode(*tok_, p.target, targets.i32() + static_cast<int64_t>(n) * L_, L_, label_fill_);
    }
  }
  // The labels that are not -100: the target's ids that fit, and its eos; all L of them when the
  // padding is labelled pad (loss_on_padding).
  int64_t loss_elements(std::span<const int64_t> indices) const override {
    if (label_fill_ != kIgnore) return static_cast<int64_t>(indices.size()) * L_;
    int64_t count = 0;
    for (int64_t i : indices) {
      const auto n = static_cast<int64_t>(tok_->encode(pairs_[static_cast<size_t>(i)].target).size());
      count += std::min<int64_t>(n, L_ - 1) + 1;
    }
    return count;
  }
  const std::string& source_text(int64_t i) const override { return pairs_.at(static_cast<size_t>(i)).source; }
  const std::string& target_text(int64_t i) const override { return pairs_.at(static_cast<size_t>(i)).target; }
  const Tokenizer* tokenizer() const override { return tok_.get(); }

 private:
  std::vector<Pair> pairs_;
  int64_t S_, L_;
  int32_t label_fill_;  // the labels after eos: -100 (ignored) or pad
  std::shared_ptr<const Tokenizer> tok_;
};

// Deterministic pairs for tests and plans: lowercase letters, lengths from 1 to twice the
// token lengths (so some are truncated and some padded), row r a function of (seed, r).
std::vector<Pair> synthetic_pairs(const Seq2SeqOptions& o) {
  std::vector<Pair> pairs(static_cast<size_t>(o.synthetic_samples + std::max<int64_t>(1, o.synthetic_samples / 4)));
  uint64_t state = o.seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&] {  // splitmix64
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  auto text = [&](int64_t max_len) {
    std::string t(1 + next() % static_cast<uint64_t>(2 * max_len), ' ');
    for (char& ch : t) ch = static_cast<char>('a' + next() % 26);
    return t;
  };
  for (Pair& p : pairs) {
    p.source = text(o.source_len);
    p.target = text(o.target_len);
  }
  return pairs;
}

}  // namespace

std::unique_ptr<Seq2SeqDataset> load_seq2seq(const Seq2SeqOptions& o, bool train) {
  std::shared_ptr<const Tokenizer> tok =
      o.tokenizer ? o.tokenizer : std::shared_ptr<const Tokenizer>(make_byte_tokenizer());
  if (!o.path.empty() && !o.eval_path.empty())  // a validation file of its own: no split
    return std::make_unique<Seq2Seq>(read_pairs(train ? o.path : o.eval_path, o), o, std::move(tok));
  std::vector<Pair> pairs = o.path.empty() ? synthetic_pairs(o) : read_pairs(o.path, o);
  // The last floor(rows * eval_fraction) rows evaluate, the others train (file order); synthetic
  // data: synthetic_samples train, a quarter of that evaluate.
  const auto rows = static_cast<int64_t>(pairs.size());
  const auto held = o.path.empty() ? rows - o.synthetic_samples
                                   : static_cast<int64_t>(std::floor(static_cast<double>(rows) * o.eval_fraction));
  if (rows - held < 1 || (o.eval_fraction > 0 && held < 1))
    throw Error("seq2seq data " + o.path + ": " + std::to_string(rows) + " rows cannot be split by eval_fraction " +
                std::to_string(o.eval_fraction) + " into non-empty train and eval parts");
  const auto first = pairs.begin() + (train ? 0 : rows - held),
             last = train ? pairs.begin() + (rows - held) : pairs.end();
  std::vector<Pair> part(std::make_move_iterator(first), std::make_move_iterator(last));
  return std::make_unique<Seq2Seq>(std::move(part), o, std::move(tok));
}

}  // namespace fsdp
