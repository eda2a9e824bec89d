#include <algorithm>
#include <cmath>
#include <limits>

#include "nn/layers.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace fsdp {

MultiheadAttention::MultiheadAttention(const std::string& name, int64_t C, int64_t heads)
    : Layer(name, "MultiheadAttention"),
      // xavier_uniform_ on (3C, C): bound sqrt(6 / (fan_in + fan_out)) = sqrt(6 / (C + 3C)).
      in_proj_weight(add_param("in_proj_weight", {3 * C, C},
                               {ParamInit::Kind::uniform, -std::sqrt(6.0f / (4.0f * static_cast<float>(C))),
                                std::sqrt(6.0f / (4.0f * static_cast<float>(C)))})),
      in_proj_bias(add_param("in_proj_bias", {3 * C}, {ParamInit::Kind::constant, 0.0f, 0.0f})),
      out_proj(add_child<Linear>(child_name("out_proj"), C, C)),
      C_(C),
      H_(heads) {
  if (C % heads != 0)
    throw Error(name + ": d_model " + std::to_string(C) + " not divisible by heads " + std::to_string(heads));
  // torch.nn.MultiheadAttention._reset_parameters zeroes out_proj.bias.
  out_proj.bias->init = {ParamInit::Kind::constant, 0.0f, 0.0f};
}

const Tensor& MultiheadAttention::forward(RunCtx& ctx, const Tensor& x) {
  x_ = x;
  int64_t B = x.dim(0), T = x.dim(1), C = C_, hd = C_ / H_;
  ensure(qkv_, {B, T, 3 * C}, DType::f32, MemCategory::activations, ctx.mem);
  ensure(att_, {B, H_, T, T}, DType::f32, MemCategory::activations, ctx.mem);
  ensure(y_, {B, T, C}, DType::f32, MemCategory::activations, ctx.mem);
  ops::linear_forward(qkv_.f32(), x.f32(), in_proj_weight.data, in_proj_bias.data, B * T, C, 3 * C);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  float* qkv = qkv_.f32();
  float* att = att_.f32();
  float* y = y_.f32();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H_; ++h) {
      const float* q = qkv + b * T * 3 * C + h * hd;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* P = att + (b * H_ + h) * T * T;
      // S (T, T) = scale * q k^T; only j <= i is used (causal).
      ops::gemm(false, true, T, T, hd, scale, q, 3 * C, k, 3 * C, 0.0f, P, T);
#pragma omp parallel for if (T * T > (1 << 14))
      for (int64_t i = 0; i < T; ++i) {
        float* row = P + i * T;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j <= i; ++j) mx = std::max(mx, row[j]);
        float sum = 0.0f;
        for (int64_t j = 0; j <= i; ++j) {
          row[j] = std::exp(row[j] - mx);
          sum += row[j];
        }
        float inv = 1.0f / sum;
        for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
        for (int64_t j = i + 1; j < T; ++j) row[j] = 0.0f;
      }
      // y_h (T, hd) = P (T, T) @ v (T, hd), written into y's head columns.
      ops::gemm(false, false, T, hd, T, 1.0f, P, T, v, 3 * C, 0.0f, y + b * T * C + h * hd, C);
    }
  }
  return out_proj.forward(ctx, y_);
}

const Tensor& MultiheadAttention::backward(RunCtx& ctx, const Tensor& dy) {
  int64_t B = x_.dim(0), T = x_.dim(1), C = C_, hd = C_ / H_;
  const Tensor& dyh = out_proj.backward(ctx, dy);  // (B, T, C), heads side by side
  ensure(dqkv_, {B, T, 3 * C}, DType::f32, MemCategory::activations, ctx.mem);
  ensure(dp_, {T, T}, DType::f32, MemCategory::activations, ctx.mem);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* qkv = qkv_.f32();
  const float* att = att_.f32();
  const float* g = dyh.f32();
  float* dqkv = dqkv_.f32();
  float* dP = dp_.f32();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H_; ++h) {
      const float* q = qkv + b * T * 3 * C + h * hd;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkv + b * T * 3 * C + h * hd;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* P = att + (b * H_ + h) * T * T;
      const float* gy = g + b * T * C + h * hd;
      // dv (T, hd) = P^T @ gy ; dP (T, T) = gy @ v^T
      ops::gemm(true, false, T, hd, T, 1.0f, P, T, gy, C, 0.0f, dv, 3 * C);
      ops::gemm(false, true, T, T, hd, 1.0f, gy, C, v, 3 * C, 0.0f, dP, T);
      // Softmax backward, folded with the scale: dS = scale * P * (dP - sum_j P dP).
#pragma omp parallel for if (T * T > (1 << 14))
      for (int64_t i = 0; i < T; ++i) {
        const float* pr = P + i * T;
        float* dr = dP + i * T;
        float dot = 0.0f;
        for (int64_t j = 0; j <= i; ++j) dot += pr[j] * dr[j];
        for (int64_t j = 0; j <= i; ++j) dr[j] = scale * pr[j] * (dr[j] - dot);
        for (int64_t j = i + 1; j < T; ++j) dr[j] = 0.0f;
      }
      // dq = dS @ k ; dk = dS^T @ q
      ops::gemm(false, false, T, hd, T, 1.0f, dP, T, k, 3 * C, 0.0f, dq, 3 * C);
      ops::gemm(true, false, T, hd, T, 1.0f, dP, T, q, 3 * C, 0.0f, dk, 3 * C);
    }
  }
  float* dx = nullptr;
  if (need_input_grad) {
    ensure(dx_, x_.shape(), DType::f32, MemCategory::activations, ctx.mem);
    dx = dx_.f32();
  }
  ops::linear_backward(dx, in_proj_weight.grad, in_proj_bias.grad, dqkv, x_.f32(), in_proj_weight.data, B * T, C,
                       3 * C);
  return dx_;
}

