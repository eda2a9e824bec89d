#pragma once
// JSON-lines metrics (one object per line, rank 0 writes) and the human progress output.
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tensor/device.h"  // AllocatorStats
#include "tensor/memory.h"

namespace fsdp {

// A JSON object built field by field (nlohmann's values and escaping: invalid UTF-8 in a string is
// replaced, not thrown). num() keeps 9 significant digits (exact for f32), non-finite numbers are
// null (JSON has no NaN). text() is one line with ", " and ": " between fields, as the metrics
// files and traces have always been written (and tests and jobs/ scripts grep them).
class JsonLine {
 public:
  JsonLine& num(const std::string& key, double value);
  JsonLine& integer(const std::string& key, int64_t value);
  JsonLine& str(const std::string& key, const std::string& value);
  JsonLine& boolean(const std::string& key, bool value);
  JsonLine& object(const std::string& key, const JsonLine& value);
  JsonLine& exact(const std::string& key, double value);                         // every digit (trace timestamps)
  JsonLine& numbers(const std::string& key, const std::vector<double>& values);  // arrays, exact
  JsonLine& integers(const std::string& key, const std::vector<int64_t>& values);
  std::string text() const;

 private:
  nlohmann::ordered_json obj_ = nlohmann::ordered_json::object();
};

JsonLine mem_peaks_json(const MemoryTracker& mem);  // {"params": N, ..., "total": N}
// The caching allocator's memory (device runs): {"allocated": N, "peak_allocated": N,
// "reserved": N, "peak_reserved": N}, PyTorch's memory_allocated/reserved and their max_ forms.
JsonLine allocator_json(const AllocatorStats& stats);

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
