#define BOOST_TEST_MODULE data
#include <boost/test/unit_test.hpp>

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "data/data.h"
#include "tensor/error.h"

using namespace fsdp;
namespace fs = std::filesystem;

namespace {

// A fresh folder under /tmp, removed with everything in it at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "fsdp_test_data_XXXXXX").string();
    BOOST_REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  std::string str() const { return path.string(); }
};

// The message of the fsdp::Error that f throws; fails the test when it throws nothing.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    std::string message = e.what();
    BOOST_CHECK_MESSAGE(message.find('\n') == std::string::npos, "not one line: " + message);
    return message;
  }
  BOOST_ERROR("no fsdp::Error thrown");
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  bool found = text.find(part) != std::string::npos;
  if (!found) BOOST_TEST_MESSAGE("'" << part << "' not in '" << text << "'");
  return found;
}

// Independent of the loader: whole-file gunzip with zlib's gzread, no checks.
std::vector<uint8_t> gunzip(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  BOOST_REQUIRE(file != nullptr);
  std::vector<uint8_t> bytes;
  uint8_t chunk[1 << 16];
  int got;
  while ((got = gzread(file, chunk, sizeof chunk)) > 0) bytes.insert(bytes.end(), chunk, chunk + got);
  gzclose(file);
  return bytes;
}

void write_gz(const fs::path& path, const std::vector<uint8_t>& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  BOOST_REQUIRE(file != nullptr);
  if (!bytes.empty()) BOOST_REQUIRE(gzwrite(file, bytes.data(), bytes.size()) == int(bytes.size()));
  gzclose(file);
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

void put_be32(std::vector<uint8_t>& bytes, uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(uint8_t(value >> shift));
}

std::vector<uint8_t> idx_labels(uint32_t magic, uint32_t count, uint8_t label = 1) {
  std::vector<uint8_t> bytes;
  put_be32(bytes, magic);
  put_be32(bytes, count);
  bytes.insert(bytes.end(), count, label);
  return bytes;
}

std::vector<uint8_t> idx_images(uint32_t magic, uint32_t count, uint32_t rows = 28, uint32_t cols = 28) {
  std::vector<uint8_t> bytes;
  put_be32(bytes, magic);
  put_be32(bytes, count);
  put_be32(bytes, rows);
  put_be32(bytes, cols);
  bytes.insert(bytes.end(), size_t(count) * rows * cols, 7);
  return bytes;
}

float normalized(uint8_t pixel) { return (static_cast<float>(pixel) / 255.0f - 0.2860f) / 0.3530f; }

void fill(const Dataset& dataset, const std::vector<int64_t>& indices, Tensor& inputs, Tensor& targets) {
  Shape in_shape = {int64_t(indices.size())}, target_shape = {int64_t(indices.size())};
  for (int64_t d : dataset.input_shape()) in_shape.push_back(d);
  for (int64_t d : dataset.target_shape()) target_shape.push_back(d);
  inputs = Tensor::empty(in_shape, dataset.input_dtype());
  targets = Tensor::empty(target_shape, DType::i32);
  dataset.fill(indices, inputs, targets);
}

std::vector<uint8_t> raw_bytes(const Tensor& t) {
  auto* p = static_cast<const uint8_t*>(t.raw());
  return std::vector<uint8_t>(p, p + t.bytes());
}

}  // namespace

// ------------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(fashion_mnist)

BOOST_AUTO_TEST_CASE(train_matches_independent_decode) {
  auto train = load_fashion_mnist(kFashionMnistDir, true);
  BOOST_TEST(train->size() == 60000);
  BOOST_TEST(train->input_shape() == (Shape{1, 28, 28}));
  BOOST_TEST(dtype_name(train->input_dtype()) == "f32");
  BOOST_TEST(train->target_shape() == Shape{});
  BOOST_TEST(train->num_classes() == 10);

  std::vector<uint8_t> labels = gunzip(std::string(kFashionMnistDir) + "/train-labels-idx1-ubyte.gz");
  std::vector<uint8_t> images = gunzip(std::string(kFashionMnistDir) + "/train-images-idx3-ubyte.gz");
  BOOST_REQUIRE(labels.size() == 8 + 60000u);
  BOOST_REQUIRE(images.size() == 16 + 60000u * 784);

  std::vector<int64_t> indices = {0, 1, 2, 3, 59999, 12345};
  Tensor x, y;
  fill(*train, indices, x, y);
  // First labels as python3 -c 'gzip.open(...).read()[8:12]' gives them.
  BOOST_TEST(y.i32()[0] == 9);
  BOOST_TEST(y.i32()[1] == 0);
  BOOST_TEST(y.i32()[2] == 0);
  BOOST_TEST(y.i32()[3] == 3);
  for (size_t k = 0; k < indices.size(); ++k) {
    BOOST_TEST(y.i32()[k] == labels[8 + indices[k]]);
    for (int p = 0; p < 784; ++p) BOOST_REQUIRE(x.f32()[k * 784 + p] == normalized(images[16 + indices[k] * 784 + p]));
  }
  // Image 0: pixel 0 is 0, pixel 99 is 13, pixel 100 is 73. Expected floats from numpy float32
  // (x/255 - 0.2860)/0.3530, which is what ToTensor()+Normalize computes.
  BOOST_TEST(x.f32()[0] == -0x1.9ed252p-1f);
  BOOST_TEST(x.f32()[99] == -0x1.54e0dap-1f);
  BOOST_TEST(x.f32()[100] == 0x1.97b5f2p-11f);
  BOOST_TEST(normalized(255) == 0x1.02e69ep+1f);
}

BOOST_AUTO_TEST_CASE(test_split) {
  auto test = load_fashion_mnist(kFashionMnistDir, false);
  BOOST_TEST(test->size() == 10000);
  Tensor x, y;
  fill(*test, {0, 1, 2, 3, 4}, x, y);
  std::vector<int32_t> labels(y.i32(), y.i32() + 5);
  BOOST_TEST(labels == (std::vector<int32_t>{9, 2, 1, 1, 6}), boost::test_tools::per_element());
  BOOST_TEST(x.f32()[215] == normalized(3));
  BOOST_TEST(x.f32()[221] == normalized(37));
}

BOOST_AUTO_TEST_CASE(missing_dir_and_files) {
  std::string message = error_of([] { load_fashion_mnist("/nonexistent/fashion", true); });
  BOOST_TEST(contains(message, "/nonexistent/fashion"));
  BOOST_TEST(contains(message, "dataset-fashion-mnist"));

  TempDir dir;
  message = error_of([&] { load_fashion_mnist(dir.str(), false); });
  BOOST_TEST(contains(message, "t10k-labels-idx1-ubyte.gz"));
  BOOST_TEST(contains(message, "dataset-fashion-mnist"));
}

