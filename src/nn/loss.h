#pragma once
// Losses as sums over this rank's samples divided by the global batch size (ctx.loss_normalizer),
// so that adding the ranks' values gives exactly PyTorch's reduction='mean' over the global batch.
#include <cstdint>
#include <optional>

#include "nn/module.h"

namespace fsdp {

class Loss {
 public:
  virtual ~Loss() = default;
  // Returns this rank's share of the mean loss; keeps what backward needs.
  virtual double forward(RunCtx& ctx, const Tensor& output, const Tensor& targets) = 0;
  virtual const Tensor& backward(RunCtx& ctx) = 0;
  // Sum of per-sample losses (eval) and count of argmax hits over the last forward.
  double last_sum() const { return last_sum_; }
  int64_t last_correct() const { return last_correct_; }

 protected:
  double last_sum_ = 0.0;
  int64_t last_correct_ = 0;
};

// F.nll_loss on log-probabilities (N, C) with i32 targets (N).
class NLLLoss : public Loss {
 public:
  double forward(RunCtx& ctx, const Tensor& logp, const Tensor& targets) override;
  const Tensor& backward(RunCtx& ctx) override;

 private:
  Tensor targets_, grad_;
  Shape shape_;
};

// F.cross_entropy on logits (..., V) with i32 targets (...): log-softmax fused in. With an
// ignore_index (HF's -100 on padded labels) those targets add nothing to the sum, the count
// of correct ones or the gradient; ctx.loss_normalizer then counts only the others.
// No (..., V) buffer of its own: the forward keeps each row's log-sum-exp, and the backward
// writes the gradient over the logits (the model's output, which nothing reads after the loss):
// two (rows, V) f32 buffers fewer than log-probabilities plus a gradient, the same bits.
class CrossEntropyLoss : public Loss {
 public:
  explicit CrossEntropyLoss(std::optional<int32_t> ignore_index = std::nullopt) : ignore_index_(ignore_index) {}
  double forward(RunCtx& ctx, const Tensor& logits, const Tensor& targets) override;
  const Tensor& backward(RunCtx& ctx) override;

 private:
  std::optional<int32_t> ignore_index_;
  Tensor targets_, logits_, lse_;  // lse_ (rows)
};

}  // namespace fsdp
