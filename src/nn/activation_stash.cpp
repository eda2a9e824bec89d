#include "nn/activation_stash.h"

namespace fsdp {

void ActivationStash::begin_forward() {
  pending_.clear();
  pending_set_.clear();
  recording_ = true;
}

void ActivationStash::begin_backward() {
  // The root's activations (after the last unit's end) stay f32: its backward comes first.
  pending_.clear();
  pending_set_.clear();
  recording_ = false;  // a recomputing forward (activation checkpointing) is read at once
}

void ActivationStash::record(const Tensor& t) {
  if (!recording_ || !t.defined() || t.dtype() != DType::f32) return;
  if (pending_set_.insert(t.storage().get()).second) pending_.push_back(t.storage());
}

void ActivationStash::end_unit_forward(const Tensor& output) {
  if (!recording_) return;
  const Buffer* out = output.defined() ? output.storage().get() : nullptr;
  Held kept_pending;
  for (std::weak_ptr<Buffer>& w : pending_) {
    std::shared_ptr<Buffer> b = w.lock();
    if (!b) continue;  // released already (a checkpointed unit's insides)
    if (b.get() == out) {
      kept_pending.push_back(std::move(w));
      continue;
    }
    if (!b->packed()) {
      b->pack(dtype_);
      saved_bytes_ += b->bytes() / 2;
    }
  }
  pending_ = std::move(kept_pending);
  pending_set_.clear();
  for (const auto& w : pending_)
    if (auto b = w.lock()) pending_set_.insert(b.get());
}

}  // namespace fsdp