BOOST_AUTO_TEST_CASE(corrupt_files) {
  TempDir dir;
  const fs::path labels = dir.path / "train-labels-idx1-ubyte.gz";
  const fs::path images = dir.path / "train-images-idx3-ubyte.gz";
  auto load = [&] { load_fashion_mnist(dir.str(), true); };

  // A gzip stream cut short: the first 2000 bytes of the real labels file.
  {
    std::ifstream in(std::string(kFashionMnistDir) + "/train-labels-idx1-ubyte.gz", std::ios::binary);
    std::string head(2000, '\0');
    in.read(head.data(), head.size());
    write_file(labels, head);
  }
  std::string message = error_of(load);
  BOOST_TEST(contains(message, labels.string()));
  BOOST_TEST(contains(message, "truncated"));

  write_gz(labels, idx_labels(0x00000802, 3));
  message = error_of(load);
  BOOST_TEST(contains(message, labels.string()));
  BOOST_TEST(contains(message, "bad IDX magic 0x00000802, expected 0x00000801"));

  std::vector<uint8_t> short_labels = idx_labels(0x00000801, 3);
  short_labels.pop_back();  // a valid gzip stream whose IDX payload is one label short
  write_gz(labels, short_labels);
  message = error_of(load);
  BOOST_TEST(contains(message, "truncated: 3 labels need 3 bytes of data, the file has 2"));

  write_gz(labels, idx_labels(0x00000801, 3, 10));
  write_gz(images, idx_images(0x00000803, 3));
  message = error_of(load);
  BOOST_TEST(contains(message, "label 10 of sample 0 is outside 0..9"));

  write_gz(labels, idx_labels(0x00000801, 3));
  write_gz(images, idx_images(0x00000801, 3));
  message = error_of(load);
  BOOST_TEST(contains(message, images.string()));
  BOOST_TEST(contains(message, "bad IDX magic 0x00000801, expected 0x00000803"));

  write_gz(images, idx_images(0x00000803, 3, 27, 28));
  BOOST_TEST(contains(error_of(load), "images are 27x28, expected 28x28"));

  write_gz(images, idx_images(0x00000803, 2));
  message = error_of(load);
  BOOST_TEST(contains(message, "has 2 images but"));
  BOOST_TEST(contains(message, "has 3 labels"));

  std::vector<uint8_t> header_only = idx_images(0x00000803, 3);
  header_only.resize(10);
  write_gz(images, header_only);
  BOOST_TEST(contains(error_of(load), "shorter than the 16-byte IDX header"));

  // And a well-formed tiny pair loads, with the pixel value 7 normalized.
  write_gz(images, idx_images(0x00000803, 3));
  auto tiny = load_fashion_mnist(dir.str(), true);
  BOOST_TEST(tiny->size() == 3);
  Tensor x, y;
  fill(*tiny, {2}, x, y);
  BOOST_TEST(x.f32()[783] == normalized(7));
  BOOST_TEST(y.i32()[0] == 1);
}

BOOST_AUTO_TEST_SUITE_END()

// ------------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(text_corpus)

// a.txt, bin.dat (NUL: skipped), link -> a.txt (symlink: skipped), sub/b.txt.
struct Corpus {
  TempDir dir;
  Corpus() {
    write_file(dir.path / "a.txt", "Hello, ");
    write_file(dir.path / "bin.dat", std::string("ab\0cd", 5));
    fs::create_symlink(dir.path / "a.txt", dir.path / "link");
    fs::create_directory(dir.path / "sub");
    write_file(dir.path / "sub" / "b.txt", "world of bytes!");
  }
};

std::string as_text(const int32_t* tokens, int64_t count) {
  std::string text;
  for (int64_t i = 0; i < count; ++i) text.push_back(char(tokens[i]));
  return text;
}

BOOST_AUTO_TEST_CASE(folder_samples_and_split) {
  // Corpus "Hello, world of bytes!": 22 bytes, (22 - 1) / 4 = 5 samples, floor(5 * 0.7) = 3 train.
  Corpus corpus;
  TextCorpusOptions options{corpus.dir.str(), 4, 0.3};
  auto train = load_text_corpus(options, true);
  auto eval = load_text_corpus(options, false);
  BOOST_TEST(train->size() == 3);
  BOOST_TEST(eval->size() == 2);
  BOOST_TEST(train->num_classes() == 256);
  BOOST_TEST(train->input_shape() == Shape{4});
  BOOST_TEST(train->target_shape() == Shape{4});
  BOOST_TEST(dtype_name(train->input_dtype()) == "i32");

  Tensor x, y;
  fill(*train, {0, 1, 2}, x, y);
  BOOST_TEST(as_text(x.i32(), 4) == "Hell");
  BOOST_TEST(as_text(y.i32(), 4) == "ello");
  BOOST_TEST(as_text(x.i32() + 4, 4) == "o, w");
  BOOST_TEST(as_text(y.i32() + 4, 4) == ", wo");
  BOOST_TEST(as_text(x.i32() + 8, 4) == "orld");
  BOOST_TEST(as_text(y.i32() + 8, 4) == "rld ");

  fill(*eval, {1, 0}, x, y);
  BOOST_TEST(as_text(x.i32(), 4) == "byte");
  BOOST_TEST(as_text(y.i32(), 4) == "ytes");
  BOOST_TEST(as_text(x.i32() + 4, 4) == " of ");
  BOOST_TEST(as_text(y.i32() + 4, 4) == "of b");

  BOOST_TEST(contains(error_of([&] { fill(*eval, {2}, x, y); }), "sample index 2 is out of range [0, 2)"));
}

BOOST_AUTO_TEST_CASE(single_file) {
  Corpus corpus;
  auto train = load_text_corpus({(corpus.dir.path / "sub" / "b.txt").string(), 3, 0.5}, true);
  BOOST_TEST(train->size() == 2);  // (15 - 1) / 3 = 4 samples, half train
  Tensor x, y;
  fill(*train, {1}, x, y);
  BOOST_TEST(as_text(x.i32(), 3) == "ld ");
  BOOST_TEST(as_text(y.i32(), 3) == "d o");
}

BOOST_AUTO_TEST_CASE(errors) {
  Corpus corpus;
  const std::string path = corpus.dir.str();
  std::string message = error_of([] { load_text_corpus({"/nonexistent/corpus", 4, 0.1}, true); });
  BOOST_TEST(contains(message, "/nonexistent/corpus"));
  BOOST_TEST(contains(message, "not found"));

  TempDir empty;
  write_file(empty.path / "zero.bin", std::string(1, '\0'));
  BOOST_TEST(contains(error_of([&] { load_text_corpus({empty.str(), 4, 0.1}, true); }), "no text"));

  BOOST_TEST(contains(error_of([&] {
                        load_text_corpus({path, 100, 0.1}, true);
                      }),
                      "22 bytes is shorter than seq_len+1 = 101 bytes"));
  for (double bad : {0.0, 1.0, -0.5, std::numeric_limits<double>::quiet_NaN()})
    BOOST_TEST(contains(error_of([&] { load_text_corpus({path, 4, bad}, true); }), "eval_fraction"));
  // 1 - 1e-17 rounds to 1: all 5 samples train, none left to evaluate.
  BOOST_TEST(contains(error_of([&] { load_text_corpus({path, 4, 1e-17}, false); }), "0 eval samples"));
  BOOST_TEST(contains(error_of([&] { load_text_corpus({path, 4, 0.9}, true); }), "0 train"));
  BOOST_TEST(contains(error_of([&] { load_text_corpus({path, 0, 0.1}, true); }), "seq_len"));
}

