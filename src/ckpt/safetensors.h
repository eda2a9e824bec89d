#pragma once
// Hugging Face safetensors files, read and written without holding a whole tensor.
//
// A file is an 8-byte little-endian header length N, N bytes of JSON
//   {"NAME": {"dtype": "F32", "shape": [d0, d1], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// then the data: every tensor row-major little-endian at [begin, end) of the bytes after the
// header. A checked file's tensors tile the data exactly: no gaps, no overlaps, nothing past its
// end (the rule of the safetensors library itself). A model folder holds `model.safetensors`, or
// `model.safetensors.index.json` ({"weight_map": {NAME: FILE}}) and the files it names.
//
// Every problem is an Error with one line naming the file and what is wrong; nothing here reads
// more than the header until asked for a range, and a range is one pread of exactly its bytes.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace fsdp {

// One tensor of a file as its header describes it.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;        // as written: F32, BF16, F16, I64, ...
  int64_t element_bytes{};  // of that dtype
  Shape shape;
  uint64_t begin_bytes{}, end_bytes{};  // data_offsets: relative to the end of the header
  int64_t numel() const { return shape_numel(shape); }
};

// The f32/bf16/f16 DType of a safetensors dtype name; Error naming the tensor otherwise.
DType safetensors_float_dtype(const SafetensorsTensor& t, const std::string& what);

// One or more safetensors files opened for reading (a file, or a model folder), with one index
// of every tensor by name.
class SafetensorsReader {
 public:
  // path: a .safetensors file, or a folder with model.safetensors or (when it has none, as
  // transformers decides) model.safetensors.index.json.
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader() = default;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  struct Entry {
    const SafetensorsTensor* tensor;
    int file;  // index into files()
  };
  const std::map<std::string, Entry>& tensors() const { return by_name_; }
  const Entry* find(const std::string& name) const;
  const std::string& file_path(int file) const { return files_[file]->path; }
  size_t file_count() const { return files_.size(); }

  // Elements [offset, offset + count) of a tensor (F32, BF16 or F16) as f32 in `out`: one
  // pread of exactly those bytes (through `scratch` for the 16-bit types).
  void read_f32(const Entry& e, int64_t offset, int64_t count, float* out);
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  struct File {  // owns its descriptor (read-only: closing loses nothing)
    File() = default;
    ~File();
    File(const File&) = delete;
    File& operator=(const File&) = delete;
    std::string path;
    int fd = -1;
    uint64_t data_begin = 0;                 // 8 + the header's length
    std::vector<SafetensorsTensor> tensors;  // in data order
  };
  void open_file(const std::string& path);

  std::vector<std::unique_ptr<File>> files_;  // stable addresses: entries point into headers
  std::map<std::string, Entry> by_name_;
  std::vector<uint16_t> scratch_;
  uint64_t bytes_read_ = 0;
};

// Writes one safetensors file: the header from the full tensor list first (so every tensor's
// place is known), then any ranges in any order, from any number of processes that each open
// the same file (`create` on exactly one of them, before the others open it).
class SafetensorsWriter {
 public:
  struct Spec {
    std::string name;
    Shape shape;
  };
  // The header of `specs` (in this order in the data) stored as `dtype` (f32, bf16 or f16).
  SafetensorsWriter(std::vector<Spec> specs, DType dtype, const std::map<std::string, std::string>& metadata);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Creates (truncates) path, writes the header and sizes the file; or opens it for writing.
  void create(const std::string& path);
  void open(const std::string& path);
  // Elements [offset, offset + count) of tensor `index` (in specs order) from f32 values.
  void write_f32(size_t index, int64_t offset, int64_t count, const float* values);
  // fsync and close; Error when either fails.
  void close();
  uint64_t file_bytes() const { return data_begin_ + data_bytes_; }

 private:
  std::vector<Spec> specs_;
  DType dtype_;
  std::string header_;  // JSON, padded with spaces to a multiple of 8 (as the library writes it)
  std::vector<uint64_t> begin_bytes_;
  uint64_t data_begin_ = 0, data_bytes_ = 0;
  std::string path_;
  int fd_ = -1;
  std::vector<char> scratch_;
};

}  // namespace fsdp
