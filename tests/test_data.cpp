#define BOOST_TEST_MODULE data
#include <boost/test/unit_test.hpp>

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
