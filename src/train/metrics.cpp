#include "train/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "tensor/error.h"

namespace fsdp {

namespace {
std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
      continue;
    }
    out += c;
  }
  return out;
}
}  // namespace

JsonLine& JsonLine::num(const std::string& k, double value) {
  if (!std::isfinite(value)) return raw(k, "null");
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", value);
  return raw(k, buf);
}

JsonLine& JsonLine::integer(const std::string& k, int64_t value) { return raw(k, std::to_string(value)); }

JsonLine& JsonLine::str(const std::string& k, const std::string& value) { return raw(k, "\"" + escape(value) + "\""); }

JsonLine& JsonLine::raw(const std::string& k, const std::string& json) {
  if (!body_.empty()) body_ += ", ";
  body_ += "\"" + escape(k) + "\": " + json;
  return *this;
}

std::string mem_peaks_json(const MemoryTracker& mem) {
  JsonLine j;
  for (size_t c = 0; c < kMemCategoryCount; ++c) {
    auto cat = static_cast<MemCategory>(c);
    j.integer(std::string(mem_category_name(cat)), static_cast<int64_t>(mem.peak_bytes(cat)));
  }
  j.integer("total", static_cast<int64_t>(mem.peak_total_bytes()));
  return j.text();
}

MetricsFile::MetricsFile(const std::string& path, bool append) : path_(path) {
  if (path.empty()) return;
  std::error_code ec;  // a missing parent folder is created; failure shows up in fopen below
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!file_) throw Error("output.metrics: cannot open " + path + " (" + std::strerror(errno) + ")");
}

MetricsFile::~MetricsFile() {
  if (file_) (void)std::fclose(file_);  // write() flushed every line and checked it
}

void MetricsFile::write(const JsonLine& line) {
  if (!file_) return;
  // Flushed: a killed job still leaves every finished step on disk. A failed write is an error,
  // not a silent gap in the metrics.
  if (std::fputs((line.text() + "\n").c_str(), file_) < 0 || std::fflush(file_) != 0)
    throw Error("output.metrics: cannot write " + path_ + " (" + std::strerror(errno) + ")");
}

}  // namespace fsdp
