#include "nn/loss.h"

#include <cmath>
#include <string>

#include "tensor/error.h"
#include "tensor/ops.h"

namespace fsdp {

namespace {
void check_targets(const Tensor& targets, int64_t rows, int64_t C) {
  if (targets.numel() != rows)
    throw Error("loss: " + std::to_string(targets.numel()) + " targets for " + std::to_string(rows) + " rows");
  const int32_t* t = targets.i32();
  for (int64_t r = 0; r < rows; ++r)
    if (t[r] < 0 || t[r] >= C)
      throw Error("loss: target " + std::to_string(t[r]) + " outside [0, " + std::to_string(C) + ")");
}

// Sum of -logp[target] and the argmax hits, in double so the sum is independent of batch split.
void nll_sums(const float* logp, const int32_t* t, int64_t rows, int64_t C, double& sum, int64_t& correct) {
  sum = 0.0;
  correct = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logp + r * C;
    sum -= row[t[r]];
    int64_t best = 0;
    for (int64_t c = 1; c < C; ++c)
      if (row[c] > row[best]) best = c;
    correct += best == t[r];
  }
}
}  // namespace

double NLLLoss::forward(RunCtx& ctx, const Tensor& logp, const Tensor& targets) {
  int64_t C = logp.shape().back(), rows = logp.numel() / C;
  check_targets(targets, rows, C);
  targets_ = targets;
  shape_ = logp.shape();
  nll_sums(logp.f32(), targets.i32(), rows, C, last_sum_, last_correct_);
  return last_sum_ / ctx.loss_normalizer;
}

const Tensor& NLLLoss::backward(RunCtx& ctx) {
  ensure(grad_, shape_, DType::f32, MemCategory::activations, ctx.mem);
  grad_.zero();
  int64_t C = shape_.back(), rows = grad_.numel() / C;
  float g = static_cast<float>(-ctx.loss_scale / ctx.loss_normalizer);
  const int32_t* t = targets_.i32();
  float* d = grad_.f32();
  for (int64_t r = 0; r < rows; ++r) d[r * C + t[r]] = g;
  return grad_;
}

double CrossEntropyLoss::forward(RunCtx& ctx, const Tensor& logits, const Tensor& targets) {
  int64_t C = logits.shape().back(), rows = logits.numel() / C;
  check_targets(targets, rows, C);
  targets_ = targets;
  ensure(logp_, logits.shape(), DType::f32, MemCategory::activations, ctx.mem);
  ops::log_softmax_forward(logp_.f32(), logits.f32(), rows, C);
  nll_sums(logp_.f32(), targets.i32(), rows, C, last_sum_, last_correct_);
  return last_sum_ / ctx.loss_normalizer;
}

const Tensor& CrossEntropyLoss::backward(RunCtx& ctx) {
  ensure(grad_, logp_.shape(), DType::f32, MemCategory::activations, ctx.mem);
  int64_t C = logp_.shape().back(), rows = logp_.numel() / C;
  float inv_n = static_cast<float>(ctx.loss_scale / ctx.loss_normalizer);
  const float* lp = logp_.f32();
  const int32_t* t = targets_.i32();
  float* d = grad_.f32();
#pragma omp parallel for
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < C; ++c) d[r * C + c] = std::exp(lp[r * C + c]) * inv_n;
    d[r * C + t[r]] -= inv_n;
  }
  return grad_;
}

}  // namespace fsdp

// ---- Memory plan: the ensure() calls and held references of forward/backward above ----

namespace fsdp {

void NLLLoss::plan_forward(ActivationPlan& p, const PlanTensor& logp, const PlanTensor& targets) const {
  p.hold(this, &targets_, targets);
  p.hold(this, &shape_, {nullptr, logp.shape});
}

PlanTensor NLLLoss::plan_backward(ActivationPlan& p) const {
  return p.ensure(this, &grad_, p.get(&shape_).shape, DType::f32);
}

void CrossEntropyLoss::plan_forward(ActivationPlan& p, const PlanTensor& logits, const PlanTensor& targets) const {
  p.hold(this, &targets_, targets);
  p.ensure(this, &logp_, logits.shape, DType::f32);
}

PlanTensor CrossEntropyLoss::plan_backward(ActivationPlan& p) const {
  return p.ensure(this, &grad_, p.get(&logp_).shape, DType::f32);
}

}  // namespace fsdp
