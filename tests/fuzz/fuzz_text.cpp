// Fuzz target: the byte-level text corpus reader (load_text_corpus: a file, or a folder of files
// read recursively in path order, binary files and symlinks skipped).
// Input: byte 0 flags (bit 0: a folder of files rather than one file; bit 1: add a symlink and
// an empty subfolder), byte 1 picks seq_len, byte 2 eval_fraction (edge values included), then
// the text; in folder mode the text is split into up to 6 files on byte 0x1e.
// Promises checked: bad input is an fsdp::Error with a message; a corpus that loads has train
// and eval samples whose inputs and targets are bytes and agree (target = input shifted by one).
#include <unistd.h>

#include <cmath>
#include <limits>

#include "data/data.h"
#include "fuzz_util.h"
#include "tensor/tensor.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const uint8_t flags = in.u8();
  const std::vector<int64_t> seq_lens = {1,
                                         2,
                                         3,
                                         4,
                                         7,
                                         8,
                                         16,
                                         31,
                                         64,
                                         256,
                                         0,
                                         -1,
                                         std::numeric_limits<int64_t>::max(),
                                         std::numeric_limits<int64_t>::min(),
                                         int64_t{1} << 40,
                                         std::numeric_limits<int64_t>::max() / 2 + 1};
  const std::vector<double> fractions = {0.05,
                                         0.5,
                                         0.25,
                                         0.9,
                                         0.999999,
                                         1e-300,
                                         0.0,
                                         1.0,
                                         -0.5,
                                         std::nan(""),
                                         std::numeric_limits<double>::infinity(),
                                         std::numeric_limits<double>::denorm_min()};
  fsdp::TextCorpusOptions options;
  options.seq_len = in.pick(seq_lens);
  options.eval_fraction = in.pick(fractions);
  const std::string text = in.rest();

  const std::string dir = fuzz::fresh_dir("text");
  if (flags & 1) {
    const std::vector<std::string> files = fuzz::split(text, '\x1e', 6);
    std::filesystem::create_directories(dir + "/corpus/sub");
    for (size_t i = 0; i < files.size(); ++i)
      fuzz::write_file(dir + "/corpus/" + (i % 2 ? "sub/" : "") + "f" + std::to_string(i), files[i]);
    if (flags & 2) {
      std::filesystem::create_directories(dir + "/corpus/empty");
      if (symlink("f0", (dir + "/corpus/link").c_str()) != 0) std::abort();
    }
    options.path = dir + "/corpus";
  } else {
    options.path = dir + "/corpus.txt";
    fuzz::write_file(options.path, text);
  }

  for (bool train : {true, false}) {
    std::unique_ptr<fsdp::Dataset> ds;
    try {
      ds = fsdp::load_text_corpus(options, train);
    } catch (const fsdp::Error& e) {
      fuzz::expect_message(e);
      return 0;
    }
    const int64_t n = ds->size(), L = options.seq_len;
    if (n < 1) fuzz::broken("a loaded text corpus has no samples");
    if (L > (int64_t{1} << 20)) fuzz::broken("a corpus loaded with a seq_len longer than any input");
    const std::vector<int64_t> idx = {0, n - 1};
    fsdp::Tensor inputs = fsdp::Tensor::empty({2, L}, fsdp::DType::i32);
    fsdp::Tensor targets = fsdp::Tensor::empty({2, L}, fsdp::DType::i32);
    ds->fill(idx, inputs, targets);
    for (int k = 0; k < 2; ++k)
      for (int64_t j = 0; j < L; ++j) {
        const int32_t a = inputs.i32()[k * L + j], b = targets.i32()[k * L + j];
        if (a < 0 || a > 255 || b < 0 || b > 255) fuzz::broken("token out of range");
        if (j + 1 < L && inputs.i32()[k * L + j + 1] != b) fuzz::broken("target is not the input shifted by one");
      }
  }
  return 0;
}