TransformerBlock::TransformerBlock(const std::string& name, int64_t C, int64_t heads, int64_t d_ff)
    : Layer(name, "TransformerBlock"),
      ln1(add_child<LayerNorm>(child_name("ln1"), C)),
      attn(add_child<MultiheadAttention>(child_name("attn"), C, heads)),
      ln2(add_child<LayerNorm>(child_name("ln2"), C)),
      fc1(add_child<Linear>(child_name("fc1"), C, d_ff)),
      act(add_child<GELU>(child_name("act"))),
      fc2(add_child<Linear>(child_name("fc2"), d_ff, C)) {}

const Tensor& TransformerBlock::forward(RunCtx& ctx, const Tensor& x) {
  ensure(a_, x.shape(), DType::f32, MemCategory::activations, ctx.mem);
  ensure(y_, x.shape(), DType::f32, MemCategory::activations, ctx.mem);
  int64_t n = x.numel();
  ops::add(a_.f32(), x.f32(), attn.forward(ctx, ln1.forward(ctx, x)).f32(), n);
  ops::add(y_.f32(), a_.f32(), fc2.forward(ctx, act.forward(ctx, fc1.forward(ctx, ln2.forward(ctx, a_)))).f32(), n);
  return y_;
}

const Tensor& TransformerBlock::backward(RunCtx& ctx, const Tensor& dy) {
  ensure(da_, dy.shape(), DType::f32, MemCategory::activations, ctx.mem);
  ensure(dx_, dy.shape(), DType::f32, MemCategory::activations, ctx.mem);
  int64_t n = dy.numel();
  ops::add(da_.f32(), dy.f32(), ln2.backward(ctx, fc1.backward(ctx, act.backward(ctx, fc2.backward(ctx, dy)))).f32(),
           n);
  ops::add(dx_.f32(), da_.f32(), ln1.backward(ctx, attn.backward(ctx, da_)).f32(), n);
  return dx_;
}

}  // namespace fsdp

// ---- Memory plan: the ensure() calls and held references of forward/backward above ----

namespace fsdp {

PlanTensor MultiheadAttention::plan_forward(ActivationPlan& p, const RunCtx& ctx, const PlanTensor& x) const {
  p.hold(this, &x_, x);
  int64_t B = x.shape.at(0), T = x.shape.at(1);
  p.ensure(this, &qkv_, {B, T, 3 * C_}, DType::f32);
  p.ensure(this, &att_, {B, H_, T, T}, DType::f32);
  p.ensure(this, &y_, {B, T, C_}, DType::f32);
  return out_proj.plan_forward(p, ctx, p.get(&y_));
}

PlanTensor MultiheadAttention::plan_backward(ActivationPlan& p, const RunCtx& ctx, const PlanTensor& dy) const {
  const Shape xs = p.get(&x_).shape;
  int64_t B = xs.at(0), T = xs.at(1);
  out_proj.plan_backward(p, ctx, dy);
  p.ensure(this, &dqkv_, {B, T, 3 * C_}, DType::f32);
  p.ensure(this, &dp_, {T, T}, DType::f32);
  if (need_input_grad) p.ensure(this, &dx_, xs, DType::f32);
  return p.get(&dx_);
}

PlanTensor TransformerBlock::plan_forward(ActivationPlan& p, const RunCtx& ctx, const PlanTensor& x) const {
  p.ensure(this, &a_, x.shape, DType::f32);
  p.ensure(this, &y_, x.shape, DType::f32);
  attn.plan_forward(p, ctx, ln1.plan_forward(p, ctx, x));
  fc2.plan_forward(p, ctx, act.plan_forward(p, ctx, fc1.plan_forward(p, ctx, ln2.plan_forward(p, ctx, p.get(&a_)))));
  return p.get(&y_);
}

PlanTensor TransformerBlock::plan_backward(ActivationPlan& p, const RunCtx& ctx, const PlanTensor& dy) const {
  p.ensure(this, &da_, dy.shape, DType::f32);
  p.ensure(this, &dx_, dy.shape, DType::f32);
  ln2.plan_backward(p, ctx, fc1.plan_backward(p, ctx, act.plan_backward(p, ctx, fc2.plan_backward(p, ctx, dy))));
  ln1.plan_backward(p, ctx, attn.plan_backward(p, ctx, p.get(&da_)));
  return p.get(&dx_);
}

}  // namespace fsdp