BOOST_AUTO_TEST_CASE(debian_fortunes) {
  if (!fs::is_directory(kTextCorpusDir)) return;
  // Independently: the text is every regular non-.dat file; .dat are strfile indexes, .u8 links.
  int64_t text_bytes = 0;
  for (const auto& entry : fs::recursive_directory_iterator(kTextCorpusDir))
    if (!entry.is_symlink() && entry.is_regular_file() && entry.path().extension() != ".dat")
      text_bytes += int64_t(entry.file_size());
  auto train = load_text_corpus({kTextCorpusDir, 256, 0.05}, true);
  auto eval = load_text_corpus({kTextCorpusDir, 256, 0.05}, false);
  BOOST_TEST(train->size() + eval->size() == (text_bytes - 1) / 256);
  BOOST_TEST(eval->size() >= 1);
  Tensor x, y;
  fill(*eval, {eval->size() - 1}, x, y);
  for (int j = 0; j < 256; ++j) BOOST_REQUIRE(x.i32()[j] > 0 && x.i32()[j] < 256);
}

BOOST_AUTO_TEST_SUITE_END()

// ------------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(synthetic)

BOOST_AUTO_TEST_CASE(images_deterministic_and_learnable) {
  SyntheticOptions options;  // images, 1024 samples, 10 classes, {1, 28, 28}
  auto a = make_synthetic(options, true);
  auto b = make_synthetic(options, true);
  BOOST_TEST(a->size() == 1024);
  BOOST_TEST(a->input_shape() == (Shape{1, 28, 28}));
  BOOST_TEST(a->num_classes() == 10);

  Tensor x1, y1, x2, y2, x3, y3;
  fill(*a, {7, 3, 1023}, x1, y1);
  fill(*b, {3}, x2, y2);
  fill(*a, {1023, 7}, x3, y3);
  BOOST_TEST(std::memcmp(x1.f32() + 784, x2.f32(), 784 * 4) == 0);
  BOOST_TEST(std::memcmp(x1.f32(), x3.f32() + 784, 784 * 4) == 0);
  BOOST_TEST(std::memcmp(x1.f32() + 2 * 784, x3.f32(), 784 * 4) == 0);
  BOOST_TEST(y1.i32()[0] == 7);
  BOOST_TEST(y1.i32()[1] == 3);
  BOOST_TEST(y1.i32()[2] == 3);  // 1023 % 10

  // The class band (78 pixels of 784 for class 3: [235, 313)) sits ~1.0 above the rest.
  double band = 0, rest = 0;
  for (int p = 0; p < 784; ++p) (p >= 235 && p < 313 ? band : rest) += x2.f32()[p];
  BOOST_TEST(std::abs(band / 78 - 1.0) < 0.2);
  BOOST_TEST(std::abs(rest / 706) < 0.1);

  auto eval = make_synthetic(options, false);
  Tensor xe, ye;
  fill(*eval, {3}, xe, ye);
  BOOST_TEST(ye.i32()[0] == 3);
  BOOST_TEST(raw_bytes(xe) != raw_bytes(x2));  // a different stream from train
  options.seed = 2;
  fill(*make_synthetic(options, true), {3}, xe, ye);
  BOOST_TEST(raw_bytes(xe) != raw_bytes(x2));
}

BOOST_AUTO_TEST_CASE(odd_image_shape) {
  SyntheticOptions options;
  options.image_shape = {3, 5, 5};  // 75 pixels: the last Box-Muller pair is half used
  options.classes = 4;
  auto data = make_synthetic(options, true);
  Tensor x1, y1, x2, y2;
  fill(*data, {0, 1}, x1, y1);
  fill(*data, {1}, x2, y2);
  BOOST_TEST(x1.shape() == (Shape{2, 3, 5, 5}));
  BOOST_TEST(std::memcmp(x1.f32() + 75, x2.f32(), 75 * 4) == 0);
  BOOST_TEST(y2.i32()[0] == 1);
}

BOOST_AUTO_TEST_CASE(tokens_follow_the_rule) {
  SyntheticOptions options;
  options.kind = "tokens";
  options.vocab = 50;
  options.seq_len = 32;
  auto data = make_synthetic(options, true);
  BOOST_TEST(data->input_shape() == Shape{32});
  BOOST_TEST(data->target_shape() == Shape{32});
  BOOST_TEST(dtype_name(data->input_dtype()) == "i32");
  BOOST_TEST(data->num_classes() == 50);

  Tensor x, y, x2, y2;
  fill(*data, {0, 1, 2, 3, 4, 5, 6, 7}, x, y);
  fill(*make_synthetic(options, true), {5}, x2, y2);
  BOOST_TEST(std::memcmp(x.i32() + 5 * 32, x2.i32(), 32 * 4) == 0);
  BOOST_TEST(std::memcmp(y.i32() + 5 * 32, y2.i32(), 32 * 4) == 0);

  int follows = 0, total = 0;
  for (int k = 0; k < 8; ++k) {
    const int32_t* in = x.i32() + k * 32;
    const int32_t* target = y.i32() + k * 32;
    for (int j = 0; j < 32; ++j) {
      BOOST_REQUIRE(in[j] >= 0 && in[j] < 50);
      if (j + 1 < 32) BOOST_REQUIRE(target[j] == in[j + 1]);
      follows += target[j] == (in[j] * 7 + 3) % 50;
      ++total;
    }
  }
  BOOST_TEST(follows > total * 8 / 10);
  BOOST_TEST(follows < total);  // some random tokens
}

BOOST_AUTO_TEST_CASE(errors) {
  SyntheticOptions options;
  options.kind = "audio";
  BOOST_TEST(contains(error_of([&] { make_synthetic(options, true); }), "'audio'"));
  options.kind = "images";
  options.samples = 0;
  BOOST_TEST(contains(error_of([&] { make_synthetic(options, true); }), "samples"));
  options.samples = 10;
  options.image_shape = {1, 0, 28};
  BOOST_TEST(contains(error_of([&] { make_synthetic(options, true); }), "image_shape"));

  options.image_shape = {1, 28, 28};
  auto data = make_synthetic(options, true);
  Tensor x = Tensor::empty({2, 1, 28, 28}, DType::f32), y = Tensor::empty({2}, DType::i32);
  std::vector<int64_t> indices = {0, 10};
  BOOST_TEST(contains(error_of([&] { data->fill(indices, x, y); }), "sample index 10 is out of range [0, 10)"));
  indices = {0, -1};
  BOOST_TEST(contains(error_of([&] { data->fill(indices, x, y); }), "sample index -1"));
  indices = {0};
  BOOST_TEST(contains(error_of([&] { data->fill(indices, x, y); }), "expected cpu [1, 1, 28, 28] f32"));
  Tensor bad = Tensor::empty({1, 1, 28, 28}, DType::bf16), y1 = Tensor::empty({1}, DType::i32);
  BOOST_TEST(contains(error_of([&] { data->fill(indices, bad, y1); }), "inputs"));
  Tensor x1 = Tensor::empty({1, 1, 28, 28}, DType::f32), bad_y = Tensor::empty({1}, DType::f32);
  BOOST_TEST(contains(error_of([&] { data->fill(indices, x1, bad_y); }), "targets"));
  data->fill(indices, x1, y1);
  BOOST_TEST(y1.i32()[0] == 0);
}

BOOST_AUTO_TEST_SUITE_END()

// ------------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(sampler)

