#include "nn/layers.h"
#include "tensor/error.h"
#include "tensor/rng.h"

namespace fsdp {

namespace {
// dx rounded to the pass's compute dtype, then (residual defined) dx += residual, rounded again.
void round_then_add(RunCtx& ctx, const Tensor& dx, const Tensor& residual) {
  ctx.round(dx);
  if (!residual.defined()) return;
  ctx.kernels().add_inplace(dx.f32(), residual.f32(), dx.numel());
  ctx.round(dx);
}
}  // namespace

const Tensor& ReLU::do_forward(RunCtx& ctx, const Tensor& x) {
  ctx.ensure(y_, x.shape(), DType::f32);
  ctx.kernels().relu_forward(y_.f32(), x.f32(), x.numel());
  return y_;
}

const Tensor& ReLU::do_backward(RunCtx& ctx, const Tensor& dy) {
  ctx.ensure(dx_, y_.shape(), DType::f32);
  ctx.kernels().relu_backward(dx_.f32(), dy.f32(), y_.f32(), dy.numel());
  return dx_;
}

const Tensor& GELU::do_forward(RunCtx& ctx, const Tensor& x) {
  x_ = x;
  ctx.ensure(y_, x.shape(), DType::f32);
  if (tanh_)
    ctx.kernels().gelu_tanh_forward(y_.f32(), x.f32(), x.numel());
  else
    ctx.kernels().gelu_forward(y_.f32(), x.f32(), x.numel());
  ctx.round(y_);
  return y_;
}

const Tensor& GELU::do_backward(RunCtx& ctx, const Tensor& dy) {
  ctx.ensure(dx_, x_.shape(), DType::f32);
  if (tanh_)
    ctx.kernels().gelu_tanh_backward(dx_.f32(), dy.f32(), x_.f32(), dy.numel());
  else
    ctx.kernels().gelu_backward(dx_.f32(), dy.f32(), x_.f32(), dy.numel());
  ctx.round(dx_);
  return dx_;
}

const Tensor& SiLU::do_forward(RunCtx& ctx, const Tensor& x) {
  x_ = x;
  ctx.ensure(y_, x.shape(), DType::f32);
  ctx.kernels().silu_forward(y_.f32(), x.f32(), x.numel());
  ctx.round(y_);
  return y_;
}

const Tensor& SiLU::do_backward(RunCtx& ctx, const Tensor& dy) {
  ctx.ensure(dx_, x_.shape(), DType::f32);
  ctx.kernels().silu_backward(dx_.f32(), dy.f32(), x_.f32(), dy.numel());
  ctx.round(dx_);
  return dx_;
}

RMSNorm::RMSNorm(const std::string& name, const std::string& type, int64_t C, float eps, float init)
    : Layer(name, type), weight(add_param("weight", {C}, {ParamInit::Kind::constant, init, 0.0f})), C_(C), eps_(eps) {}

const Tensor& RMSNorm::do_forward(RunCtx& ctx, const Tensor& x) {
  const int64_t rows = x.numel() / C_;
  ctx.ensure(y_, x.shape(), DType::f32);
  ctx.ensure(rstd_, {rows}, DType::f32);
  if (fwd_sum_) {  // forward_adding: the sum is the normalised input
    ctx.kernels().add_rmsnorm_forward(fwd_sum_->f32(), y_.f32(), rstd_.f32(), x.f32(), fwd_residual_.f32(), weight.data,
                                      rows, C_, eps_, ctx.compute_dtype);
    x_ = *fwd_sum_;
    ctx.rounded(x_);  // both stored rounded by the kernel
    ctx.rounded(y_);
    return y_;
  }
  x_ = x;
  ctx.kernels().rmsnorm_forward(y_.f32(), rstd_.f32(), x.f32(), weight.data, rows, C_, eps_);
  ctx.round(y_);
  return y_;
}

namespace {
// sum = x + residual, rounded, then norm.forward(sum); fused into one kernel by the norm when it
// may be (no unit of its own, not checkpointed: `fused`), through set/unset of its pending residual.
template <class Norm, class Arm>
Tensor forward_adding_impl(Norm& norm, RunCtx& ctx, const Tensor& x, const Tensor& residual, Tensor& sum, Arm arm) {
  if (residual.shape() != x.shape())
    throw Error(norm.name() + ": residual " + shape_str(residual.shape()) + " is not the input's " +
                shape_str(x.shape()));
  ctx.ensure(sum, x.shape(), DType::f32);
  if (norm.hooked() || norm.checkpointed()) {
    ctx.kernels().add(sum.f32(), x.f32(), residual.f32(), x.numel());
    ctx.round(sum);
    return norm.forward(ctx, sum);
  }
  arm(&residual, &sum);
  try {
    Tensor y = norm.forward(ctx, x);
    arm(nullptr, nullptr);
    return y;
  } catch (...) {
    arm(nullptr, nullptr);
    throw;
  }
}
}  // namespace

Tensor RMSNorm::forward_adding(RunCtx& ctx, const Tensor& x, const Tensor& residual, Tensor& sum) {
  return forward_adding_impl(*this, ctx, x, residual, sum, [this](const Tensor* r, Tensor* s) {
    fwd_residual_ = r ? *r : Tensor();
    fwd_sum_ = s;
  });
}

Tensor LayerNorm::forward_adding(RunCtx& ctx, const Tensor& x, const Tensor& residual, Tensor& sum) {
  return forward_adding_impl(*this, ctx, x, residual, sum, [this](const Tensor* r, Tensor* s) {
    fwd_residual_ = r ? *r : Tensor();
    fwd_sum_ = s;
  });
}

const Tensor& RMSNorm::do_backward(RunCtx& ctx, const Tensor& dy) {
  ctx.ensure(dx_, x_.shape(), DType::f32);
  if (residual_.defined() && residual_.shape() != x_.shape())
    throw Error(name() + ": residual gradient " + shape_str(residual_.shape()) + " is not the input's " +
                shape_str(x_.shape()));
  const bool add_after = residual_.defined() && ctx.compute_dtype != DType::f32;  // as LayerNorm's
  const float* residual = residual_.defined() && !add_after ? residual_.f32() : nullptr;
  ctx.kernels().rmsnorm_backward(dx_.f32(), residual, weight.grad, dy.f32(), x_.f32(), weight.data, rstd_.f32(),
                                 x_.numel() / C_, C_);
  round_then_add(ctx, dx_, add_after ? residual_ : Tensor());
  return dx_;
}

Tensor RMSNorm::backward_adding(RunCtx& ctx, const Tensor& dy, const Tensor& residual) {
  residual_ = residual;
  try {
    return backward(ctx, dy);  // release_activations, at its end, drops the handle
  } catch (...) {
    residual_ = Tensor();  // a later plain backward must add nothing
    throw;
  }
}

const Tensor& Dropout::do_forward(RunCtx& ctx, const Tensor& x) {
  active_ = ctx.training && ctx.dropout && p_ > 0.0f;
  if (!active_) return x;
  ctx.ensure(mask_, x.shape(), DType::u8);
  ctx.ensure(y_, x.shape(), DType::f32);
  // Key by (seed, step) and stream by this layer's name: sample n's mask is the same on any rank.
  const uint64_t key = ctx.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(ctx.step);
  // Per-sample size from the trailing dims: a rank's share of a short last batch may be empty.
  int64_t B = x.dim(0), per_sample = shape_numel(Shape(x.shape().begin() + 1, x.shape().end()));
  ctx.kernels().dropout_forward(y_.f32(), static_cast<uint8_t*>(mask_.raw()), x.f32(), B, per_sample, p_, key,
                                hash_name(name()), ctx.sample_offset);
  ctx.round(y_);
  return y_;
}

const Tensor& Dropout::do_backward(RunCtx& ctx, const Tensor& dy) {
  if (!active_) return dy;
  ctx.ensure(dx_, dy.shape(), DType::f32);
  ctx.kernels().dropout_backward(dx_.f32(), dy.f32(), static_cast<const uint8_t*>(mask_.raw()), p_, dy.numel());
  ctx.round(dx_);
  return dx_;
}

const Tensor& MaxPool2d::do_forward(RunCtx& ctx, const Tensor& x) {
  if (x.ndim() != 4) throw Error(name() + ": input " + shape_str(x.shape()) + " is not (B, C, H, W)");
  x_shape_ = x.shape();
  Shape ys = {x.dim(0), x.dim(1), x.dim(2) / 2, x.dim(3) / 2};
  ctx.ensure(y_, ys, DType::f32);
  ctx.ensure(argmax_, ys, DType::i32);
  ctx.kernels().maxpool2_forward(y_.f32(), argmax_.i32(), x.f32(), x.dim(0) * x.dim(1), x.dim(2), x.dim(3));
  return y_;
}

const Tensor& MaxPool2d::do_backward(RunCtx& ctx, const Tensor& dy) {
  ctx.ensure(dx_, x_shape_, DType::f32);
  ctx.kernels().maxpool2_backward(dx_.f32(), dy.f32(), argmax_.i32(), x_shape_[0] * x_shape_[1], x_shape_[2],
                                  x_shape_[3]);
  return dx_;
}

const Tensor& Flatten::do_forward(RunCtx&, const Tensor& x) {
  x_shape_ = x.shape();
  y_ = x.view({x.dim(0), shape_numel(Shape(x.shape().begin() + 1, x.shape().end()))});  // B may be 0
  return y_;
}

const Tensor& Flatten::do_backward(RunCtx&, const Tensor& dy) {
  dx_ = dy.view(x_shape_);
  return dx_;
}

const Tensor& LogSoftmax::do_forward(RunCtx& ctx, const Tensor& x) {
  ctx.ensure(y_, x.shape(), DType::f32);
  int64_t C = x.shape().back();
  ctx.kernels().log_softmax_forward(y_.f32(), x.f32(), x.numel() / C, C);
  ctx.round(y_);
  return y_;
}

const Tensor& LogSoftmax::do_backward(RunCtx& ctx, const Tensor& dy) {
  ctx.ensure(dx_, y_.shape(), DType::f32);
  int64_t C = y_.shape().back();
  ctx.kernels().log_softmax_backward(dx_.f32(), dy.f32(), y_.f32(), y_.numel() / C, C);
  ctx.round(dx_);
  return dx_;
}

LayerNorm::LayerNorm(const std::string& name, int64_t C, float eps)
    : Layer(name, "LayerNorm"),
      weight(add_param("weight", {C}, {ParamInit::Kind::constant, 1.0f, 0.0f})),
      bias(add_param("bias", {C}, {ParamInit::Kind::constant, 0.0f, 0.0f})),
      C_(C),
      eps_(eps) {}

const Tensor& LayerNorm::do_forward(RunCtx& ctx, const Tensor& x) {
  if (x.ndim() == 0 || x.shape().back() != C_)
    throw Error(name() + ": input " + shape_str(x.shape()) + " does not end in " + std::to_string(C_));
  int64_t rows = x.numel() / C_;
  ctx.ensure(y_, x.shape(), DType::f32);
  ctx.ensure(mean_, {rows}, DType::f32);
  ctx.ensure(rstd_, {rows}, DType::f32);
  if (fwd_sum_) {  // forward_adding: the sum is the normalised input
    ctx.kernels().add_layernorm_forward(fwd_sum_->f32(), y_.f32(), mean_.f32(), rstd_.f32(), x.f32(),
                                        fwd_residual_.f32(), weight.data, bias.data, rows, C_, eps_, ctx.compute_dtype);
    x_ = *fwd_sum_;
    ctx.rounded(x_);  // both stored rounded by the kernel
    ctx.rounded(y_);
    return y_;
  }
  x_ = x;
  ctx.kernels().layernorm_forward(y_.f32(), mean_.f32(), rstd_.f32(), x.f32(), weight.data, bias.data, rows, C_, eps_);
  ctx.round(y_);
  return y_;
}

const Tensor& LayerNorm::do_backward(RunCtx& ctx, const Tensor& dy) {
  ctx.ensure(dx_, x_.shape(), DType::f32);
  if (residual_.defined() && residual_.shape() != x_.shape())
    throw Error(name() + ": residual gradient " + shape_str(residual_.shape()) + " is not the input's " +
                shape_str(x_.shape()));
  // In param_dtype the residual is added after the norm's dx is rounded (autograd's sum of two
  // rounded gradients), not inside the pass: two roundings, as PyTorch's.
  const bool add_after = residual_.defined() && ctx.compute_dtype != DType::f32;
  const float* residual = residual_.defined() && !add_after ? residual_.f32() : nullptr;
  ctx.kernels().layernorm_backward(dx_.f32(), residual, weight.grad, bias.grad, dy.f32(), x_.f32(), weight.data,
                                   mean_.f32(), rstd_.f32(), x_.numel() / C_, C_);
  round_then_add(ctx, dx_, add_after ? residual_ : Tensor());
  return dx_;
}

Tensor LayerNorm::backward_adding(RunCtx& ctx, const Tensor& dy, const Tensor& residual) {
  // Through Layer::backward: the FSDP hooks and a checkpointed recompute run as for backward.
  // release_activations (at its end) drops the handle.
  residual_ = residual;
  try {
    return backward(ctx, dy);
  } catch (...) {
    residual_ = Tensor();  // a later plain backward must add nothing
    throw;
  }
}

Embedding::Embedding(const std::string& name, int64_t n, int64_t C)
    : Module(name, "Embedding"), weight(add_param("weight", {n, C}, {ParamInit::Kind::normal, 0.0f, 1.0f})) {}

Embeddings::Embeddings(int64_t vocab, int64_t max_seq, int64_t C)
    : Layer("", "Embeddings"),
      tok(add_child<Embedding>("tok_emb", vocab, C)),
      pos(add_child<Embedding>("pos_emb", max_seq, C)),
      vocab_(vocab),
      max_seq_(max_seq),
      C_(C) {
  set_container();  // PyTorch's LM has tok_emb and pos_emb at its top level: wrap policies see those
}

const Tensor& Embeddings::do_forward(RunCtx& ctx, const Tensor& tokens) {
  if (tokens.ndim() != 2 || tokens.dim(1) > max_seq_)
    throw Error("embeddings: tokens " + shape_str(tokens.shape()) + " are not (B, T <= " + std::to_string(max_seq_) +
                ")");
  tokens_ = tokens;
  int64_t B = tokens.dim(0), T = tokens.dim(1);
  ctx.ensure(y_, {B, T, C_}, DType::f32);
  // Range check on the host only: for device tokens the trainer checks the batch before upload.
  if (tokens.device() == Device::cpu) {
    const int32_t* idx = tokens.i32();
    for (int64_t i = 0; i < B * T; ++i) {
      if (idx[i] < 0 || idx[i] >= vocab_)
        throw Error("embeddings: token " + std::to_string(idx[i]) + " outside vocab " + std::to_string(vocab_));
    }
  }
  // tok_emb and pos_emb may each be an FSDP unit (size_based wraps leaves).
  ctx.pre_forward(tok);
  ctx.pre_forward(pos);
  ctx.kernels().embedding_forward(y_.f32(), tokens.i32(), tok.weight.data, pos.weight.data, B, T, C_);
  ctx.post_forward(pos);
  ctx.post_forward(tok);
  ctx.round(y_);
  return y_;
}

const Tensor& Embeddings::do_backward(RunCtx& ctx, const Tensor& dy) {
  ctx.pre_backward(tok);
  ctx.pre_backward(pos);
  ctx.kernels().embedding_backward(tok.weight.grad, pos.weight.grad, dy.f32(), tokens_.i32(), tokens_.dim(0),
                                   tokens_.dim(1), C_);
  ctx.post_backward(pos);
  ctx.post_backward(tok);
  return none_;  // token ids have no gradient
}

}  // namespace fsdp
