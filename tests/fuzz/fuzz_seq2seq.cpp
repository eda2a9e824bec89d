// Fuzz target: the seq2seq JSON-lines reader (load_seq2seq: one JSON object per line, two string
// fields picked by name, byte tokens).
// Input: byte 0 picks source_len, byte 1 target_len, byte 2 eval_fraction, byte 3 the field
// names (the defaults, or names the rows may lack), then the file's bytes.
// Promises checked: bad input is an fsdp::Error with a message; data that loads has train and
// eval parts whose ids are pad 0, eos 1 or bytes 3..258, each row with exactly one eos, the
// labels -100 after it and nowhere else, and loss_elements equal to the labels kept.
#include <cmath>
#include <limits>

#include "data/data.h"
#include "fuzz_util.h"
#include "tensor/tensor.h"

namespace {

// One row of n ids: ids then eos then `fill` to the end.
void check_row(const int32_t* ids, int64_t n, int32_t fill) {
  int64_t eos = -1;
  for (int64_t j = 0; j < n; ++j) {
    const int32_t id = ids[j];
    if (id == 1) {
      if (eos >= 0) fuzz::broken("two eos in one row");
      eos = j;
    } else if (eos >= 0) {
      if (id != fill) fuzz::broken("a token after eos that is not the padding");
    } else if (id < 3 || id > 258) {
      fuzz::broken("a token before eos that is not a byte id");
    }
  }
  if (eos < 0) fuzz::broken("a row without eos");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const std::vector<int64_t> lens = {2, 3, 5, 8, 17, 64, 512};
  const std::vector<double> fractions = {0.05, 0.5, 0.25, 0.9, 0.999999, 1e-300};
  const std::vector<std::pair<std::string, std::string>> names = {
      {"text", "headline"}, {"a", "b"}, {"text", "text"}, {"", "headline"}};
  fsdp::Seq2SeqOptions options;
  options.source_len = in.pick(lens);
  options.target_len = in.pick(lens);
  options.eval_fraction = in.pick(fractions);
  std::tie(options.source, options.target) = in.pick(names);
  const std::string dir = fuzz::fresh_dir("seq2seq");
  options.path = dir + "/pairs.jsonl";
  fuzz::write_file(options.path, in.rest());

  for (bool train : {true, false}) {
    std::unique_ptr<fsdp::Dataset> ds;
    try {
      ds = fsdp::load_seq2seq(options, train);
    } catch (const fsdp::Error& e) {
      fuzz::expect_message(e);
      return 0;
    }
    const int64_t n = ds->size(), S = options.source_len, L = options.target_len;
    if (n < 0 || (train && n < 1)) fuzz::broken("a loaded seq2seq part has no rows");
    if (n == 0) continue;
    const std::vector<int64_t> idx = {0, n - 1};
    fsdp::Tensor inputs = fsdp::Tensor::empty({2, S}, fsdp::DType::i32);
    fsdp::Tensor targets = fsdp::Tensor::empty({2, L}, fsdp::DType::i32);
    ds->fill(idx, inputs, targets);
    int64_t kept = 0;
    for (int k = 0; k < 2; ++k) {
      check_row(inputs.i32() + k * S, S, 0);
      check_row(targets.i32() + k * L, L, -100);
    }
    for (int64_t j = 0; j < 2 * L; ++j) kept += targets.i32()[j] != -100;
    if (ds->loss_elements(idx) != kept) fuzz::broken("loss_elements differs from the labels kept");
  }
  return 0;
}
