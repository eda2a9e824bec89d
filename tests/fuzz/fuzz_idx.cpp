// Fuzz target: the Fashion-MNIST reader (load_fashion_mnist: two gzipped IDX files in a folder).
// Input: byte 0 flags (bit 0: the bytes are raw IDX and get gzipped here, so the fuzzer works on
// headers and payloads; clear: they are the .gz files themselves, to fuzz the gzip layer;
// bit 1: train-* rather than t10k-*; bit 2: leave the labels file out), a 2-byte length of the
// labels file, the labels file, then the images file.
// Promises checked: bad input is an fsdp::Error with a message; a dataset that loads fills its
// first and last samples with in-range pixels and labels.
#include <zlib.h>

#include <cmath>

#include "data/data.h"
#include "fuzz_util.h"
#include "tensor/tensor.h"

namespace {

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb1");
  if (!f) std::abort();
  if (!bytes.empty() && gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) != static_cast<int>(bytes.size()))
    std::abort();
  gzclose(f);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const uint8_t flags = in.u8();
  const bool raw = flags & 1, train = flags & 2, no_labels = flags & 4;
  const std::string labels = in.bytes(in.u16());
  const std::string images = in.rest();

  const std::string dir = fuzz::fresh_dir("idx");
  const std::string prefix = dir + "/" + (train ? "train" : "t10k");
  const std::string labels_path = prefix + "-labels-idx1-ubyte.gz", images_path = prefix + "-images-idx3-ubyte.gz";
  if (raw) {
    if (!no_labels) write_gz(labels_path, labels);
    write_gz(images_path, images);
  } else {
    if (!no_labels) fuzz::write_file(labels_path, labels);
    fuzz::write_file(images_path, images);
  }

  std::unique_ptr<fsdp::Dataset> ds;
  try {
    ds = fsdp::load_fashion_mnist(dir, train);
  } catch (const fsdp::Error& e) {
    fuzz::expect_message(e);
    return 0;
  }
  const int64_t n = ds->size();
  if (n < 1) fuzz::broken("a loaded Fashion-MNIST set has no samples");
  const std::vector<int64_t> idx = {0, n - 1};
  fsdp::Tensor inputs = fsdp::Tensor::empty({2, 1, 28, 28}, fsdp::DType::f32);
  fsdp::Tensor targets = fsdp::Tensor::empty({2}, fsdp::DType::i32);
  ds->fill(idx, inputs, targets);
  for (int64_t i = 0; i < inputs.numel(); ++i)
    if (!std::isfinite(inputs.f32()[i]) || std::fabs(inputs.f32()[i]) > 3.0f) fuzz::broken("pixel out of range");
  for (int k = 0; k < 2; ++k)
    if (targets.i32()[k] < 0 || targets.i32()[k] > 9) fuzz::broken("label out of range");
  return 0;
}
