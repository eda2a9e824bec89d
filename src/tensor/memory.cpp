#include "tensor/memory.h"

#include <algorithm>

namespace fsdp {

std::string_view mem_category_name(MemCategory category) {
  switch (category) {
    case MemCategory::params: return "params";
    case MemCategory::grads: return "grads";
    case MemCategory::optim: return "optim";
    case MemCategory::gathered: return "gathered";
    case MemCategory::activations: return "activations";
    case MemCategory::comm: return "comm";
    case MemCategory::other: return "other";
  }
  return "?";
}

void MemoryTracker::on_alloc(MemCategory category, size_t bytes, MemSpace space) {
  size_t i = index(category);
  current_[i] += bytes;
  peak_[i] = std::max(peak_[i], current_[i]);
  current_total_ += bytes;
  peak_total_ = std::max(peak_total_, current_total_);
  const auto s = static_cast<size_t>(space);
  space_current_[s] += bytes;
  space_peak_[s] = std::max(space_peak_[s], space_current_[s]);
}

void MemoryTracker::on_free(MemCategory category, size_t bytes, MemSpace space) {
  current_[index(category)] -= bytes;
  current_total_ -= bytes;
  space_current_[static_cast<size_t>(space)] -= bytes;
}

void MemoryTracker::reset_peaks() {
  peak_ = current_;
  peak_total_ = current_total_;
  space_peak_ = space_current_;
}

}  // namespace fsdp
