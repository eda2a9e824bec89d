#pragma once
// The promises of a loaded seq2seq data set (load_seq2seq with byte tokens), shared by the JSON-
// lines (fuzz_seq2seq) and CSV (fuzz_csv) targets: loading is an fsdp::Error with a message or a
// data set whose train part has rows; every row has ids pad 0, eos 1 or bytes 3..258, exactly one
// eos, then only the padding (inputs pad 0; labels -100, or pad 0 with loss_on_padding);
// loss_elements counts the labels the loss keeps; no text is empty.
#include <memory>
#include <string>
#include <vector>

#include "data/data.h"
#include "fuzz_util.h"
#include "tensor/tensor.h"

namespace fuzz {

// One row of n ids: ids then eos then `fill` to the end.
inline void check_row(const int32_t* ids, int64_t n, int32_t fill) {
  int64_t eos = -1;
  for (int64_t j = 0; j < n; ++j) {
    const int32_t id = ids[j];
    if (id == 1) {
      if (eos >= 0) broken("two eos in one row");
      eos = j;
    } else if (eos >= 0) {
      if (id != fill) broken("a token after eos that is not the padding");
    } else if (id < 3 || id > 258) {
      broken("a token before eos that is not a byte id");
    }
  }
  if (eos < 0) broken("a row without eos");
}

// Loads both parts and checks their first and last rows; `text_ok` is asked about every text.
template <class TextCheck>
void check_seq2seq(const fsdp::Seq2SeqOptions& options, TextCheck text_ok) {
  for (bool train : {true, false}) {
    std::unique_ptr<fsdp::Seq2SeqDataset> ds;
    try {
      ds = fsdp::load_seq2seq(options, train);
    } catch (const fsdp::Error& e) {
      expect_message(e);
      return;
    }
    const int64_t n = ds->size(), S = options.source_len, L = options.target_len;
    if (n < 0 || (train && n < 1)) broken("a loaded seq2seq part has no rows");
    if (n == 0) continue;
    const std::vector<int64_t> idx = {0, n - 1};
    fsdp::Tensor inputs = fsdp::Tensor::empty({2, S}, fsdp::DType::i32);
    fsdp::Tensor targets = fsdp::Tensor::empty({2, L}, fsdp::DType::i32);
    ds->fill(idx, inputs, targets);
    const int32_t label_fill = options.loss_on_padding ? 0 : -100;
    for (int k = 0; k < 2; ++k) {
      check_row(inputs.i32() + k * S, S, 0);
      check_row(targets.i32() + k * L, L, label_fill);
    }
    int64_t kept = 0;
    for (int64_t j = 0; j < 2 * L; ++j) kept += targets.i32()[j] != -100;
    if (ds->loss_elements(idx) != kept) broken("loss_elements differs from the labels kept");
    for (int64_t i : idx) {
      if (ds->source_text(i).empty() || ds->target_text(i).empty()) broken("an empty text was not skipped");
      text_ok(ds->source_text(i));
      text_ok(ds->target_text(i));
    }
  }
}

}  // namespace fuzz
