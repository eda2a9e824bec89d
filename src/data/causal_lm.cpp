// Causal-LM data (data.kind causal_lm): pretraining text packed as transformers' run_clm.py packs
// it, and prompt/response pairs for supervised fine-tuning (data/data.h says the layout). Rows are
// read and tokenized once, at load; every rank holds its part's ids (4 bytes a token), as each
// rank holds a text corpus's bytes.
#include <strings.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "data/data.h"
#include "data/files.h"
#include "data/jsonl.h"
#include "tensor/error.h"

namespace fsdp {

namespace {

constexpr int32_t kIgnore = -100;

// One row: pretraining text (prompt empty, response the text) or a prompt/response pair.
struct Row {
  std::string prompt, text;
};

bool is_jsonl(const std::string& file) {
  auto ends = [&](const char* suffix) {
    const size_t n = std::char_traits<char>::length(suffix);
    return file.size() >= n && strcasecmp(file.c_str() + file.size() - n, suffix) == 0;
  };
  return ends(".jsonl") || ends(".json");
}

void read_jsonl(const std::string& text, const std::string& file, const CausalLmOptions& o, std::vector<Row>& rows) {
  read_json_lines(text, "causal_lm data", file, [&](const JsonRow& row) {
    if (o.sft)
      rows.push_back({row.string(o.prompt), row.string(o.response)});
    else
      rows.push_back({"", row.string(o.field)});
  });
}

// Plain text: a row per line, its "\n" kept (the last line's only if the file ends with one).
void read_lines(const std::string& text, std::vector<Row>& rows) {
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    end = end == std::string::npos ? text.size() : end + 1;
    rows.push_back({"", text.substr(start, end - start)});
    start = end;
  }
}

// Every row of `path` (a file or a folder), in file order.
std::vector<Row> read_rows(const std::string& path, const CausalLmOptions& o) {
  std::vector<Row> rows;
  for (const auto& entry : corpus_files(path, "causal_lm data")) {
    const std::string file = entry.string();
    std::ifstream in(entry, std::ios::binary);
    if (!in.is_open()) throw Error("causal_lm data " + file + ": cannot open");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) throw Error("causal_lm data " + file + ": cannot read");
    if (text.find('\0') != std::string::npos) {
      if (file == path) throw Error("causal_lm data " + file + ": a binary file (it holds a NUL byte)");
      continue;  // a folder's binary files (indexes next to the text) are not text
    }
    if (is_jsonl(file))
      read_jsonl(text, file, o, rows);
    else if (o.sft)
      throw Error("causal_lm data " + file + ": data.sft needs JSON lines ({\"" + o.prompt + "\": ..., \"" +
                  o.response + "\": ...} per line, in a file named *.jsonl or *.json)");
    else
      read_lines(text, rows);
  }
  if (rows.empty()) throw Error("causal_lm data " + path + ": no rows (every file is empty, blank or binary)");
  return rows;
}

