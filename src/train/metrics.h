#pragma once
// JSON-lines metrics (one object per line, rank 0 writes) and the human progress output.
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "tensor/memory.h"

namespace fsdp {

// A flat JSON object built field by field; numbers print with 9 significant digits (exact for
// f32), non-finite numbers as null (JSON has no NaN).
class JsonLine {
 public:
  JsonLine& num(const std::string& key, double value);
  JsonLine& integer(const std::string& key, int64_t value);
  JsonLine& str(const std::string& key, const std::string& value);
  JsonLine& raw(const std::string& key, const std::string& json);
  std::string text() const { return "{" + body_ + "}"; }

 private:
  std::string body_;
};

std::string mem_peaks_json(const MemoryTracker& mem);  // {"params": N, ..., "total": N}

class MetricsFile {
 public:
  // "" = disabled; Error if it cannot be opened. append: a resumed run continues the file.
  explicit MetricsFile(const std::string& path, bool append = false);
  ~MetricsFile();
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;
  void write(const JsonLine& line);  // Error if the line cannot be written (a full disk)

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace fsdp
