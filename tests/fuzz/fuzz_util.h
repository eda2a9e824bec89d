#pragma once
// Shared by the fuzz targets: a per-process scratch folder (readers take paths, so inputs become
// files), a reader that turns fuzzer bytes into choices, and the one rule every target checks:
// bad input is an fsdp::Error with a message; anything else escapes and libFuzzer reports it.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/error.h"

namespace fuzz {

// A folder of this process's own, on tmpfs when there is one, removed at exit.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::error_code ec;
    std::string base = std::filesystem::is_directory("/dev/shm", ec) && access("/dev/shm", W_OK) == 0
                           ? "/dev/shm"
                           : std::filesystem::temp_directory_path().string();
    std::string templ = base + "/fsdp_fuzz_" + std::to_string(getpid()) + "_XXXXXX";
    if (!mkdtemp(templ.data())) {
      std::perror("fuzz: mkdtemp");
      std::abort();
    }
    return templ;
  }();
  static const struct Remover {
    ~Remover() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } remover;
  return dir;
}

// A fresh empty subfolder of the scratch folder.
inline std::string fresh_dir(const std::string& name) {
  std::string dir = scratch_dir() + "/" + name;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir);
  return dir;
}

inline void write_file(const std::string& path, std::string_view bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    std::perror(path.c_str());
    std::abort();
  }
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  std::fclose(f);
}

// Fuzzer bytes as a stream of choices; reads past the end give zeros.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  bool empty() const { return at_ >= n_; }
  size_t left() const { return n_ - at_; }
  uint8_t u8() { return at_ < n_ ? p_[at_++] : 0; }
  uint16_t u16() { return static_cast<uint16_t>(u8() | (u8() << 8)); }
  uint32_t u32() { return u16() | (static_cast<uint32_t>(u16()) << 16); }
  uint64_t u64() { return u32() | (static_cast<uint64_t>(u32()) << 32); }
  double f64() {
    uint64_t bits = u64();
    double d;
    std::memcpy(&d, &bits, sizeof d);
    return d;
  }
  // Up to `max` bytes, length from one byte.
  std::string str(size_t max = 255) { return bytes(u8() % (max + 1)); }
  std::string bytes(size_t n) {
    n = std::min(n, left());
    std::string s(reinterpret_cast<const char*>(p_ + at_), n);
    at_ += n;
    return s;
  }
  std::string rest() { return bytes(left()); }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[u8() % v.size()];
  }

 private:
  const uint8_t* p_;
  size_t n_, at_ = 0;
};

// Splits on a separator byte (at most `max_parts` parts; the last keeps the rest).
inline std::vector<std::string> split(std::string_view s, char sep, size_t max_parts) {
  std::vector<std::string> parts;
  while (parts.size() + 1 < max_parts) {
    size_t at = s.find(sep);
    if (at == std::string_view::npos) break;
    parts.emplace_back(s.substr(0, at));
    s.remove_prefix(at + 1);
  }
  parts.emplace_back(s);
  return parts;
}

// A property the reader promises failed: print it and abort, so libFuzzer keeps the input.
[[noreturn]] inline void broken(const std::string& what) {
  std::fprintf(stderr, "fuzz: broken promise: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// An fsdp::Error must carry a message.
inline void expect_message(const fsdp::Error& e) {
  if (std::strlen(e.what()) == 0) broken("an fsdp::Error without a message");
}

}  // namespace fuzz