std::string fraction_str(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

// A sample: `length` tokens of the ids from `offset`; its inputs are those tokens (then padding),
// its targets the next token's label where that token is in the sample and counted.
struct Span {
  int64_t offset = 0, length = 0, prompt = 0, counted = 0;
};

class CausalLm final : public CausalLmDataset {
 public:
  CausalLm(const std::vector<Row>& rows, const CausalLmOptions& o, std::shared_ptr<const Tokenizer> tok,
           const std::string& where)
      : tok_(std::move(tok)), seq_len_(o.seq_len) {
    const Tokenizer& t = *tok_;
    const int32_t bos = t.bos_id();
    std::vector<int64_t> starts;  // each row's first token, then the end
    for (const Row& row : rows) {
      starts.push_back(static_cast<int64_t>(ids_.size()));
      if (bos >= 0) push(bos, !o.sft);  // a label in pretraining (predicted from the row before), not in a prompt
      if (o.sft) {
        for (int32_t id : t.encode(row.prompt)) push(id, false);
        for (int32_t id : t.encode(row.text)) push(id, true);
        push(t.eos_id(), true);
      } else {
        for (int32_t id : t.encode(row.text)) push(id, true);
      }
    }
    starts.push_back(static_cast<int64_t>(ids_.size()));
    const int64_t L = seq_len_, total = static_cast<int64_t>(ids_.size());
    if (o.sft && !o.pack) {
      for (size_t r = 0; r + 1 < starts.size(); ++r) {
        Span s{starts[r], std::min(L, starts[r + 1] - starts[r])};
        while (s.prompt < s.length && !counted_[static_cast<size_t>(s.offset + s.prompt)]) ++s.prompt;
        add(s);
      }
    } else {
      if (total < L)
        throw Error("causal_lm data " + where + ": " + std::to_string(total) + " tokens, fewer than seq_len " +
                    std::to_string(L) + ": no block of training data");
      for (int64_t b = 0; b + L <= total; b += L) add(Span{b, L});
    }
    if (samples_.empty())
      throw Error("causal_lm data " + where + ": every example's prompt fills seq_len " + std::to_string(L) +
                  ": no label to train on");
  }

  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  Shape input_shape() const override { return {seq_len_}; }
  DType input_dtype() const override { return DType::i32; }
  Shape target_shape() const override { return {seq_len_}; }
  int64_t num_classes() const override { return tok_->vocab_size(); }
  const Tokenizer* tokenizer() const override { return tok_.get(); }
  int64_t prompt_tokens(int64_t i) const override { return samples_.at(static_cast<size_t>(i)).prompt; }
  int64_t dropped_samples() const override { return dropped_; }
  int64_t tokens() const override { return static_cast<int64_t>(ids_.size()); }
  std::string summary() const override {
    std::string text = std::to_string(tokens()) + " tokens";
    if (dropped_ > 0)
      text += ", " + std::to_string(dropped_) + " samples dropped (no label: a prompt as long as seq_len)";
    return text;
  }

  void fill(std::span<const int64_t> indices, Tensor& inputs, Tensor& targets) const override {
    check_fill(indices, inputs, targets);
    const int32_t pad = tok_->pad_id();
    for (size_t k = 0; k < indices.size(); ++k) {
      const Span& s = samples_[static_cast<size_t>(indices[k])];
      int32_t* in = inputs.i32() + static_cast<int64_t>(k) * seq_len_;
      int32_t* target = targets.i32() + static_cast<int64_t>(k) * seq_len_;
      for (int64_t j = 0; j < seq_len_; ++j) {
        in[j] = j < s.length ? ids_[static_cast<size_t>(s.offset + j)] : pad;
        const bool next = j + 1 < s.length && counted_[static_cast<size_t>(s.offset + j + 1)];
        target[j] = next ? ids_[static_cast<size_t>(s.offset + j + 1)] : kIgnore;
      }
    }
  }

  int64_t loss_elements(std::span<const int64_t> indices) const override {
    int64_t n = 0;
    for (const int64_t i : indices) n += samples_.at(static_cast<size_t>(i)).counted;
    return n;
  }

 private:
  void push(int32_t id, bool counted) {
    ids_.push_back(id);
    counted_.push_back(counted ? 1 : 0);
  }
  void add(Span s) {
    for (int64_t j = 1; j < s.length; ++j) s.counted += counted_[static_cast<size_t>(s.offset + j)];
    if (s.counted == 0) {
      ++dropped_;
      return;
    }
    samples_.push_back(s);
  }

  std::shared_ptr<const Tokenizer> tok_;
  int64_t seq_len_;
  std::vector<int32_t> ids_;      // (tokens) every row's ids, concatenated
  std::vector<uint8_t> counted_;  // (tokens) 1 where the token is a label the loss counts
  std::vector<Span> samples_;
  int64_t dropped_ = 0;
};

}  // namespace

std::unique_ptr<CausalLmDataset> load_causal_lm(const CausalLmOptions& o, bool train) {
  const std::string& path = o.path;
  if (path.empty()) throw Error("causal_lm data: data.path is empty (a text or JSON-lines file, or a folder)");
  if (o.seq_len < 2)
    throw Error("causal_lm data " + path + ": seq_len must be at least 2, got " + std::to_string(o.seq_len));
  if (o.eval_path.empty() && !(o.eval_fraction > 0.0 && o.eval_fraction < 1.0))
    throw Error("causal_lm data " + path + ": eval_fraction must be in (0, 1), got " + fraction_str(o.eval_fraction));
  std::shared_ptr<const Tokenizer> tok =
      o.tokenizer ? o.tokenizer : std::shared_ptr<const Tokenizer>(make_byte_tokenizer(TokenStyle::llama));

  std::vector<Row> rows;
  std::string where = path;
  if (!o.eval_path.empty()) {
    if (!train) where = o.eval_path;
    rows = read_rows(train ? path : o.eval_path, o);
  } else {
    rows = read_rows(path, o);
    const int64_t n = static_cast<int64_t>(rows.size());
    const int64_t eval_rows = static_cast<int64_t>(std::floor(static_cast<double>(n) * o.eval_fraction));
    if (eval_rows < 1 || eval_rows >= n)
      throw Error("causal_lm data " + path + ": " + std::to_string(n) + " rows split with eval_fraction " +
                  fraction_str(o.eval_fraction) + " leave " + std::to_string(n - eval_rows) + " train and " +
                  std::to_string(eval_rows) + " eval rows; need at least 1 of each");
    if (train)
      rows.resize(static_cast<size_t>(n - eval_rows));
    else
      rows.erase(rows.begin(), rows.begin() + (n - eval_rows));
    where += train ? " (train rows)" : " (eval rows)";
  }
  return std::make_unique<CausalLm>(rows, o, std::move(tok), where);
}

}  // namespace fsdp
