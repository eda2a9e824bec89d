#pragma once
// PyTorch's bf16 activations, in memory. Under fsdp.mixed_precision.compute: param_dtype every
// value a forward keeps for its backward is already a bf16 (or f16) value held in an f32 tensor
// (RunCtx::round rounded it), so holding it in bf16 loses nothing. The stash records each buffer
// RunCtx::round rounds during a training forward. When an FSDP unit's forward ends (Layer::forward
// of a hooked module) it packs every buffer recorded since the previous unit's end, except the
// unit's output (the next unit's input, read at once; packed at the next unit's end). Nothing
// unpacks them in bulk: each buffer widens itself back to f32 when its first reader asks
// (Buffer::data), so a unit's backward holds in f32 only what its layers have reached so far, and
// a reader that takes the bf16 values as they are (a Linear's dW GEMM at matmul_precision medium,
// Buffer::packed_data) never widens them at all. So the forward's activations wait for their
// backward at half the bytes, as PyTorch's bf16 tensors do. The last unit's (the root's) are never
// packed: its backward follows at once.
//
// A buffer read again before its unit's backward (T5's encoder output, which every decoder block
// reads) unpacks itself on access too: a pass more, never a wrong value. A recorded buffer written
// again after its rounding would be packed rounded; no layer does that (test_plan's
// saved_activations_in_bf16_same_bits_less_memory trains every model with and without the stash
// and compares bits). fsdp.mixed_precision.saved_activations: f32 turns it off (f32 activations).
#include <cstddef>
#include <memory>
#include <unordered_set>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace fsdp {

class ActivationStash {
 public:
  explicit ActivationStash(DType dtype) : dtype_(dtype) {}
  ~ActivationStash() = default;  // holds weak handles only: what is packed stays with its owners
  ActivationStash(const ActivationStash&) = delete;
  ActivationStash& operator=(const ActivationStash&) = delete;
  ActivationStash(ActivationStash&&) = delete;
  ActivationStash& operator=(ActivationStash&&) = delete;

  // Around each micro-batch: the forward records and packs; the backward records nothing.
  void begin_forward();
  void begin_backward();
  // RunCtx::round's outputs: an f32 tensor whose every value is one of dtype's.
  void record(const Tensor& t);
  void end_unit_forward(const Tensor& output);
  // Bytes the packing saved (f32 bytes - packed bytes), summed over this stash's life: the tests'
  // proof that it packs at all.
  size_t saved_bytes() const { return saved_bytes_; }

 private:
  using Held = std::vector<std::weak_ptr<Buffer>>;
  DType dtype_;
  bool recording_ = false;
  Held pending_;
  std::unordered_set<const Buffer*> pending_set_;  // record's duplicates (a buffer rounded twice)
  size_t saved_bytes_ = 0;
};

}  // namespace fsdp
