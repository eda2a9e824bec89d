#include "ckpt/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <utility>

#include "tensor/error.h"

namespace fsdp {

namespace {

using Json = nlohmann::json;

// Every dtype the safetensors format defines, with its element size: a name outside this list
// is a damaged (or future) file; one inside it that is not a float is a file for another model.
constexpr std::pair<const char*, int64_t> kDTypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
    {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8},
};

// A header longer than this is refused before it is read (the safetensors library's limit).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// No tensor of more dimensions or elements is real: refused as damaged (as the HDF5 loader does).
constexpr size_t kMaxDims = 8;
constexpr int64_t kMaxNumel = int64_t{1} << 40;

// A message from pieces: in loops, where clang-tidy flags chains of + (each makes a temporary).
std::string text(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view p : parts) out += p;
  return out;
}

std::string range_str(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

// A JSON number that is a non-negative integer (safetensors writes shapes and offsets so).
bool as_u64(const Json& v, uint64_t* out) {
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) return false;
  *out = v.get<uint64_t>();
  return true;
}

SafetensorsTensor parse_entry(const std::string& name, const Json& v, const std::string& what) {
  const std::string where = what + ": tensor " + name;
  if (!v.is_object()) throw Error(where + ": not a JSON object");
  SafetensorsTensor t;
  t.name = name;
  const auto dtype = v.find("dtype"), shape = v.find("shape"), offsets = v.find("data_offsets");
  if (dtype == v.end() || !dtype->is_string()) throw Error(where + ": no dtype string");
  t.dtype = dtype->get<std::string>();
  for (const auto& [n, bytes] : kDTypes)
    if (t.dtype == n) t.element_bytes = bytes;
  if (t.element_bytes == 0) throw Error(where + ": unknown dtype '" + t.dtype + "'");
  if (shape == v.end() || !shape->is_array()) throw Error(where + ": no shape list");
  if (shape->size() > kMaxDims) throw Error(where + ": " + std::to_string(shape->size()) + " dimensions");
  int64_t numel = 1;
  for (const Json& d : *shape) {
    uint64_t n = 0;
    if (!as_u64(d, &n)) throw Error(where + ": shape holds " + d.dump() + ", not a dimension");
    if (n > static_cast<uint64_t>(kMaxNumel) || (n > 0 && numel > kMaxNumel / static_cast<int64_t>(n)))
      throw Error(where + ": shape has more than 2^40 elements");
    numel *= static_cast<int64_t>(n);
    t.shape.push_back(static_cast<int64_t>(n));
  }
  if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2 || !as_u64((*offsets)[0], &t.begin_bytes) ||
      !as_u64((*offsets)[1], &t.end_bytes) || t.begin_bytes > t.end_bytes)
    throw Error(where + ": data_offsets is not [begin, end] with begin <= end");
  const uint64_t need = static_cast<uint64_t>(numel) * static_cast<uint64_t>(t.element_bytes);
  if (t.end_bytes - t.begin_bytes != need)
    throw Error(where + ": data_offsets " + range_str(t.begin_bytes, t.end_bytes) + " hold " +
                std::to_string(t.end_bytes - t.begin_bytes) + " bytes, its " + t.dtype + " shape " +
                shape_str(t.shape) + " needs " + std::to_string(need));
  return t;
}

// Transfers exactly `bytes` at `offset` with io (pread or pwrite); false at end of file. EINTR
// and short transfers are retried.
template <class Byte, class Io>
bool transfer_all(Io io, int fd, Byte* p, uint64_t bytes, uint64_t offset) {
  while (bytes > 0) {
    const ssize_t n = io(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return true;
}

bool pread_all(int fd, void* dst, uint64_t bytes, uint64_t offset) {
  return transfer_all(::pread, fd, static_cast<char*>(dst), bytes, offset);
}

bool pwrite_all(int fd, const void* src, uint64_t bytes, uint64_t offset) {
  return transfer_all(::pwrite, fd, static_cast<const char*>(src), bytes, offset);
}

Json read_json_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open (" + std::strerror(errno) + ")");
  struct stat st {};
  std::string text;
  const bool ok = fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) <= kMaxHeaderBytes &&
                  (text.resize(static_cast<size_t>(st.st_size)), pread_all(fd, text.data(), text.size(), 0));
  ::close(fd);
  if (!ok) throw Error(path + ": cannot read (or over 100 MB)");
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    throw Error(path + ": bad JSON (" + e.what() + ")");
  }
}

