#pragma once
// The layers both seed models use, each matching its torch.nn counterpart: parameter names,
// layouts, default initialisation and numerics. Shapes in the comments: B batch, T sequence,
// C channels/features.
#include <cstdint>
#include <initializer_list>
#include <string>

#include "nn/attention_mode.h"
#include "nn/module.h"

namespace fsdp {

// Kernels::linear_backward with x, a forward's saved input of (rows, in): where the stash packed
// it (nn/activation_stash.h) and the GEMMs round their operands to bf16 anyway (matmul_precision
// medium), x's bf16 values are dW's operand as they are (Kernels::linear_backward_bf16_x): no
// widening pass, no rounding copy, the same arithmetic. Else x's f32 values.
void linear_backward_saved(RunCtx& ctx, float* dX, float* dW, float* db, const float* dY, const Tensor& x,
                           const float* W, int64_t in, int64_t out);

// torch.nn.Linear: W (out, in) and b (out) ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform a=sqrt(5)).
// x (..., in) -> y (..., out).
class Linear : public Layer {
 public:
  Linear(const std::string& name, int64_t in, int64_t out, bool bias = true);
  const Tensor& do_forward(RunCtx& ctx, const Tensor& x) override;
  const Tensor& do_backward(RunCtx& ctx, const Tensor& dy) override;
  void release_activations() override { x_ = y_ = dx_ = Tensor(); }
  void drop_output() override { y_ = Tensor(); }  // backward reads x and dy only
  Param& weight;
  Param* bias = nullptr;

 private:
  int64_t in_, out_;
  Tensor x_, y_, dx_;
};

// torch.nn.Conv2d, stride 1: W (out, in, k, k), b (out), bounds 1/sqrt(in*k*k).
// x (B, in, H, W) -> y (B, out, H+2p-k+1, W+2p-k+1). One GEMM over the whole batch via im2col.
class Conv2d : public Layer {
 public:
  Conv2d(const std::string& name, int64_t in, int64_t out, int64_t kernel, int64_t padding = 0);
  const Tensor& do_forward(RunCtx& ctx, const Tensor& x) override;
  const Tensor& do_backward(RunCtx& ctx, const Tensor& dy) override;
  void release_activations() override { x_ = col_ = ybuf_ = y_ = dyt_ = dcol_ = dx_ = Tensor(); }
  Param& weight;
  Param& bias;

 private:
  int64_t in_, out_, k_, pad_;
  Tensor x_;
  Tensor col_;   // (in*k*k, B*OH*OW), kept for the weight gradient
  Tensor ybuf_;  // (out, B*OH*OW) GEMM output before the batch-major permute
  Tensor y_, dyt_, dcol_, dx_;
};

class ReLU : public Layer {
 public:
  explicit ReLU(const std::string& name) : Layer(name, "ReLU") {}
  const Tensor& do_forward(RunCtx& ctx, const Tensor& x) override;
  const Tensor& do_backward(RunCtx& ctx, const Tensor& dy) override;
  void release_activations() override { y_ = dx_ = Tensor(); }

 private:
  Tensor y_, dx_;
};

// Exact (erf) GELU, torch.nn.GELU() default; with tanh, HF's NewGELUActivation (gelu_new, the
// tanh approximation: T5 v1.1's gated-gelu).
class GELU : public Layer {
 public:
  explicit GELU(const std::string& name, bool tanh = false)
      : Layer(name, tanh ? "NewGELUActivation" : "GELU"), tanh_(tanh) {}
  const Tensor& do_forward(RunCtx& ctx, const Tensor& x) override;
  const Tensor& do_backward(RunCtx& ctx, const Tensor& dy) override;
  void release_activations() override { x_ = y_ = dx_ = Tensor(); }

