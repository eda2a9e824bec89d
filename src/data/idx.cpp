// Fashion-MNIST from the gzipped IDX files. The files are decoded once at load; the pixels stay
// as bytes (47 MB for train instead of 188 MB of floats) and fill() maps them through a 256-entry
// table holding exactly the floats torchvision's ToTensor()+Normalize would produce.
#include <zlib.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "data/data.h"
#include "tensor/error.h"

namespace fsdp {

namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // u8 data, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // u8 data, 1 dimension
constexpr int64_t kRows = 28, kCols = 28, kPixelCount = kRows * kCols;
constexpr int64_t kImagesHeaderBytes = 16, kLabelsHeaderBytes = 8;
constexpr int64_t kClasses = 10;
constexpr const char* kInstallHint = "install the Debian package dataset-fashion-mnist";

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw Error("Fashion-MNIST: " + path + ": " + problem);
}

std::vector<uint8_t> read_gz(const std::string& path) {
  std::error_code ignored;  // an unreadable path is reported by gzopen below
  if (!std::filesystem::exists(path, ignored) && !ignored) fail(path, std::string("file not found; ") + kInstallHint);
  errno = 0;
  const std::unique_ptr<gzFile_s, int (*)(gzFile)> file(gzopen(path.c_str(), "rb"), gzclose);
  if (!file) fail(path, std::string("cannot open: ") + (errno ? std::strerror(errno) : "out of memory"));
  gzbuffer(file.get(), 1 << 18);

  std::vector<uint8_t> bytes;
  constexpr size_t kChunkBytes = 1 << 20;
  for (;;) {
    size_t used = bytes.size();
    bytes.resize(used + kChunkBytes);
    int got = gzread(file.get(), bytes.data() + used, kChunkBytes);
    bytes.resize(used + static_cast<size_t>(got > 0 ? got : 0));
    if (got <= 0) break;
  }
  // gzread reports a stream cut short as a plain end of file (0); only gzerror tells them apart.
  int code = Z_OK;
  std::string message = gzerror(file.get(), &code);
  if (message.starts_with(path + ": ")) message.erase(0, path.size() + 2);  // zlib prefixes it
  if (code != Z_OK) fail(path, "gzip data is corrupt or truncated (" + message + ")");
  return bytes;
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

std::string hex32(uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", value);
  return text;
}

// Checks the header and the payload length; returns the sample count.
int64_t check_idx(const std::string& path, const std::vector<uint8_t>& bytes, uint32_t magic, int64_t header_bytes,
                  int64_t sample_bytes, const char* what) {
  const int64_t size_bytes = static_cast<int64_t>(bytes.size());
  if (size_bytes < header_bytes)
    fail(path, "truncated: " + std::to_string(size_bytes) + " bytes, shorter than the " + std::to_string(header_bytes) +
                   "-byte IDX header");
  uint32_t found = be32(bytes.data());
  if (found != magic) fail(path, "bad IDX magic " + hex32(found) + ", expected " + hex32(magic) + " (" + what + ")");
  int64_t count = be32(bytes.data() + 4);
  if (count == 0) fail(path, std::string("contains no ") + what);
  if (magic == kImagesMagic) {
    int64_t rows = be32(bytes.data() + 8), cols = be32(bytes.data() + 12);
    if (rows != kRows || cols != kCols)
      fail(path, "images are " + std::to_string(rows) + "x" + std::to_string(cols) + ", expected 28x28");
  }
  int64_t want_bytes = count * sample_bytes, have_bytes = size_bytes - header_bytes;
  if (have_bytes < want_bytes)
    fail(path, "truncated: " + std::to_string(count) + " " + what + " need " + std::to_string(want_bytes) +
                   " bytes of data, the file has " + std::to_string(have_bytes));
  if (have_bytes > want_bytes)
    fail(path, std::to_string(have_bytes - want_bytes) + " unexpected bytes after the last of " +
                   std::to_string(count) + " " + what);
  return count;
}

class FashionMnist final : public Dataset {
 public:
  FashionMnist(std::vector<uint8_t> image_file, std::vector<int32_t> labels)
      : image_file_(std::move(image_file)), labels_(std::move(labels)) {
    for (int p = 0; p < 256; ++p)  // float32 throughout, in torchvision's order of operations
      table_[p] = (static_cast<float>(p) / 255.0f - 0.2860f) / 0.3530f;
  }
  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  Shape input_shape() const override { return {1, kRows, kCols}; }
  DType input_dtype() const override { return DType::f32; }
  Shape target_shape() const override { return {}; }
  int64_t num_classes() const override { return kClasses; }

  void fill(std::span<const int64_t> indices, Tensor& inputs, Tensor& targets) const override {
    check_fill(indices, inputs, targets);
    float* out = inputs.f32();
    int32_t* labels = targets.i32();
    const uint8_t* pixels = image_file_.data() + kImagesHeaderBytes;
    for (size_t k = 0; k < indices.size(); ++k) {
      const uint8_t* src = pixels + indices[k] * kPixelCount;
      float* dst = out + static_cast<int64_t>(k) * kPixelCount;
      for (int64_t j = 0; j < kPixelCount; ++j) dst[j] = table_[src[j]];
      labels[k] = labels_[indices[k]];
    }
  }

 private:
  std::vector<uint8_t> image_file_;  // the whole decoded file, header included: no 47 MB copy
  std::vector<int32_t> labels_;
  std::array<float, 256> table_{};
};

}  // namespace

std::unique_ptr<Dataset> load_fashion_mnist(const std::string& dir, bool train) {
  std::error_code error;
  if (!std::filesystem::is_directory(dir, error))
    throw Error("Fashion-MNIST: directory " + dir + " not found; " + kInstallHint);
  const std::string prefix = dir + "/" + (train ? "train" : "t10k");
  const std::string images_path = prefix + "-images-idx3-ubyte.gz";
  const std::string labels_path = prefix + "-labels-idx1-ubyte.gz";

  std::vector<uint8_t> label_file = read_gz(labels_path);
  int64_t label_count = check_idx(labels_path, label_file, kLabelsMagic, kLabelsHeaderBytes, 1, "labels");
  std::vector<uint8_t> image_file = read_gz(images_path);
  int64_t image_count = check_idx(images_path, image_file, kImagesMagic, kImagesHeaderBytes, kPixelCount, "images");
  if (image_count != label_count)
    fail(images_path, "has " + std::to_string(image_count) + " images but " + labels_path + " has " +
                          std::to_string(label_count) + " labels");

  std::vector<int32_t> labels(static_cast<size_t>(label_count));
  for (int64_t i = 0; i < label_count; ++i) {
    labels[i] = label_file[kLabelsHeaderBytes + i];
    if (labels[i] >= kClasses)
      fail(labels_path, "label " + std::to_string(labels[i]) + " of sample " + std::to_string(i) + " is outside 0..9");
  }
  return std::make_unique<FashionMnist>(std::move(image_file), std::move(labels));
}

}  // namespace fsdp