// The tensors a header's JSON describes, in data order, checked against `data_bytes` of data.
// `what` starts every message (the file's path).
std::vector<SafetensorsTensor> parse_header(std::string_view json, uint64_t data_bytes, const std::string& what) {
  Json j;
  try {
    j = Json::parse(json);
  } catch (const Json::exception& e) {  // parse_error; out_of_range for a number like 1e999
    throw Error(what + ": bad header JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw Error(what + ": the header is not a JSON object");
  std::vector<SafetensorsTensor> tensors;
  for (const auto& [key, value] : j.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) throw Error(what + ": __metadata__ is not a JSON object");
      for (const auto& [k, v] : value.items())
        if (!v.is_string()) throw Error(text({what, ": __metadata__ value of '", k, "' is not a string"}));
      continue;
    }
    tensors.push_back(parse_entry(key, value, what));
  }
  // The tensors must tile the data: sorted by place, each begins where the one before ended.
  std::sort(tensors.begin(), tensors.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    return std::tie(a.begin_bytes, a.end_bytes, a.name) < std::tie(b.begin_bytes, b.end_bytes, b.name);
  });
  uint64_t cursor = 0;
  const SafetensorsTensor* previous = nullptr;
  for (const SafetensorsTensor& t : tensors) {
    if (t.end_bytes > data_bytes)
      throw Error(what + ": tensor " + t.name + " at data_offsets " + range_str(t.begin_bytes, t.end_bytes) +
                  " runs past the end of the data (" + std::to_string(data_bytes) + " bytes; truncated file?)");
    if (t.begin_bytes < cursor)
      throw Error(what + ": tensors " + previous->name + " " + range_str(previous->begin_bytes, previous->end_bytes) +
                  " and " + t.name + " " + range_str(t.begin_bytes, t.end_bytes) + " overlap");
    if (t.begin_bytes > cursor)
      throw Error(what + ": a gap of " + std::to_string(t.begin_bytes - cursor) + " bytes in the data before tensor " +
                  t.name + " (bytes " + range_str(cursor, t.begin_bytes) + " belong to no tensor)");
    cursor = t.end_bytes;
    previous = &t;
  }
  if (cursor != data_bytes)
    throw Error(what + ": " + std::to_string(data_bytes - cursor) + " bytes after the last tensor's data (bytes " +
                range_str(cursor, data_bytes) + " belong to no tensor)");
  return tensors;
}

}  // namespace

DType safetensors_float_dtype(const SafetensorsTensor& t, const std::string& what) {
  if (t.dtype == "F32") return DType::f32;
  if (t.dtype == "BF16") return DType::bf16;
  if (t.dtype == "F16") return DType::f16;
  throw Error(what + ": tensor " + t.name + " has dtype " + t.dtype + " (F32, BF16 or F16 expected)");
}

SafetensorsReader::SafetensorsReader(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    open_file(path);
  } else {
    const std::string index = (fs::path(path) / "model.safetensors.index.json").string();
    const std::string single = (fs::path(path) / "model.safetensors").string();
    // transformers' order: the single file when there is one, else the index.
    if (fs::exists(single, ec)) {
      open_file(single);
    } else if (!fs::exists(index, ec)) {
      throw Error(path + ": no model.safetensors or model.safetensors.index.json in this folder");
    } else {
      const Json j = read_json_file(index);
      const auto map = j.is_object() ? j.find("weight_map") : j.end();
      if (map == j.end() || !map->is_object()) throw Error(index + ": no weight_map object");
      std::map<std::string, std::set<std::string>> names_of_file;
      for (const auto& [name, file] : map->items()) {
        if (!file.is_string()) throw Error(text({index, ": weight_map entry of ", name, " is not a file name"}));
        const std::string f = file.get<std::string>();
        if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
          throw Error(text({index, ": weight_map puts ", name, " in '", f, "', not a file name in this folder"}));
        names_of_file[f].insert(name);
      }
      for (const auto& [file, names] : names_of_file) {
        open_file((fs::path(path) / file).string());
        const File& opened = *files_.back();
        std::set<std::string> held;
        for (const SafetensorsTensor& t : opened.tensors) held.insert(t.name);
        for (const std::string& n : names)
          if (!held.contains(n))
            throw Error(text({index, ": weight_map puts ", n, " in ", file, ", which does not hold it"}));
        for (const std::string& n : held)
          if (!names.contains(n))
            throw Error(text({opened.path, ": holds tensor ", n, ", which ", index, " does not list"}));
      }
    }
  }
  for (size_t f = 0; f < files_.size(); ++f)
    for (const SafetensorsTensor& t : files_[f]->tensors)
      if (!by_name_.emplace(t.name, Entry{&t, static_cast<int>(f)}).second)
        throw Error(files_[f]->path + ": tensor " + t.name + " is also in " + file_path(by_name_.at(t.name).file));
}

SafetensorsReader::File::~File() {
  if (fd >= 0) ::close(fd);
}