 private:
  bool tanh_;
  Tensor x_, y_, dx_;
};

// SiLU, torch.nn.SiLU (Llama's act_fn): x / (1 + exp(-x)).
class SiLU : public Layer {
 public:
  explicit SiLU(const std::string& name) : Layer(name, "SiLUActivation") {}
  const Tensor& do_forward(RunCtx& ctx, const Tensor& x) override;
  const Tensor& do_backward(RunCtx& ctx, const Tensor& dy) override;
  void release_activations() override { x_ = y_ = dx_ = Tensor(); }

 private:
  Tensor x_, y_, dx_;
};

// Inverted dropout. The mask of element j of global sample n at step s is a counter-RNG draw
// keyed by (seed, s) in the stream of this layer's name: independent of rank and world size.
class Dropout : public Layer {
 public:
  Dropout(const std::string& name, float p) : Layer(name, "Dropout"), p_(p) {}
  const Tensor& do_forward(RunCtx& ctx, const Tensor& x) override;
  const Tensor& do_backward(RunCtx& ctx, const Tensor& dy) override;
  void release_activations() override { mask_ = y_ = dx_ = Tensor(); }
  void drop_output() override { y_ = Tensor(); }  // backward reads the mask only

 private:
  float p_;
  bool active_ = false;
  Tensor mask_, y_, dx_;
};

// torch.nn.MaxPool2d(2): (B, C, H, W) -> (B, C, H/2, W/2).
class MaxPool2d : public Layer {
 public:
  explicit MaxPool2d(const std::string& name) : Layer(name, "MaxPool2d") {}
  const Tensor& do_forward(RunCtx& ctx, const Tensor& x) override;
  const Tensor& do_backward(RunCtx& ctx, const Tensor& dy) override;
  void release_activations() override { argmax_ = y_ = dx_ = Tensor(); }

 private:
  Tensor argmax_, y_, dx_;
  Shape x_shape_;
};

// torch.flatten(x, 1): a view.
class Flatten : public Layer {
 public:
  explicit Flatten(const std::string& name) : Layer(name, "Flatten") {}
  const Tensor& do_forward(RunCtx& ctx, const Tensor& x) override;
  const Tensor& do_backward(RunCtx& ctx, const Tensor& dy) override;
  void release_activations() override { y_ = dx_ = Tensor(); }

 private:
  Shape x_shape_;
  Tensor y_, dx_;
};

// F.log_softmax(x, dim=-1).
class LogSoftmax : public Layer {
 public:
  explicit LogSoftmax(const std::string& name) : Layer(name, "LogSoftmax") {}
  const Tensor& do_forward(RunCtx& ctx, const Tensor& x) override;
  const Tensor& do_backward(RunCtx& ctx, const Tensor& dy) override;
  void release_activations() override { y_ = dx_ = Tensor(); }

 private:
  Tensor y_, dx_;
};

// torch.nn.LayerNorm(C), eps 1e-5: weight ones, bias zeros. x (..., C).
class LayerNorm : public Layer {
 public:
  LayerNorm(const std::string& name, int64_t C, float eps = 1e-5f);
  const Tensor& do_forward(RunCtx& ctx, const Tensor& x) override;
  const Tensor& do_backward(RunCtx& ctx, const Tensor& dy) override;
  void release_activations() override { x_ = y_ = mean_ = rstd_ = dx_ = residual_ = Tensor(); }
  // backward, returning residual + dx: a pre-norm block's residual stream gradient added in the
  // pass that writes dx (the bits of a separate add; one pass over (rows, C) less).
  Tensor backward_adding(RunCtx& ctx, const Tensor& dy, const Tensor& residual);
  // forward of sum = x + residual, sum (the caller's: a pre-norm block keeps its residual stream)
  // written in the same pass over the rows (add_layernorm_forward: the bits of add, round and
  // forward). Fused only when this norm is no FSDP unit and not checkpointed on its own, whose
  // hooks and recompute see a plain forward of the sum.
  Tensor forward_adding(RunCtx& ctx, const Tensor& x, const Tensor& residual, Tensor& sum);
  Param& weight;
  Param& bias;