BOOST_AUTO_TEST_CASE(sequential) {
  Sampler drop({10, 3, false, true, 1});
  BOOST_TEST(drop.steps_per_epoch() == 3);
  BOOST_TEST(drop.global_batch(0, 0) == (std::vector<int64_t>{0, 1, 2}), boost::test_tools::per_element());
  BOOST_TEST(drop.global_batch(5, 2) == (std::vector<int64_t>{6, 7, 8}), boost::test_tools::per_element());
  BOOST_TEST(contains(error_of([&] { drop.global_batch(0, 3); }), "step 3 is out of range [0, 3)"));

  Sampler keep({10, 3, false, false, 1});
  BOOST_TEST(keep.steps_per_epoch() == 4);
  BOOST_TEST(keep.global_batch(0, 1) == (std::vector<int64_t>{3, 4, 5}), boost::test_tools::per_element());
  BOOST_TEST(keep.global_batch(0, 3) == (std::vector<int64_t>{9}), boost::test_tools::per_element());
  Sampler exact({9, 3, false, false, 1});
  BOOST_TEST(exact.steps_per_epoch() == 3);
}

BOOST_AUTO_TEST_CASE(shuffled) {
  const int64_t n = 100, b = 10;
  Sampler a({n, b, true, true, 42}), same({n, b, true, true, 42}), other_seed({n, b, true, true, 43});
  auto epoch_order = [&](const Sampler& s, int64_t epoch) {
    std::vector<int64_t> order;
    for (int64_t step = 0; step < s.steps_per_epoch(); ++step) {
      auto batch = s.global_batch(epoch, step);
      BOOST_REQUIRE(int64_t(batch.size()) == b);
      order.insert(order.end(), batch.begin(), batch.end());
    }
    return order;
  };
  std::vector<int64_t> e0 = epoch_order(a, 0), e1 = epoch_order(a, 1);
  std::vector<int64_t> identity(n);
  for (int64_t i = 0; i < n; ++i) identity[i] = i;
  std::vector<int64_t> sorted0 = e0, sorted1 = e1;
  std::sort(sorted0.begin(), sorted0.end());
  std::sort(sorted1.begin(), sorted1.end());
  BOOST_TEST(sorted0 == identity, boost::test_tools::per_element());
  BOOST_TEST(sorted1 == identity, boost::test_tools::per_element());
  BOOST_TEST(e0 != identity);
  BOOST_TEST(e0 != e1);
  BOOST_TEST(epoch_order(same, 0) == e0, boost::test_tools::per_element());
  BOOST_TEST(epoch_order(other_seed, 0) != e0);
  // Out-of-order calls (the cache switching epochs) give the same batches.
  BOOST_TEST(same.global_batch(1, 4) == std::vector<int64_t>(e1.begin() + 40, e1.begin() + 50),
             boost::test_tools::per_element());
  BOOST_TEST(same.global_batch(0, 9) == std::vector<int64_t>(e0.begin() + 90, e0.end()),
             boost::test_tools::per_element());

  // drop_last with shuffle: 3 steps of 3 distinct samples out of 10.
  Sampler drop({10, 3, true, true, 7});
  std::set<int64_t> seen;
  for (int64_t step = 0; step < 3; ++step)
    for (int64_t i : drop.global_batch(2, step)) seen.insert(i);
  BOOST_TEST(seen.size() == 9u);
  BOOST_TEST(*seen.rbegin() < 10);
}

BOOST_AUTO_TEST_CASE(rank_slices_cover_the_batch) {
  BOOST_TEST((Sampler::rank_slice(10, 0, 4) == std::pair<int64_t, int64_t>{0, 3}));
  BOOST_TEST((Sampler::rank_slice(10, 1, 4) == std::pair<int64_t, int64_t>{3, 3}));
  BOOST_TEST((Sampler::rank_slice(10, 2, 4) == std::pair<int64_t, int64_t>{6, 2}));
  BOOST_TEST((Sampler::rank_slice(10, 3, 4) == std::pair<int64_t, int64_t>{8, 2}));
  Sampler sampler({1000, 64, true, false, 3});
  for (int64_t step : {int64_t{0}, sampler.steps_per_epoch() - 1}) {  // the last batch has 40
    std::vector<int64_t> batch = sampler.global_batch(0, step);
    for (int ranks : {1, 2, 3, 4, 8}) {
      std::vector<int64_t> joined;
      for (int rank = 0; rank < ranks; ++rank) {
        auto [offset, count] = Sampler::rank_slice(int64_t(batch.size()), rank, ranks);
        BOOST_REQUIRE(offset == int64_t(joined.size()));
        BOOST_REQUIRE(count == int64_t(batch.size()) / ranks + (rank < int64_t(batch.size()) % ranks));
        joined.insert(joined.end(), batch.begin() + offset, batch.begin() + offset + count);
      }
      BOOST_TEST(joined == batch, boost::test_tools::per_element());
    }
  }
  BOOST_TEST(contains(error_of([] { Sampler::rank_slice(10, 4, 4); }), "rank=4"));
  BOOST_TEST(contains(error_of([] { Sampler::rank_slice(10, 0, 0); }), "ranks=0"));
}

BOOST_AUTO_TEST_CASE(errors) {
  BOOST_TEST(contains(error_of([] { Sampler({10, 0, false, true, 1}); }), "global batch must be positive"));
  BOOST_TEST(contains(error_of([] { Sampler({0, 4, false, true, 1}); }), "dataset is empty"));
  BOOST_TEST(contains(error_of([] {
                        Sampler({10, 11, true, true, 1});
                      }),
                      "batch of 11 is larger than the dataset of 10 samples"));
  Sampler eval({10, 11, false, false, 1});  // evaluation keeps a short batch
  BOOST_TEST(eval.steps_per_epoch() == 1);
  BOOST_TEST(eval.global_batch(0, 0).size() == 10u);
  BOOST_TEST(contains(error_of([&] { eval.global_batch(-1, 0); }), "epoch -1"));
}

BOOST_AUTO_TEST_SUITE_END()

// Seq2seq pairs: ByT5 byte ids (byte + 3, eos 1, pad 0), labels -100 on padding, truncation that
// keeps eos, the loss count, the train/eval split, and a bad row named by file and line.
BOOST_AUTO_TEST_SUITE(seq2seq)

BOOST_AUTO_TEST_CASE(byte_ids_padding_and_labels) {
  TempDir dir;
  const std::string file = (dir.path / "pairs.jsonl").string();
  write_file(file,
             "{\"text\": \"ab\", \"headline\": \"xyz\", \"other\": 1}\n"
             "\n"
             "{\"headline\": \"\\u00e9\", \"text\": \"abcdefgh\"}\n"
             "{\"text\": \"q\", \"headline\": \"r\"}\n");
  Seq2SeqOptions o;
  o.path = file;
  o.source_len = 5;
  o.target_len = 3;
  o.eval_fraction = 0.34;  // floor(3 * 0.34) = 1 row evaluates
  auto train = load_seq2seq(o, true), eval = load_seq2seq(o, false);
  BOOST_TEST(train->size() == 2);
  BOOST_TEST(eval->size() == 1);
  BOOST_TEST(train->input_shape() == (Shape{5}));
  BOOST_TEST(train->target_shape() == (Shape{3}));
  Tensor in = Tensor::empty({2, 5}, DType::i32), out = Tensor::empty({2, 3}, DType::i32);
  const std::vector<int64_t> idx = {0, 1};
  train->fill(idx, in, out);
  const std::vector<int32_t> ids(in.i32(), in.i32() + 10), labels(out.i32(), out.i32() + 6);
  // "ab" -> 100 101 eos pad pad; "abcdefgh" truncated to 4 bytes + eos.
  BOOST_TEST(ids == (std::vector<int32_t>{100, 101, 1, 0, 0, 100, 101, 102, 103, 1}), boost::test_tools::per_element());
  // "xyz" -> 2 bytes + eos; "é" is two UTF-8 bytes (0xc3 0xa9) -> 198 172, then eos.
  BOOST_TEST(labels == (std::vector<int32_t>{123, 124, 1, 198, 172, 1}), boost::test_tools::per_element());
  BOOST_TEST(train->loss_elements(idx) == 6);
  Tensor ein = Tensor::empty({1, 5}, DType::i32), eout = Tensor::empty({1, 3}, DType::i32);
  const std::vector<int64_t> first = {0};
  eval->fill(first, ein, eout);
  BOOST_TEST((std::vector<int32_t>(eout.i32(), eout.i32() + 3) == std::vector<int32_t>{117, 1, -100}));
  BOOST_TEST(eval->loss_elements(first) == 2);
}