void SafetensorsReader::open_file(const std::string& path) {
  File& f = *files_.emplace_back(std::make_unique<File>());
  f.path = path;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) throw Error(path + ": cannot open (" + std::strerror(errno) + ")");
  struct stat st {};
  if (fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode)) throw Error(path + ": not a regular file");
  const auto file_bytes = static_cast<uint64_t>(st.st_size);
  unsigned char len[8];
  if (file_bytes < 8 || !pread_all(f.fd, len, 8, 0))
    throw Error(path + ": truncated: " + std::to_string(file_bytes) + " bytes, less than the 8-byte header length");
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = header_bytes << 8 | len[i];
  if (header_bytes > kMaxHeaderBytes)
    throw Error(path + ": header length " + std::to_string(header_bytes) + " bytes is over the 100 MB limit");
  if (8 + header_bytes > file_bytes)
    throw Error(path + ": truncated: the header needs " + std::to_string(8 + header_bytes) + " bytes, the file has " +
                std::to_string(file_bytes));
  std::string json(header_bytes, '\0');
  if (!pread_all(f.fd, json.data(), header_bytes, 8)) throw Error(path + ": cannot read the header");
  f.data_begin = 8 + header_bytes;
  f.tensors = parse_header(json, file_bytes - f.data_begin, path);
  bytes_read_ += 8 + header_bytes;
}

const SafetensorsReader::Entry* SafetensorsReader::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &it->second;
}

void SafetensorsReader::read_f32(const Entry& e, int64_t offset, int64_t count, float* out) {
  const File& f = *files_[e.file];
  const SafetensorsTensor& t = *e.tensor;
  const DType dtype = safetensors_float_dtype(t, f.path);
  if (offset < 0 || count < 0 || offset + count > t.numel())
    throw Error(f.path + ": tensor " + t.name + ": elements " + range_str(offset, offset + count) + " asked of " +
                std::to_string(t.numel()));
  const uint64_t at = f.data_begin + t.begin_bytes + static_cast<uint64_t>(offset) * t.element_bytes;
  const uint64_t bytes = static_cast<uint64_t>(count) * t.element_bytes;
  void* dst = out;
  if (dtype != DType::f32) {
    scratch_.resize(static_cast<size_t>(count));
    dst = scratch_.data();
  }
  if (!pread_all(f.fd, dst, bytes, at))
    throw Error(f.path + ": cannot read tensor " + t.name + " (the file shrank or cannot be read)");
  bytes_read_ += bytes;
  if (dtype != DType::f32) convert(dst, dtype, out, DType::f32, static_cast<size_t>(count));
}

SafetensorsWriter::SafetensorsWriter(std::vector<Spec> specs, DType dtype,
                                     const std::map<std::string, std::string>& metadata)
    : specs_(std::move(specs)), dtype_(dtype) {
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16)
    throw Error("safetensors: writes f32, bf16 or f16, not " + std::string(dtype_name(dtype)));
  const char* name = dtype == DType::f32 ? "F32" : dtype == DType::bf16 ? "BF16" : "F16";
  // ordered_json keeps the tensors in data order (readers do not care; people reading it do).
  nlohmann::ordered_json j;
  if (!metadata.empty()) j["__metadata__"] = metadata;
  for (const Spec& s : specs_) {
    const uint64_t bytes = static_cast<uint64_t>(shape_numel(s.shape)) * dtype_bytes(dtype);
    begin_bytes_.push_back(data_bytes_);
    j[s.name] = {{"dtype", name}, {"shape", s.shape}, {"data_offsets", {data_bytes_, data_bytes_ + bytes}}};
    data_bytes_ += bytes;
  }
  header_ = j.dump();
  header_.append((8 - header_.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  data_begin_ = 8 + header_.size();
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);  // only after a failure: close() reports its own errors
}

void SafetensorsWriter::create(const std::string& path) {
  path_ = path;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(path + ": cannot create (" + std::strerror(errno) + ")");
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(header_.size() >> (8 * i));
  if (!pwrite_all(fd_, len, 8, 0) || !pwrite_all(fd_, header_.data(), header_.size(), 8) ||
      ftruncate(fd_, static_cast<off_t>(file_bytes())) != 0)
    throw Error(path + ": cannot write (" + std::strerror(errno) + ")");
}

void SafetensorsWriter::open(const std::string& path) {
  path_ = path;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd_ < 0) throw Error(path + ": cannot open for writing (" + std::strerror(errno) + ")");
}

void SafetensorsWriter::write_f32(size_t index, int64_t offset, int64_t count, const float* values) {
  const size_t element = dtype_bytes(dtype_);
  const uint64_t at = data_begin_ + begin_bytes_.at(index) + static_cast<uint64_t>(offset) * element;
  const void* src = values;
  if (dtype_ != DType::f32) {
    scratch_.resize(static_cast<size_t>(count) * element);
    convert(values, DType::f32, scratch_.data(), dtype_, static_cast<size_t>(count));
    src = scratch_.data();
  }
  if (!pwrite_all(fd_, src, static_cast<uint64_t>(count) * element, at))
    throw Error(path_ + ": cannot write tensor " + specs_[index].name + " (" + std::strerror(errno) + ")");
}

void SafetensorsWriter::close() {
  const int fd = std::exchange(fd_, -1);
  const bool synced = fsync(fd) == 0;
  if (::close(fd) != 0 || !synced) throw Error(path_ + ": cannot write (" + std::strerror(errno) + ")");
}

}  // namespace fsdp