 private:
  int64_t C_;
  float eps_;
  Tensor x_, y_, mean_, rstd_, dx_;
  Tensor residual_;      // during backward_adding only
  Tensor fwd_residual_;  // during forward_adding only
  Tensor* fwd_sum_ = nullptr;
};

// RMS norm: y = w * x / sqrt(mean(x^2) + eps); no mean subtraction, no bias: T5's T5LayerNorm
// and Llama's LlamaRMSNorm (the same arithmetic in f32; `type` names the class). Weight (C) starts
// at `init` (HF: initializer_factor for T5, 1 for Llama). x (..., C).
class RMSNorm : public Layer {
 public:
  RMSNorm(const std::string& name, const std::string& type, int64_t C, float eps, float init = 1.0f);
  const Tensor& do_forward(RunCtx& ctx, const Tensor& x) override;
  const Tensor& do_backward(RunCtx& ctx, const Tensor& dy) override;
  // backward, returning residual + dx (as LayerNorm::backward_adding): the residual stream's
  // gradient added in the pass that writes dx.
  Tensor backward_adding(RunCtx& ctx, const Tensor& dy, const Tensor& residual);
  // forward of sum = x + residual, fused as LayerNorm::forward_adding.
  Tensor forward_adding(RunCtx& ctx, const Tensor& x, const Tensor& residual, Tensor& sum);
  void release_activations() override { x_ = y_ = rstd_ = dx_ = residual_ = Tensor(); }
  Param& weight;

 private:
  int64_t C_;
  float eps_;
  Tensor x_, y_, rstd_, dx_;
  Tensor residual_;      // during backward_adding only
  Tensor fwd_residual_;  // during forward_adding only
  Tensor* fwd_sum_ = nullptr;
};

// torch.nn.Embedding(n, C): weight (n, C) ~ N(0, 1). A parameter holder for Embeddings.
class Embedding : public Module {
 public:
  Embedding(const std::string& name, int64_t n, int64_t C);
  Param& weight;
};

// A language model's head: logits = (scale * x) W^T, W (V, C) a weight of its own ("weight",
// starting at `init`) or, tied, another module's (the input embedding's), used by reference;
// `scale` applies to a tied head only (T5 rescales by d_model^-0.5; Llama does not).
// x (..., C) -> (..., V).
class LmHead : public Layer {
 public:
  LmHead(const std::string& name, int64_t C, int64_t V, ParamInit init, Param* tied = nullptr, float scale = 1.0f);
  const Tensor& do_forward(RunCtx& ctx, const Tensor& x) override;
  const Tensor& do_backward(RunCtx& ctx, const Tensor& dy) override;
  void release_activations() override { xs_ = scaled_ = y_ = dx_ = Tensor(); }
  void drop_output() override { y_ = Tensor(); }  // the logits: the loss holds them
  const Param& weight() const { return *weight_; }
  float scale() const { return scale_; }

 private:
  int64_t C_, V_;
  Param* weight_ = nullptr;
  float scale_ = 1.0f;
  Tensor xs_, scaled_, y_, dx_;
};

// Token + learned position embeddings: tokens (B, T) i32 -> (B, T, C). Module name "" so the
// parameters are "tok_emb.weight" and "pos_emb.weight" at the model's top level.
class Embeddings : public Layer {
 public:
  Embeddings(int64_t vocab, int64_t max_seq, int64_t C);
  const Tensor& do_forward(RunCtx& ctx, const Tensor& tokens) override;
  const Tensor& do_backward(RunCtx& ctx, const Tensor& dy) override;
  void release_activations() override { tokens_ = y_ = Tensor(); }
  Embedding& tok;
  Embedding& pos;