BOOST_AUTO_TEST_CASE(bad_rows_name_file_and_line) {
  TempDir dir;
  const std::string file = (dir.path / "bad.jsonl").string();
  Seq2SeqOptions o;
  o.path = file;
  auto message = [&](const std::string& text) {
    write_file(file, text);
    return error_of([&] { load_seq2seq(o, true); });
  };
  const std::string at = "seq2seq data " + file + ":";
  BOOST_TEST(message("{\"text\": \"a\", \"headline\": \"b\"}\n{\"text\": \"a\"}\n") == at + "2: no field \"headline\"");
  BOOST_TEST(message("{\"text\": 3, \"headline\": \"b\"}\n") == at + "1: field \"text\" is not a string");
  BOOST_TEST(message("[1, 2]\n") == at + "1: not a JSON object");
  BOOST_TEST(message("{\"text\": \"a\",\n").rfind(at + "1: not a JSON object (", 0) == 0);
  BOOST_TEST(message("\n\n") == "seq2seq data " + file + ": no rows");
  o.path = (dir.path / "missing.jsonl").string();
  BOOST_TEST(error_of([&] { load_seq2seq(o, true); }) == "seq2seq data " + o.path + ": cannot open");
}

BOOST_AUTO_TEST_CASE(synthetic_pairs_are_deterministic) {
  Seq2SeqOptions o;
  o.synthetic_samples = 40;
  o.source_len = 6;
  o.target_len = 4;
  auto a = load_seq2seq(o, true), b = load_seq2seq(o, true), eval = load_seq2seq(o, false);
  BOOST_TEST(a->size() == 40);
  BOOST_TEST(eval->size() == 10);
  std::vector<int64_t> idx(40);
  for (int64_t i = 0; i < 40; ++i) idx[static_cast<size_t>(i)] = i;
  Tensor ia = Tensor::empty({40, 6}, DType::i32), ta = Tensor::empty({40, 4}, DType::i32);
  Tensor ib = Tensor::empty({40, 6}, DType::i32), tb = Tensor::empty({40, 4}, DType::i32);
  a->fill(idx, ia, ta);
  b->fill(idx, ib, tb);
  BOOST_TEST(std::memcmp(ia.raw(), ib.raw(), ia.bytes()) == 0);
  BOOST_TEST(std::memcmp(ta.raw(), tb.raw(), ta.bytes()) == 0);
  int64_t kept = 0, padded_rows = 0;
  for (int64_t i = 0; i < 40 * 4; ++i) kept += ta.i32()[i] != -100;
  for (int64_t r = 0; r < 40; ++r) padded_rows += ta.i32()[r * 4 + 3] == -100;
  BOOST_TEST(a->loss_elements(idx) == kept);
  BOOST_TEST(padded_rows > 0);  // lengths vary: some rows are padded, some truncated
  BOOST_TEST(padded_rows < 40);
}

BOOST_AUTO_TEST_SUITE_END()

// CSV (RFC 4180) and the seq2seq options around it: columns by name, quoted fields with commas,
// "" and line breaks, CRLF, blank lines and a byte order mark; rows with an empty side skipped;
// a malformed row named by file and line; the WikiHow clean-up; the tutorial's loss on padding;
// a validation file of its own.
BOOST_AUTO_TEST_SUITE(seq2seq_csv)

// Sample i's source and target texts, all of them.
std::vector<std::pair<std::string, std::string>> texts(const Seq2SeqDataset& ds) {
  std::vector<std::pair<std::string, std::string>> out;
  for (int64_t i = 0; i < ds.size(); ++i) out.emplace_back(ds.source_text(i), ds.target_text(i));
  return out;
}

BOOST_AUTO_TEST_CASE(fields_by_name_quotes_and_line_breaks) {
  TempDir dir;
  const std::string file = (dir.path / "pairs.CSV").string();  // the extension in any case
  write_file(file,
             "\xEF\xBB\xBFtitle,headline,text\r\n"
             "How to A,\"Be kind.,\r\nBe calm.\",\"One, with a comma.\r\nSays \"\"hi\"\".\r\n\"\r\n"
             "\r\n"
             "How to B,,no headline\r\n"
             "How to C,short,ab\"c d\n"
             "How to D,x,\"\"\n"
             "How to E,last,\"no line break at the end\"");
  Seq2SeqOptions o;
  o.path = file;
  o.eval_fraction = 0.34;  // 3 rows kept (B and D have an empty side): the last one evaluates
  o.source_len = 5;
  o.target_len = 3;
  auto train = load_seq2seq(o, true), eval = load_seq2seq(o, false);
  using Texts = std::vector<std::pair<std::string, std::string>>;
  BOOST_TEST((texts(*train) ==
              Texts{{"One, with a comma.\r\nSays \"hi\".\r\n", "Be kind.,\r\nBe calm."}, {"ab\"c d", "short"}}));
  BOOST_TEST((texts(*eval) == Texts{{"no line break at the end", "last"}}));
  // The ids are the bytes of those texts: "ab\"c d" -> 100 101 37 102.
  Tensor in = Tensor::empty({1, 5}, DType::i32), out = Tensor::empty({1, 3}, DType::i32);
  const std::vector<int64_t> second = {1};
  train->fill(second, in, out);
  BOOST_TEST((std::vector<int32_t>(in.i32(), in.i32() + 5) == std::vector<int32_t>{100, 101, 37, 102, 1}));
}

BOOST_AUTO_TEST_CASE(malformed_rows_name_file_and_line) {
  TempDir dir;
  const std::string file = (dir.path / "bad.csv").string();
  Seq2SeqOptions o;
  o.path = file;
  auto message = [&](const std::string& text) {
    write_file(file, text);
    return error_of([&] { load_seq2seq(o, true); });
  };
  const std::string at = "seq2seq data " + file + ":";
  BOOST_TEST(message("text,headline\na,b\n\"open, never closed\nc\n") ==
             at + "3: a quoted field is not closed before the end of the file");
  BOOST_TEST(message("text,headline\r\na,b,c\r\n") == at + "2: 3 fields, the header has 2");
  BOOST_TEST(message("text,headline\n\"a\nb\",c\nd\n") == at + "4: 1 field, the header has 2");
  BOOST_TEST(message("text,headline\n\"a\"b,c\n") ==
             at + "2: text after a closing quote (a quote inside a quoted field is written \"\")");
  BOOST_TEST(message("\n\ntext,title\na,b\n") == at + "3: no column \"headline\" in the header (columns: text, title)");
  BOOST_TEST(message("text,headline,text\na,b,c\n") == at + "1: column \"text\" twice in the header");
  BOOST_TEST(message("") == "seq2seq data " + file + ": no rows");
  BOOST_TEST(message("text,headline\n") == "seq2seq data " + file + ": no rows");
  BOOST_TEST(message("text,headline\n,a\nb,\n") ==
             "seq2seq data " + file + ": no rows with a source and a target (2 read, all empty)");
}

