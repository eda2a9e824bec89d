#include "nn/loss.h"

#include <string>

#include "tensor/error.h"

namespace fsdp {

namespace {
// The count always; the values only for host memory: for device targets the trainer checks the
// batch on the host before upload (a device-side check would cost a host wait per step).
void check_targets(const Tensor& targets, int64_t rows, int64_t C, std::optional<int32_t> ignore = std::nullopt) {
  if (targets.numel() != rows)
    throw Error("loss: " + std::to_string(targets.numel()) + " targets for " + std::to_string(rows) + " rows");
  if (targets.device() != Device::cpu) return;
  const int32_t* t = targets.i32();
  for (int64_t r = 0; r < rows; ++r)
    if ((t[r] < 0 || t[r] >= C) && t[r] != ignore)
      throw Error("loss: target " + std::to_string(t[r]) + " outside [0, " + std::to_string(C) + ")");
}
}  // namespace

double NLLLoss::forward(RunCtx& ctx, const Tensor& logp, const Tensor& targets) {
  int64_t C = logp.shape().back(), rows = logp.numel() / C;
  check_targets(targets, rows, C);
  targets_ = targets;
  shape_ = logp.shape();
  ctx.kernels().nll_sum(logp.f32(), targets.i32(), rows, C, &last_sum_, &last_correct_);  // waits
  return last_sum_ / ctx.loss_normalizer;
}

const Tensor& NLLLoss::backward(RunCtx& ctx) {
  ctx.ensure(grad_, shape_, DType::f32);
  int64_t C = shape_.back(), rows = grad_.numel() / C;
  float g = static_cast<float>(-ctx.loss_scale / ctx.loss_normalizer);
  ctx.kernels().nll_backward(grad_.f32(), targets_.i32(), rows, C, g);  // zeros but the targets
  ctx.round(grad_);  // the model's output gradient, in the dtype the model computes in
  return grad_;
}

double CrossEntropyLoss::forward(RunCtx& ctx, const Tensor& logits, const Tensor& targets) {
  int64_t C = logits.shape().back(), rows = logits.numel() / C;
  check_targets(targets, rows, C, ignore_index_);
  targets_ = targets;
  logits_ = logits;
  ctx.ensure(lse_, {rows}, DType::f32);
  ctx.kernels().cross_entropy_sum(logits.f32(), targets.i32(), rows, C, lse_.f32(), &last_sum_,
                                  &last_correct_);  // waits
  return last_sum_ / ctx.loss_normalizer;
}

const Tensor& CrossEntropyLoss::backward(RunCtx& ctx) {
  int64_t C = logits_.shape().back(), rows = logits_.numel() / C;
  float inv_n = static_cast<float>(ctx.loss_scale / ctx.loss_normalizer);
  float* d = logits_.f32();  // in place: the logits are read for the last time here
  ctx.kernels().cross_entropy_backward_logits(d, d, lse_.f32(), targets_.i32(), rows, C, inv_n);
  // The loss is f32 (log-softmax of the rounded logits, as torchtitan's logits.float()); the
  // gradient entering the model is rounded to its compute dtype, as .float()'s backward does.
  ctx.round(logits_);
  lse_ = Tensor();
  return logits_;
}

}  // namespace fsdp
