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

// Where a charged buffer lives: host memory, or a device's (a device run has both: the model on
// the device, batches and staging on the host). The categories count both; the two totals are
// what a node's host memory and a GPU's memory must each hold.
enum class MemSpace : uint8_t { host, device };

class MemoryTracker {
 public:
  void on_alloc(MemCategory category, size_t bytes, MemSpace space = MemSpace::host);
  void on_free(MemCategory category, size_t bytes, MemSpace space = MemSpace::host);

  size_t current_bytes(MemCategory category) const { return current_[index(category)]; }
  size_t peak_bytes(MemCategory category) const { return peak_[index(category)]; }
  size_t current_total_bytes() const { return current_total_; }
  size_t peak_total_bytes() const { return peak_total_; }
  size_t current_bytes(MemSpace space) const { return space_current_[static_cast<size_t>(space)]; }
  size_t peak_bytes(MemSpace space) const { return space_peak_[static_cast<size_t>(space)]; }
  // Starts a new measurement window: peaks become the current values.
  void reset_peaks();

 private:
  static size_t index(MemCategory c) { return static_cast<size_t>(c); }
  std::array<size_t, kMemCategoryCount> current_{};
  std::array<size_t, kMemCategoryCount> peak_{};
  size_t current_total_ = 0;
  size_t peak_total_ = 0;
  std::array<size_t, 2> space_current_{}, space_peak_{};
};

}  // namespace fsdp