 private:
  int64_t vocab_, max_seq_, C_;
  Tensor tokens_, y_, none_;
};

// torch.nn.MultiheadAttention(C, H, batch_first=True) called as attn(x, x, x, attn_mask=causal):
// in_proj_weight (3C, C) xavier_uniform, in_proj_bias (3C) zeros, out_proj Linear with zero bias.
// x (B, T, C) -> (B, T, C).
// recompute (model.attention: recompute): the forward keeps no (B, H, T, T) probabilities for the
// backward, only each row's max and 1/sum (B, H, T); the backward recomputes the scores one row
// block at a time (one GEMM more: q k^T) and from them the forward's P bit for bit. Activations
// per layer shrink by B*H*T*T floats; the scratch of one row block (H, rows, T) lives only during
// the call. The forward is the same arithmetic as without (the same loss, bitwise); dk and dv sum
// over row blocks in another order.
// fused (model.attention: fused; a GPU's): cuDNN's flash attention on a bf16 copy of q, k, v (the
// f32 projections rounded to nearest even, which train.matmul_precision: medium does to every
// GEMM operand anyway), f32 softmax and accumulation, o rounded to bf16. Keeps that bf16 copy
// (B, T, 3C) for the backward instead of the f32 projections (freed once copied), and each row's
// log-sum-exp (B, H, T); the backward's o is y's bits as the stash packed them where it did, and
// o's, dO's and dqkv's bf16 buffers and cuDNN's workspace live only during each call.
class MultiheadAttention : public Layer {
 public:
  MultiheadAttention(const std::string& name, int64_t C, int64_t heads,
                     AttentionMode mode = AttentionMode::materialized);
  const Tensor& do_forward(RunCtx& ctx, const Tensor& x) override;
  const Tensor& do_backward(RunCtx& ctx, const Tensor& dy) override;
  void release_activations() override {
    x_ = qkv_ = att_ = y_ = dqkv_ = dx_ = dp_ = out_ = row_max_ = row_inv_ = lse_ = qkv16_ = Tensor();
    out_proj.release_activations();
  }
  void drop_output() override { out_ = Tensor(); }  // backward starts from dy and out_proj
  Param& in_proj_weight;
  Param& in_proj_bias;
  Linear& out_proj;

 private:
  void backward_materialized(RunCtx& ctx, const float* gy);
  void forward_recompute(RunCtx& ctx);
  void backward_recompute(RunCtx& ctx, const float* gy);
  void forward_fused(RunCtx& ctx);
  void backward_fused(RunCtx& ctx, const Tensor& gy);
  FusedAttentionShape fused_shape() const;
  int64_t C_, H_;
  AttentionMode mode_;
  Tensor x_, qkv_, att_, y_, dqkv_, dx_, dp_;
  Tensor row_max_, row_inv_;  // recompute: (B, H, T) each row's softmax max and 1/sum
  Tensor scores_;             // recompute: (H, rows, T) one row block's scores, during a call
  Tensor lse_;                // fused: (B, H, T) each row's log-sum-exp of the scaled scores (cuDNN's stats)
  Tensor qkv16_;              // fused: (B, T, 3C) bf16, q | k | v as cuDNN read them in the forward
  Tensor out_;                // out_proj's output (a handle: out_proj may be a checkpointed unit of its own)
};

// Pre-norm decoder block: x + attn(ln1(x)), then + fc2(gelu(fc1(ln2(.)))). FSDP's
// transformer_layer wrap policy targets this type.
class TransformerBlock : public Layer {
 public:
  TransformerBlock(const std::string& name, int64_t C, int64_t heads, int64_t d_ff,
                   AttentionMode attention = AttentionMode::materialized);
  const Tensor& do_forward(RunCtx& ctx, const Tensor& x) override;
  const Tensor& do_backward(RunCtx& ctx, const Tensor& dy) override;
  void release_activations() override {
    a_ = y_ = da_ = dx_ = Tensor();
    for (Layer* l : std::initializer_list<Layer*>{&ln1, &attn, &ln2, &fc1, &act, &fc2}) l->release_activations();
  }
  LayerNorm& ln1;
  MultiheadAttention& attn;
  LayerNorm& ln2;
  Linear& fc1;
  GELU& act;
  Linear& fc2;

 private:
  Tensor a_, y_, da_, dx_;
};

}  // namespace fsdp
