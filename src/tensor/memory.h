#pragma once
// Byte accounting by category. Every tensor buffer is charged to one category on allocation and
// credited on free; the peaks are what the metrics report and what FSDP's memory plan is
// checked against. One tracker per process, owned by whoever runs (the trainer, a test) and
// passed down explicitly: no global.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace fsdp {

enum class MemCategory : uint8_t { params, grads, optim, gathered, activations, comm, other };
inline constexpr size_t kMemCategoryCount = 7;
std::string_view mem_category_name(MemCategory category);

class MemoryTracker {
 public:
  void on_alloc(MemCategory category, size_t bytes);
  void on_free(MemCategory category, size_t bytes);

  size_t current_bytes(MemCategory category) const { return current_[index(category)]; }
  size_t peak_bytes(MemCategory category) const { return peak_[index(category)]; }
  size_t current_total_bytes() const { return current_total_; }
  size_t peak_total_bytes() const { return peak_total_; }
  // Starts a new measurement window: peaks become the current values.
  void reset_peaks();

 private:
  static size_t index(MemCategory c) { return static_cast<size_t>(c); }
  std::array<size_t, kMemCategoryCount> current_{};
  std::array<size_t, kMemCategoryCount> peak_{};
  size_t current_total_ = 0;
  size_t peak_total_ = 0;
};

}  // namespace fsdp
