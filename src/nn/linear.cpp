#include <cmath>

#include "nn/layers.h"
#include "tensor/error.h"

namespace fsdp {

namespace {
ParamInit fan_in_uniform(int64_t fan_in) {
  // kaiming_uniform_(a=sqrt(5)) and PyTorch's bias rule both reduce to U(-1/sqrt(fan_in), +).
  float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
  return {ParamInit::Kind::uniform, -bound, bound};
}
}  // namespace

void linear_backward_saved(RunCtx& ctx, float* dX, float* dW, float* db, const float* dY, const Tensor& x,
                           const float* W, int64_t in, int64_t out) {
  Kernels& kernels = ctx.kernels();
  const int64_t rows = x.numel() / in;
  const Buffer* b = x.storage().get();
  if (kernels.matmul_precision() == MatmulPrecision::medium && b && b->packed_dtype() == DType::bf16) {
    kernels.linear_backward_bf16_x(dX, dW, db, dY, static_cast<const uint16_t*>(b->packed_data()), W, rows, in, out);
    return;
  }
  kernels.linear_backward(dX, dW, db, dY, x.f32(), W, rows, in, out);
}

Linear::Linear(const std::string& name, int64_t in, int64_t out, bool bias)
    : Layer(name, "Linear"), weight(add_param("weight", {out, in}, fan_in_uniform(in))), in_(in), out_(out) {
  if (bias) this->bias = &add_param("bias", {out}, fan_in_uniform(in));
}

const Tensor& Linear::do_forward(RunCtx& ctx, const Tensor& x) {
  if (x.ndim() == 0 || x.shape().back() != in_)
    throw Error(name() + ": input " + shape_str(x.shape()) + " does not end in " + std::to_string(in_));
  x_ = x;
  Shape ys = x.shape();
  ys.back() = out_;
  ctx.ensure(y_, ys, DType::f32);
  ctx.kernels().linear_forward(y_.f32(), x.f32(), weight.data, bias ? bias->data : nullptr, x.numel() / in_, in_, out_);
  ctx.round(y_);
  return y_;
}

const Tensor& Linear::do_backward(RunCtx& ctx, const Tensor& dy) {
  if (need_input_grad) ctx.ensure(dx_, x_.shape(), DType::f32);
  linear_backward_saved(ctx, need_input_grad ? dx_.f32() : nullptr, weight.grad, bias ? bias->grad : nullptr, dy.f32(),
                        x_, weight.data, in_, out_);
  if (need_input_grad) ctx.round(dx_);
  return dx_;
}

LmHead::LmHead(const std::string& name, int64_t C, int64_t V, ParamInit init, Param* tied, float scale)
    : Layer(name, "Linear"), C_(C), V_(V) {
  if (tied) {
    if (tied->shape != Shape{V, C})
      throw Error(name + ": tied weight " + tied->name + " is " + shape_str(tied->shape) + ", not (" +
                  std::to_string(V) + ", " + std::to_string(C) + ")");
    weight_ = tied;
    use_param(*tied);
    scale_ = scale;
  } else {
    weight_ = &add_param("weight", {V, C}, init);
  }
}

const Tensor& LmHead::do_forward(RunCtx& ctx, const Tensor& x) {
  Kernels& kernels = ctx.kernels();
  xs_ = x;
  if (scale_ != 1.0f) {
    ctx.ensure(scaled_, x.shape(), DType::f32);
    kernels.cast(scaled_.raw(), DType::f32, x.raw(), DType::f32, x.numel());
    kernels.scale(scaled_.f32(), scale_, x.numel());
    ctx.round(scaled_);
    xs_ = scaled_;
  }
  Shape ys = x.shape();
  ys.back() = V_;
  ctx.ensure(y_, ys, DType::f32);
  kernels.linear_forward(y_.f32(), xs_.f32(), weight_->data, nullptr, x.numel() / C_, C_, V_);
  ctx.round(y_);
  return y_;
}

const Tensor& LmHead::do_backward(RunCtx& ctx, const Tensor& dy) {
  ctx.ensure(dx_, xs_.shape(), DType::f32);
  linear_backward_saved(ctx, dx_.f32(), weight_->grad, nullptr, dy.f32(), xs_, weight_->data, C_, V_);
  ctx.round(dx_);
  if (scale_ != 1.0f) {
    ctx.kernels().scale(dx_.f32(), scale_, dx_.numel());
    ctx.round(dx_);  // the backward of x * scale: its own op
  }
  return dx_;
}

Conv2d::Conv2d(const std::string& name, int64_t in, int64_t out, int64_t kernel, int64_t padding)
    : Layer(name, "Conv2d"),
      weight(add_param("weight", {out, in, kernel, kernel}, fan_in_uniform(in * kernel * kernel))),
      bias(add_param("bias", {out}, fan_in_uniform(in * kernel * kernel))),
      in_(in),
      out_(out),
      k_(kernel),
      pad_(padding) {}

const Tensor& Conv2d::do_forward(RunCtx& ctx, const Tensor& x) {
  if (x.ndim() != 4 || x.dim(1) != in_)
    throw Error(name() + ": input " + shape_str(x.shape()) + " is not (B, " + std::to_string(in_) + ", H, W)");
  x_ = x;
  int64_t B = x.dim(0), H = x.dim(2), W = x.dim(3);
  int64_t OH = H + 2 * pad_ - k_ + 1, OW = W + 2 * pad_ - k_ + 1, P = OH * OW;
  int64_t K = in_ * k_ * k_;
  ctx.ensure(col_, {K, B * P}, DType::f32);
  ctx.ensure(ybuf_, {out_, B * P}, DType::f32);
  ctx.ensure(y_, {B, out_, OH, OW}, DType::f32);
  Kernels& kernels = ctx.kernels();
  kernels.im2col(x.f32(), col_.f32(), B, in_, H, W, k_, pad_, OH, OW);
  // ybuf (out, B*P) = W (out, K) @ col (K, B*P): the whole batch in one GEMM.
  kernels.gemm(false, false, out_, B * P, K, 1.0f, weight.data, K, col_.f32(), B * P, 0.0f, ybuf_.f32(), B * P);
  kernels.conv_bias_permute(y_.f32(), ybuf_.f32(), bias.data, B, out_, P);
  ctx.round(y_);  // torch's conv2d adds its bias inside: one rounding
  return y_;
}

const Tensor& Conv2d::do_backward(RunCtx& ctx, const Tensor& dy) {
  int64_t B = x_.dim(0), H = x_.dim(2), W = x_.dim(3);
  int64_t OH = dy.dim(2), OW = dy.dim(3), P = OH * OW, K = in_ * k_ * k_;
  // dyt (out, B*P): channel-major so both gradients are single GEMMs.
  ctx.ensure(dyt_, {out_, B * P}, DType::f32);
  Kernels& kernels = ctx.kernels();
  kernels.conv_grad_permute(dyt_.f32(), bias.grad, dy.f32(), B, out_, P);
  // dW (out, K) += dyt (out, B*P) @ col^T (B*P, K)
  kernels.gemm(false, true, out_, K, B * P, 1.0f, dyt_.f32(), B * P, col_.f32(), B * P, 1.0f, weight.grad, K);
  if (!need_input_grad) return dx_;
  ctx.ensure(dcol_, {K, B * P}, DType::f32);
  // dcol (K, B*P) = W^T (K, out) @ dyt (out, B*P)
  kernels.gemm(true, false, K, B * P, out_, 1.0f, weight.data, K, dyt_.f32(), B * P, 0.0f, dcol_.f32(), B * P);
  ctx.ensure(dx_, x_.shape(), DType::f32);
  kernels.col2im(dcol_.f32(), dx_.f32(), B, in_, H, W, k_, pad_, OH, OW);  // zeroes dx first
  ctx.round(dx_);
  return dx_;
}

}  // namespace fsdp