// The FSDP tutorial's WikiHow text (HF's wikihow loader, then its clean_text), on CSV and JSON lines.
BOOST_AUTO_TEST_CASE(wikihow_clean_up) {
  TempDir dir;
  const std::string csv = (dir.path / "wikihowAll.csv").string();
  write_file(csv,
             "headline,title,text\n"
             "\"\nBe first.,\nBe second.\",How to,\" First paragraph.\n,Second \"\"quoted\"\" ``part``..\n\n,"
             "Example of text: end. \"\n"
             "A long summary here,Too short,short\n"        // headline >= 0.75 x text: dropped
             "\"\"\"\",Empty headline,x y z abc def ghi\n"  // the headline cleans to nothing: dropped
             "\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9,Code points,abcdefghij\n");  // 5 < 0.75 x 10 (not bytes)
  Seq2SeqOptions o;
  o.path = csv;
  o.clean = TextClean::wikihow;
  o.eval_fraction = 0.5;
  auto train = load_seq2seq(o, true), eval = load_seq2seq(o, false);
  using Texts = std::vector<std::pair<std::string, std::string>>;
  BOOST_TEST((texts(*train) == Texts{{"First paragraph.Second quoted part. end.", "Be first.Be second."}}));
  BOOST_TEST((texts(*eval) == Texts{{"abcdefghij", "\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9"}}));
  const std::string jsonl = (dir.path / "pairs.jsonl").string();
  write_file(jsonl, "{\"text\": \"Example of Summary: a \\\"b\\\"\\n c d e f g h\", \"headline\": \" ``x``.,y \"}\n");
  o.path = jsonl;
  o.eval_fraction = 0;
  BOOST_TEST((texts(*load_seq2seq(o, true)) == Texts{{" a b c d e f g h", "x.y"}}));
  o.clean = TextClean::none;
  BOOST_TEST((texts(*load_seq2seq(o, true)) == Texts{{"Example of Summary: a \"b\"\n c d e f g h", " ``x``.,y "}}));
}

// Labels -100 after eos (HF's way, the default) or pad 0 counted by the loss (the tutorial's).
BOOST_AUTO_TEST_CASE(loss_on_padding_labels_pad) {
  TempDir dir;
  const std::string file = (dir.path / "pairs.csv").string();
  write_file(file, "text,headline\nab,x\nabc,xyzw\n");
  Seq2SeqOptions o;
  o.path = file;
  o.source_len = 4;
  o.target_len = 4;
  o.eval_fraction = 0;
  const std::vector<int64_t> idx = {0, 1};
  auto labels = [&](const Dataset& ds) {
    Tensor in = Tensor::empty({2, 4}, DType::i32), out = Tensor::empty({2, 4}, DType::i32);
    ds.fill(idx, in, out);
    return std::vector<int32_t>(out.i32(), out.i32() + 8);
  };
  auto hf = load_seq2seq(o, true);
  BOOST_TEST(labels(*hf) == (std::vector<int32_t>{123, 1, -100, -100, 123, 124, 125, 1}),
             boost::test_tools::per_element());
  BOOST_TEST(hf->loss_elements(idx) == 6);
  o.loss_on_padding = true;
  auto tutorial = load_seq2seq(o, true);
  BOOST_TEST(labels(*tutorial) == (std::vector<int32_t>{123, 1, 0, 0, 123, 124, 125, 1}),
             boost::test_tools::per_element());
  BOOST_TEST(tutorial->loss_elements(idx) == 8);
}

// data.eval_path: the training file trains whole, the validation file evaluates whole.
BOOST_AUTO_TEST_CASE(validation_file) {
  TempDir dir;
  const std::string train_file = (dir.path / "train.csv").string(), val_file = (dir.path / "val.jsonl").string();
  write_file(train_file, "text,headline\na,b\nc,d\n");
  write_file(val_file, "{\"text\": \"e\", \"headline\": \"f\"}\n");
  Seq2SeqOptions o;
  o.path = train_file;
  o.eval_path = val_file;
  using Texts = std::vector<std::pair<std::string, std::string>>;
  BOOST_TEST((texts(*load_seq2seq(o, true)) == Texts{{"a", "b"}, {"c", "d"}}));
  BOOST_TEST((texts(*load_seq2seq(o, false)) == Texts{{"e", "f"}}));
  o.eval_path = (dir.path / "missing.csv").string();
  BOOST_TEST(error_of([&] { load_seq2seq(o, false); }) == "seq2seq data " + o.eval_path + ": cannot open");
}

BOOST_AUTO_TEST_SUITE_END()

// SentencePiece through Debian's libsentencepiece: models trained here, in the process, on a
// small generated corpus (tests/reference/check_sentencepiece.py compares the ids with Python's
// sentencepiece and the decoding with HF's T5Tokenizer on a model trained by spm_train).
BOOST_AUTO_TEST_SUITE(sentencepiece)

// A unigram model of ~80 pieces trained on 400 generated lines; `ids` are spm_train's flags.
std::string train_model(const TempDir& dir, const std::string& name, const std::string& ids) {
  const std::string corpus = (dir.path / "corpus.txt").string(), prefix = (dir.path / name).string();
  const char* words[] = {"the", "cat", "sat", "on", "mat", "a", "dog", "ran", "to", "park", "and", "then", "slept"};
  std::string text;
  uint64_t state = 7;
  for (int line = 0; line < 400; ++line) {
    for (int w = 0; w < 8; ++w) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      text += std::string(w ? " " : "") + words[(state >> 33) % 13];
    }
    text += line % 3 ? " .\n" : " , too .\n";
  }
  write_file(corpus, text);
  const auto status = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + corpus + " --model_prefix=" + prefix +
      " --vocab_size=80 --hard_vocab_limit=false --num_threads=1 --minloglevel=2 " + ids);
  BOOST_REQUIRE_MESSAGE(status.ok(), status.ToString());
  return prefix + ".model";
}

constexpr const char* kT5Ids = "--pad_id=0 --eos_id=1 --unk_id=2 --bos_id=-1";

