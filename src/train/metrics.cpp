#include "train/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "tensor/error.h"

namespace fsdp {

namespace {

using Json = nlohmann::ordered_json;

// One line, ", " and ": " between fields; scalars as nlohmann writes them.
void append(std::string& out, const Json& v) {
  if (v.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [key, value] : v.items()) {
      if (!first) out += ", ";
      first = false;
      out += Json(key).dump(-1, ' ', false, Json::error_handler_t::replace) + ": ";
      append(out, value);
    }
    out += '}';
  } else if (v.is_array()) {
    out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i > 0) out += ", ";
      append(out, v[i]);
    }
    out += ']';
  } else {
    out += v.dump(-1, ' ', false, Json::error_handler_t::replace);
  }
}

}  // namespace

JsonLine& JsonLine::num(const std::string& k, double value) {
  if (!std::isfinite(value)) {
    obj_[k] = nullptr;
    return *this;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", value);  // rounded to 9 digits; written shortest
  obj_[k] = std::strtod(buf, nullptr);
  return *this;
}

JsonLine& JsonLine::integer(const std::string& k, int64_t value) {
  obj_[k] = value;
  return *this;
}

JsonLine& JsonLine::str(const std::string& k, const std::string& value) {
  obj_[k] = value;
  return *this;
}

JsonLine& JsonLine::boolean(const std::string& k, bool value) {
  obj_[k] = value;
  return *this;
}

JsonLine& JsonLine::object(const std::string& k, const JsonLine& value) {
  obj_[k] = value.obj_;
  return *this;
}

JsonLine& JsonLine::exact(const std::string& k, double value) {
  obj_[k] = std::isfinite(value) ? Json(value) : Json(nullptr);
  return *this;
}

JsonLine& JsonLine::integers(const std::string& k, const std::vector<int64_t>& values) {
  obj_[k] = values;
  return *this;
}

JsonLine& JsonLine::numbers(const std::string& k, const std::vector<double>& values) {
  obj_[k] = values;
  return *this;
}

std::string JsonLine::text() const {
  std::string out;
  append(out, obj_);
  return out;
}

JsonLine mem_peaks_json(const MemoryTracker& mem) {
  JsonLine j;
  for (size_t c = 0; c < kMemCategoryCount; ++c) {
    auto cat = static_cast<MemCategory>(c);
    j.integer(std::string(mem_category_name(cat)), static_cast<int64_t>(mem.peak_bytes(cat)));
  }
  j.integer("total", static_cast<int64_t>(mem.peak_total_bytes()));
  return j;
}

JsonLine allocator_json(const AllocatorStats& stats) {
  return JsonLine()
      .integer("allocated", static_cast<int64_t>(stats.allocated_bytes))
      .integer("peak_allocated", static_cast<int64_t>(stats.peak_allocated_bytes))
      .integer("reserved", static_cast<int64_t>(stats.reserved_bytes))
      .integer("peak_reserved", static_cast<int64_t>(stats.peak_reserved_bytes));
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
