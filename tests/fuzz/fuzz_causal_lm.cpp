// Fuzz target: the causal-LM data reader (load_causal_lm: plain-text lines or JSON lines, from a
// file or a folder, packed into blocks for pretraining or masked prompt/response pairs for
// fine-tuning, byte tokens).
// Input: byte 0 flags (bit 0: sft; bit 1: pack; bit 2: a folder of files, the text split on byte
// 0x1e into up to 6 files named alternately *.jsonl and *.txt; else one file, *.jsonl with bit
// 3), byte 1 picks seq_len, byte 2 eval_fraction, then the text.
// Promises checked: bad input is an fsdp::Error with a message; a dataset that loads has samples;
// every input is a token of the vocabulary; every target is -100 or the next input of the sample
// (the last position always -100); loss_elements counts the other targets and is at least 1 a
// sample; a sample's prompt is no longer than the sample.
#include <cmath>
#include <limits>

#include "data/data.h"
#include "fuzz_util.h"
#include "tensor/tensor.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const uint8_t flags = in.u8();
  const std::vector<int64_t> seq_lens = {2, 3, 4, 5, 8, 16, 64, 1, 0, -1, std::numeric_limits<int64_t>::min()};
  const std::vector<double> fractions = {0.05, 0.5, 0.25, 0.9, 0.999999, 1e-300, 0.0, 1.0, std::nan("")};
  fsdp::CausalLmOptions options;
  options.sft = flags & 1;
  options.pack = flags & 2;
  options.seq_len = in.pick(seq_lens);
  options.eval_fraction = in.pick(fractions);
  const std::string text = in.rest();

  const std::string dir = fuzz::fresh_dir("causal_lm");
  if (flags & 4) {
    const std::vector<std::string> files = fuzz::split(text, '\x1e', 6);
    std::filesystem::create_directories(dir + "/corpus");
    for (size_t i = 0; i < files.size(); ++i)
      fuzz::write_file(dir + "/corpus/f" + std::to_string(i) + (i % 2 ? ".txt" : ".jsonl"), files[i]);
    options.path = dir + "/corpus";
  } else {
    options.path = dir + ((flags & 8) ? "/rows.jsonl" : "/rows.txt");
    fuzz::write_file(options.path, text);
  }

  for (bool train : {true, false}) {
    std::unique_ptr<fsdp::CausalLmDataset> ds;
    try {
      ds = fsdp::load_causal_lm(options, train);
    } catch (const fsdp::Error& e) {
      fuzz::expect_message(e);
      return 0;
    }
    const int64_t n = ds->size(), L = options.seq_len, V = ds->num_classes();
    if (n < 1) fuzz::broken("a loaded causal_lm dataset has no samples");
    const std::vector<int64_t> idx = {0, n - 1};
    fsdp::Tensor inputs = fsdp::Tensor::empty({2, L}, fsdp::DType::i32);
    fsdp::Tensor targets = fsdp::Tensor::empty({2, L}, fsdp::DType::i32);
    ds->fill(idx, inputs, targets);
    int64_t counted = 0;
    for (int k = 0; k < 2; ++k) {
      int64_t row_counted = 0;
      for (int64_t j = 0; j < L; ++j) {
        const int32_t a = inputs.i32()[k * L + j], b = targets.i32()[k * L + j];
        if (a < 0 || a >= V) fuzz::broken("input token out of range");
        if (b == -100) continue;
        ++row_counted;
        if (j + 1 >= L) fuzz::broken("the last position has a target");
        if (inputs.i32()[k * L + j + 1] != b) fuzz::broken("a target is not the next input");
      }
      if (row_counted < 1) fuzz::broken("a sample with no counted target");
      if (ds->prompt_tokens(idx[static_cast<size_t>(k)]) > L) fuzz::broken("a prompt longer than its sample");
      counted += row_counted;
    }
    if (ds->loss_elements(idx) != counted) fuzz::broken("loss_elements differs from the counted targets");
  }
  return 0;
}