BOOST_AUTO_TEST_CASE(ids_and_decoding) {
  TempDir dir;
  const std::string model = train_model(dir, "t5", kT5Ids);
  sentencepiece::SentencePieceProcessor sp;
  BOOST_REQUIRE(sp.Load(model).ok());
  auto tok = load_sentencepiece(model);
  BOOST_TEST(tok->vocab_size() == sp.GetPieceSize());
  BOOST_TEST(tok->describe() ==
             "sentencepiece " + model + " (" + std::to_string(sp.GetPieceSize()) + " pieces, pad 0, eos 1)");
  const std::string text = "the  cat sat , on the mat .";
  const std::vector<int32_t> ids = tok->encode(text);
  const std::vector<int> expected = sp.EncodeAsIds(text);
  BOOST_TEST(ids == std::vector<int32_t>(expected.begin(), expected.end()), boost::test_tools::per_element());
  BOOST_TEST(ids.size() > 5u);
  // HF's decode(skip_special_tokens=True): whitespace as the normalizer left it, " ," and " ."
  // joined; here up to eos, pad, unk and ids outside the model skipped.
  std::vector<int32_t> generated = {0};
  generated.insert(generated.end(), ids.begin(), ids.begin() + 2);
  generated.insert(generated.end(), {2, 0, -1, 80000});
  generated.insert(generated.end(), ids.begin() + 2, ids.end());
  generated.insert(generated.end(), {1, ids[0], 0, 0});
  BOOST_TEST(tok->decode(generated) == "the cat sat, on the mat.");
  BOOST_TEST(tok->decode(std::vector<int32_t>{}) == "");
  BOOST_TEST(tok->decode(std::vector<int32_t>{1, ids[0]}) == "");
  // Seq2seq rows through it: source ids truncated to S-1 and eos; labels eos then -100.
  const std::string file = (dir.path / "pairs.csv").string();
  write_file(file, "text,headline\n\"the cat sat on the mat , and then slept\",a dog\n");
  Seq2SeqOptions o;
  o.path = file;
  o.eval_fraction = 0;
  o.source_len = 6;
  o.target_len = 8;
  o.tokenizer = std::move(tok);
  auto ds = load_seq2seq(o, true);
  BOOST_TEST(ds->tokenizer() == o.tokenizer.get());
  BOOST_TEST(ds->num_classes() == sp.GetPieceSize());
  Tensor in = Tensor::empty({1, 6}, DType::i32), out = Tensor::empty({1, 8}, DType::i32);
  const std::vector<int64_t> first = {0};
  ds->fill(first, in, out);
  std::vector<int> source = sp.EncodeAsIds("the cat sat on the mat , and then slept"), target = sp.EncodeAsIds("a dog");
  BOOST_REQUIRE(source.size() > 5u);
  BOOST_REQUIRE(target.size() < 7u);
  source.resize(5);
  source.push_back(1);
  target.push_back(1);
  target.resize(8, -100);
  BOOST_TEST(std::vector<int32_t>(in.i32(), in.i32() + 6) == std::vector<int32_t>(source.begin(), source.end()),
             boost::test_tools::per_element());
  BOOST_TEST(std::vector<int32_t>(out.i32(), out.i32() + 8) == std::vector<int32_t>(target.begin(), target.end()),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(bad_model_files) {
  TempDir dir;
  const std::string missing = (dir.path / "missing.model").string();
  BOOST_TEST(error_of([&] { load_sentencepiece(missing); }) == "sentencepiece model " + missing + ": cannot open");
  BOOST_TEST(error_of([&] { load_tokenizer(missing); }) == "sentencepiece model " + missing + ": cannot open");
  const std::string empty = (dir.path / "empty.model").string();
  write_file(empty, "");
  BOOST_TEST(error_of([&] { load_sentencepiece(empty); }) == "sentencepiece model " + empty + ": empty file");
  const std::string text = (dir.path / "text.model").string();
  write_file(text, "not a model\n");
  BOOST_TEST(error_of([&] {
               load_sentencepiece(text);
             }).starts_with("sentencepiece model " + text + ": not a SentencePiece model ("));
  // spm_train's own defaults (unk 0, bos 1, eos 2, no pad) are not T5's.
  const std::string plain = train_model(dir, "plain", "");
  BOOST_TEST(error_of([&] { load_sentencepiece(plain); }) ==
             "sentencepiece model " + plain +
                 ": pad id none, eos id 2, unk id 0, bos id 1; T5 needs pad 0 and eos 1 (spm_train --pad_id=0 "
                 "--eos_id=1 --unk_id=2 --bos_id=-1)");
  BOOST_TEST(load_tokenizer("")->describe() == "bytes (ByT5 ids: byte + 3, pad 0, eos 1)");
}

BOOST_AUTO_TEST_SUITE_END()

// Causal-LM data: run_clm.py's packing ([bos] + ids per row, blocks of seq_len, the remainder
// dropped, labels shifted with -100 last), SFT's masked prompts, padded or packed, and bad rows.
BOOST_AUTO_TEST_SUITE(causal_lm)

// The (inputs, targets) of samples `idx` as flat vectors.
std::pair<std::vector<int32_t>, std::vector<int32_t>> samples(const Dataset& ds, const std::vector<int64_t>& idx) {
  const int64_t L = ds.input_shape()[0], n = static_cast<int64_t>(idx.size());
  Tensor in = Tensor::empty({n, L}, DType::i32), out = Tensor::empty({n, L}, DType::i32);
  ds.fill(idx, in, out);
  return {std::vector<int32_t>(in.i32(), in.i32() + n * L), std::vector<int32_t>(out.i32(), out.i32() + n * L)};
}

BOOST_AUTO_TEST_CASE(pretraining_packs_rows_as_run_clm) {
  TempDir dir;
  const std::string file = (dir.path / "corpus.txt").string();
  // Rows are lines with their "\n": "ab\n", "\n", "cde\n", "f\n", and the last row evaluates
  // (floor(5 * 0.2) = 1): "gh\n".
  write_file(file, "ab\n\ncde\nf\ngh\n");
  CausalLmOptions o;
  o.path = file;
  o.seq_len = 4;
  o.eval_fraction = 0.2;
  auto train = load_causal_lm(o, true);
  // bos 1, bytes + 3: [1 100 101 13] [1 13] [1 102 103 104 13] [1 105 13] -> 14 tokens, 3 blocks.
  BOOST_TEST(train->tokens() == 14);
  BOOST_REQUIRE(train->size() == 3);
  BOOST_TEST(train->input_shape() == (Shape{4}));
  BOOST_TEST(train->num_classes() == 259);
  const auto [in, target] = samples(*train, {0, 2});
  BOOST_TEST(in == (std::vector<int32_t>{1, 100, 101, 13, 103, 104, 13, 1}), boost::test_tools::per_element());
  BOOST_TEST(target == (std::vector<int32_t>{100, 101, 13, -100, 104, 13, 1, -100}), boost::test_tools::per_element());
  const std::vector<int64_t> both = {0, 1};
  BOOST_TEST(train->loss_elements(both) == 6);  // seq_len - 1 each
  BOOST_TEST(train->prompt_tokens(1) == 0);
  BOOST_TEST(train->tokenizer()->decode(std::vector<int32_t>{1, 100, 101, 2, 102}) == "ab");
  // The eval row alone: [1 106 107 13] is one block.
  auto eval = load_causal_lm(o, false);
  BOOST_REQUIRE(eval->size() == 1);
  BOOST_TEST(samples(*eval, {0}).first == (std::vector<int32_t>{1, 106, 107, 13}), boost::test_tools::per_element());
  // JSON lines: the field, other fields ignored; blank lines separate nothing.
  const std::string jsonl = (dir.path / "docs.JSONL").string();
  write_file(jsonl, "{\"text\": \"xy\", \"id\": 3}\n\n{\"text\": \"\"}\n{\"text\": \"zz\"}\n{\"text\": \"e\"}\n");
  o.path = jsonl;
  o.eval_fraction = 0.25;
  auto docs = load_causal_lm(o, true);  // [1 123 124] [1] [1 125 125] -> 7 tokens, 1 block
  BOOST_REQUIRE(docs->size() == 1);
  BOOST_TEST(samples(*docs, {0}).first == (std::vector<int32_t>{1, 123, 124, 1}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(sft_masks_the_prompt_padded_or_packed) {
  TempDir dir;
  const std::string file = (dir.path / "pairs.jsonl").string();
  write_file(file,
             "{\"q\": \"ab\", \"a\": \"c\"}\n"
             "{\"q\": \"abcdef\", \"a\": \"g\"}\n"  // the prompt fills seq_len: dropped when padded
             "{\"q\": \"\", \"a\": \"xyz\"}\n"
             "{\"q\": \"e\", \"a\": \"f\"}\n");
  CausalLmOptions o;
  o.path = file;
  o.seq_len = 5;
  o.eval_fraction = 0.25;
  o.sft = true;
  o.prompt = "q";
  o.response = "a";
  auto padded = load_causal_lm(o, true);
  // [1 100 101 | 102 2]: labels on 102 and eos; [1 | 123 124 125 2]: on the response and eos.
  BOOST_REQUIRE(padded->size() == 2);
  BOOST_TEST(padded->dropped_samples() == 1);
  const auto [in, target] = samples(*padded, {0, 1});
  BOOST_TEST(in == (std::vector<int32_t>{1, 100, 101, 102, 2, 1, 123, 124, 125, 2}), boost::test_tools::per_element());
  BOOST_TEST(target == (std::vector<int32_t>{-100, -100, 102, 2, -100, 123, 124, 125, 2, -100}),
             boost::test_tools::per_element());
  const std::vector<int64_t> both = {0, 1};
  BOOST_TEST(padded->loss_elements(both) == 6);
  BOOST_TEST(padded->prompt_tokens(0) == 3);
  BOOST_TEST(padded->prompt_tokens(1) == 1);
  // The eval row, shorter than seq_len: padded with eos, -100 past its end.
  auto eval = load_causal_lm(o, false);
  const auto [ein, etarget] = samples(*eval, {0});
  BOOST_TEST(ein == (std::vector<int32_t>{1, 104, 105, 2, 2}), boost::test_tools::per_element());
  BOOST_TEST(etarget == (std::vector<int32_t>{-100, 105, 2, -100, -100}), boost::test_tools::per_element());
  // Packed: 5 + 9 + 5 = 19 tokens -> 3 blocks of 5; the second lies inside the long prompt
  // ([1 100 101 102 103]: no label): dropped; the third ends the long example and starts the next
  // with its bos, whose prompt label is not counted.
  o.pack = true;
  auto packed = load_causal_lm(o, true);
  BOOST_TEST(packed->dropped_samples() == 1);
  BOOST_REQUIRE(packed->size() == 2);
  const auto [pin, ptarget] = samples(*packed, {0, 1});
  BOOST_TEST(pin == (std::vector<int32_t>{1, 100, 101, 102, 2, 104, 105, 106, 2, 1}), boost::test_tools::per_element());
  BOOST_TEST(ptarget == (std::vector<int32_t>{-100, -100, 102, 2, -100, -100, 106, 2, -100, -100}),
             boost::test_tools::per_element());
  BOOST_TEST(packed->loss_elements(both) == 4);
}

BOOST_AUTO_TEST_CASE(bad_input_names_file_and_line) {
  TempDir dir;
  const std::string file = (dir.path / "bad.jsonl").string();
  CausalLmOptions o;
  o.path = file;
  o.seq_len = 4;
  auto message = [&](const std::string& text) {
    write_file(file, text);
    return error_of([&] { load_causal_lm(o, true); });
  };
  BOOST_TEST(message("{\"text\": \"a\"}\n\n[1]\n") == "causal_lm data " + file + ":3: not a JSON object");
  BOOST_TEST(message("{\"txt\": \"a\"}\n") == "causal_lm data " + file + ":1: no field \"text\"");
  BOOST_TEST(message("{\"text\": 7}\n") == "causal_lm data " + file + ":1: field \"text\" is not a string");
  BOOST_TEST(contains(message("{\"text\": \n"), "causal_lm data " + file + ":1: not a JSON object ("));
  BOOST_TEST(message("\n \n") == "causal_lm data " + file + ": no rows (every file is empty, blank or binary)");
  o.eval_fraction = 0.5;
  BOOST_TEST(message("{\"text\": \"a\"}\n{\"text\": \"b\"}\n") ==
             "causal_lm data " + file + " (train rows): 2 tokens, fewer than seq_len 4: no block of training data");
  BOOST_TEST(message("{\"text\": \"a\"}\n") == "causal_lm data " + file +
                                                   ": 1 rows split with eval_fraction 0.5 leave 1 train and 0 eval "
                                                   "rows; need at least 1 of each");
  o.sft = true;
  BOOST_TEST(message("{\"prompt\": \"a\"}\n") == "causal_lm data " + file + ":1: no field \"response\"");
  const std::string text = (dir.path / "plain.txt").string();
  write_file(text, "a\nb\n");
  o.path = text;
  BOOST_TEST(error_of([&] { load_causal_lm(o, true); }) ==
             "causal_lm data " + text +
                 ": data.sft needs JSON lines ({\"prompt\": ..., \"response\": ...} per line, in a file named *.jsonl "
                 "or *.json)");
  o.sft = false;
  o.seq_len = 1;
  BOOST_TEST(error_of([&] { load_causal_lm(o, true); }) ==
             "causal_lm data " + text + ": seq_len must be at least 2, got 1");
  o.seq_len = 4;
  o.path = (dir.path / "missing").string();
  BOOST_TEST(error_of([&] { load_causal_lm(o, true); }) == "causal_lm data " + o.path + ": not found");
  const std::string binary = (dir.path / "bin.txt").string();
  write_file(binary, std::string("a\0b", 3));
  o.path = binary;
  BOOST_TEST(error_of([&] { load_causal_lm(o, true); }) ==
             "causal_lm data " + binary + ": a binary file (it holds a NUL byte)");
}

// Llama's ids from a SentencePiece model (spm_train's defaults: unk 0, bos 1, eos 2), checked
// against the model's config, and decoding without T5's clean-up.
BOOST_AUTO_TEST_CASE(llama_sentencepiece) {
  TempDir dir;
  // The sentencepiece suite's trainer, reached by its name.
  const std::string model = sentencepiece::train_model(dir, "llama", "");
  auto tok = load_sentencepiece(model, TokenStyle::llama, 1, 2);
  BOOST_TEST(tok->bos_id() == 1);
  BOOST_TEST(tok->eos_id() == 2);
  BOOST_TEST(contains(tok->describe(), "pieces, bos 1, eos 2)"));
  sentencepiece::SentencePieceProcessor sp;
  BOOST_REQUIRE(sp.Load(model).ok());
  const std::vector<int> ids = sp.EncodeAsIds("the cat sat , on the mat .");
  BOOST_TEST(tok->decode(std::vector<int32_t>(ids.begin(), ids.end())) == "the cat sat , on the mat .");
  BOOST_TEST(error_of([&] { load_sentencepiece(model, TokenStyle::llama, 1, 3); }) ==
             "sentencepiece model " + model +
                 ": bos id 1, eos id 2; the model's config says bos_token_id 1 and eos_token_id 3");
  BOOST_TEST(make_byte_tokenizer(TokenStyle::llama)->describe() == "bytes (ids byte + 3, unk 0, bos 1, eos 2)");
}

BOOST_AUTO_TEST_SUITE_END()
