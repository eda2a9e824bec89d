#include <algorithm>
#include <cmath>

#include "nn/layers.h"
#include "tensor/error.h"

namespace fsdp {

// Causal attention needs only the lower triangle j <= i of each (T, T) plane. Its GEMMs run in
// blocks of rows [r0, r1) (or, for the products with P^T and dS^T, blocks of columns [c0, c1)),
// each over the part that can be unmasked: key columns < r1, or query rows >= c0. The skipped
// terms are exact zeros of P and dS, so every output element sums the same non-zero terms as
// over the full square. Kernels::causal_row_block says how large a block is (T: one block);
// for_causal_blocks (tensor/kernels.h) walks them.

MultiheadAttention::MultiheadAttention(const std::string& name, int64_t C, int64_t heads, AttentionMode mode)
    : Layer(name, "MultiheadAttention"),
      // xavier_uniform_ on (3C, C): bound sqrt(6 / (fan_in + fan_out)) = sqrt(6 / (C + 3C)).
      in_proj_weight(add_param("in_proj_weight", {3 * C, C},
                               {ParamInit::Kind::uniform, -std::sqrt(6.0f / (4.0f * static_cast<float>(C))),
                                std::sqrt(6.0f / (4.0f * static_cast<float>(C)))})),
      in_proj_bias(add_param("in_proj_bias", {3 * C}, {ParamInit::Kind::constant, 0.0f, 0.0f})),
      out_proj(add_child<Linear>(child_name("out_proj"), C, C)),
      C_(C),
      H_(heads),
      mode_(mode) {
  if (C % heads != 0)
    throw Error(name + ": d_model " + std::to_string(C) + " not divisible by heads " + std::to_string(heads));
  // torch.nn.MultiheadAttention._reset_parameters zeroes out_proj.bias.
  out_proj.bias->init = {ParamInit::Kind::constant, 0.0f, 0.0f};
}

const Tensor& MultiheadAttention::do_forward(RunCtx& ctx, const Tensor& x) {
  x_ = x;
  int64_t B = x.dim(0), T = x.dim(1), C = C_, hd = C_ / H_;
  ctx.ensure(qkv_, {B, T, 3 * C}, DType::f32);
  ctx.ensure(y_, {B, T, C}, DType::f32);
  Kernels& kernels = ctx.kernels();
  kernels.linear_forward(qkv_.f32(), x.f32(), in_proj_weight.data, in_proj_bias.data, B * T, C, 3 * C);
  ctx.round(qkv_);
  if (mode_ != AttentionMode::materialized) {
    if (mode_ == AttentionMode::recompute)
      forward_recompute(ctx);
    else
      forward_fused(ctx);  // cuDNN's flash attention: o is bf16 already
    out_ = out_proj.forward(ctx, y_);
    return out_;
  }
  ctx.ensure(att_, {B, H_, T, T}, DType::f32);
  // In param_dtype, flash attention's arithmetic (PyTorch 2's scaled_dot_product_attention, which
  // nn.MultiheadAttention calls, on the CPU and on CUDA): f32 scores and statistics, exp(s - max)
  // rounded as the operand of P @ v, the f32 sum then divided by the row's f32 sum and rounded.
  const DType flash = ctx.compute_dtype;
  if (flash != DType::f32) {
    ctx.ensure(row_max_, {B, H_, T}, DType::f32);
    ctx.ensure(row_inv_, {B, H_, T}, DType::f32);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  float* qkv = qkv_.f32();
  float* att = att_.f32();
  float* y = y_.f32();
  // Per sample and row block, one batched GEMM over the H heads: head h's q, k, v are columns h*hd
  // of the sample's (T, 3C) rows (stride hd), its scores the plane h of att (stride T*T).
  const int64_t block = kernels.causal_row_block(T);
  // Samples in groups: on the host (row blocks) one sample at a time, so its scores (H, T, T)
  // are still in cache for the softmax and the product with v (the same bits as all at once);
  // on a GPU (one block of T) all B at once, one softmax launch.
  const int64_t group = block < T ? 1 : B;
  for (int64_t b0 = 0; b0 < B; b0 += group) {
    const int64_t b1 = std::min(B, b0 + group);
    for (int64_t b = b0; b < b1; ++b) {
      const float* q = qkv + b * T * 3 * C;
      // S[r0:r1, :r1] = scale * q[r0:r1] k[:r1]^T. The columns from r1 on are masked: never computed.
      for_causal_blocks(T, block, [&](int64_t r0, int64_t r1) {
        kernels.gemm_strided_batched(false, true, r1 - r0, r1, hd, scale, q + r0 * 3 * C, 3 * C, hd, q + C, 3 * C, hd,
                                     0.0f, att + b * H_ * T * T + r0 * T, T, T * T, H_);
      });
    }
    // Reads j <= i only and writes P = 0 above the diagonal, over what the blocks left unwritten too.
    const CausalRows rows = CausalRows::whole((b1 - b0) * H_, T);
    if (flash == DType::f32)
      kernels.causal_softmax_forward(att + b0 * H_ * T * T, rows, nullptr, nullptr);
    else
      kernels.causal_softmax_flash(att + b0 * H_ * T * T, rows, row_max_.f32() + b0 * H_ * T,
                                   row_inv_.f32() + b0 * H_ * T, flash);
    for (int64_t b = b0; b < b1; ++b) {
      const float* v = qkv + b * T * 3 * C + 2 * C;
      // y_h[r0:r1] (rows, hd) = P[r0:r1, :r1] @ v[:r1], written into y's head columns.
      for_causal_blocks(T, block, [&](int64_t r0, int64_t r1) {
        kernels.gemm_strided_batched(false, false, r1 - r0, hd, r1, 1.0f, att + b * H_ * T * T + r0 * T, T, T * T, v,
                                     3 * C, hd, 0.0f, y + b * T * C + r0 * C, C, hd, H_);
      });
    }
  }
  if (flash != DType::f32) {
    kernels.attention_rescale(y, row_inv_.f32(), B, T, H_, hd, T, flash);
    ctx.rounded(att_);  // the rounded exponentials (zeros above the diagonal), what backward reads
    ctx.rounded(y_);
  }
  out_ = out_proj.forward(ctx, y_);
  return out_;
}

const Tensor& MultiheadAttention::do_backward(RunCtx& ctx, const Tensor& dy) {
  const int64_t B = x_.dim(0), T = x_.dim(1), C = C_;
  const Tensor& dyh = out_proj.backward(ctx, dy);  // (B, T, C), heads side by side
  ctx.ensure(dqkv_, {B, T, 3 * C}, DType::f32);
  if (mode_ == AttentionMode::materialized)
    backward_materialized(ctx, dyh.f32());
  else if (mode_ == AttentionMode::recompute)
    backward_recompute(ctx, dyh.f32());
  else
    backward_fused(ctx, dyh);
  ctx.round(dqkv_);  // dq, dk, dv: each element one GEMM's output (or summed over row blocks in f32)
  if (need_input_grad) ctx.ensure(dx_, x_.shape(), DType::f32);
  linear_backward_saved(ctx, need_input_grad ? dx_.f32() : nullptr, in_proj_weight.grad, in_proj_bias.grad, dqkv_.f32(),
                        x_, in_proj_weight.data, C, 3 * C);
  if (need_input_grad) ctx.round(dx_);
  return dx_;
}

// Per sample, all heads at once: dv, dP, dS (the softmax backward) and dq, dk into dqkv_.
void MultiheadAttention::backward_materialized(RunCtx& ctx, const float* g) {
  const int64_t B = x_.dim(0), T = x_.dim(1), C = C_, hd = C_ / H_;
  // dP (H, T, T): one sample's score gradients, all heads at once.
  ctx.ensure(dp_, {H_, T, T}, DType::f32);
  Kernels& kernels = ctx.kernels();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* qkv = qkv_.f32();
  float* att = att_.f32();
  float* dqkv = dqkv_.f32();
  float* dP = dp_.f32();
  const int64_t TT = T * T;
  const int64_t block = kernels.causal_row_block(T);
  // In param_dtype (flash attention's backward): P normalised in f32 for dS, dP f32, dS rounded as
  // the operand of dq's and dk's GEMMs, P rounded as the operand of dv's, which then comes last.
  // Flash attention's f32 P is exp(s - max) / sum; this path has only the forward's rounded
  // exponentials, so its P is theirs times 1 / sum (recompute mode, which has the scores again,
  // is exact there).
  const DType flash = ctx.compute_dtype;
  for (int64_t b = 0; b < B; ++b) {
    const float* q = qkv + b * T * 3 * C;  // head h at column h*hd of each (3C) row
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* dq = dqkv + b * T * 3 * C;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    float* P = att + b * H_ * TT;     // (H, T, T)
    const float* gy = g + b * T * C;  // (T, C), head h at column h*hd
    // dv[c0:c1] = P[c0:, c0:c1]^T @ gy[c0:] (rows above c0 of those columns are masked);
    // dP[r0:r1, :r1] = gy[r0:r1] @ v[:r1]^T.
    auto dv_gemms = [&] {
      for_causal_blocks(T, block, [&](int64_t c0, int64_t c1) {
        kernels.gemm_strided_batched(true, false, c1 - c0, hd, T - c0, 1.0f, P + c0 * T + c0, T, TT, gy + c0 * C, C, hd,
                                     0.0f, dv + c0 * 3 * C, 3 * C, hd, H_);
      });
    };
    if (flash == DType::f32)
      dv_gemms();
    else
      kernels.causal_softmax_normalize(P, CausalRows::whole(H_, T), row_inv_.f32() + b * H_ * T, DType::f32);
    for_causal_blocks(T, block, [&](int64_t r0, int64_t r1) {
      kernels.gemm_strided_batched(false, true, r1 - r0, r1, hd, 1.0f, gy + r0 * C, C, hd, v, 3 * C, hd, 0.0f,
                                   dP + r0 * T, T, TT, H_);
    });
    // Softmax backward, folded with the scale: dS = scale * P * (dP - sum_j P dP). It reads j <= i
    // only and writes dS = 0 above the diagonal.
    kernels.causal_softmax_backward(dP, P, CausalRows::whole(H_, T), scale);
    ctx.round(dP, H_ * TT);
    // dq[r0:r1] = dS[r0:r1, :r1] @ k[:r1] ; dk[c0:c1] = dS[c0:, c0:c1]^T @ q[c0:]
    for_causal_blocks(T, block, [&](int64_t r0, int64_t r1) {
      kernels.gemm_strided_batched(false, false, r1 - r0, hd, r1, 1.0f, dP + r0 * T, T, TT, k, 3 * C, hd, 0.0f,
                                   dq + r0 * 3 * C, 3 * C, hd, H_);
    });
    for_causal_blocks(T, block, [&](int64_t c0, int64_t c1) {
      kernels.gemm_strided_batched(true, false, c1 - c0, hd, T - c0, 1.0f, dP + c0 * T + c0, T, TT, q + c0 * 3 * C,
                                   3 * C, hd, 0.0f, dk + c0 * 3 * C, 3 * C, hd, H_);
    });
    if (flash != DType::f32) {
      ctx.round(P, H_ * TT);
      dv_gemms();
    }
  }
}

// Per sample and row block [r0, r1), all heads at once: S = scale q[r0:r1] k[:r1]^T into the
// scratch, the causal softmax of those rows (saving each row's max and 1/sum), y[r0:r1] = P v[:r1].
// The same GEMMs and softmax rows as the materialised forward, so the same bits.
void MultiheadAttention::forward_recompute(RunCtx& ctx) {
  const int64_t B = x_.dim(0), T = x_.dim(1), C = C_, hd = C_ / H_;
  Kernels& kernels = ctx.kernels();
  const int64_t block = kernels.causal_row_block(T);
  ctx.ensure(row_max_, {B, H_, T}, DType::f32);
  ctx.ensure(row_inv_, {B, H_, T}, DType::f32);
  ctx.ensure(scores_, {H_, block, T}, DType::f32);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* qkv = qkv_.f32();
  float* S = scores_.f32();
  for (int64_t b = 0; b < B; ++b) {
    const float* q = qkv + b * T * 3 * C;
    const float* v = q + 2 * C;
    for_causal_blocks(T, block, [&](int64_t r0, int64_t r1) {
      const int64_t rows = r1 - r0;
      kernels.gemm_strided_batched(false, true, rows, r1, hd, scale, q + r0 * 3 * C, 3 * C, hd, q + C, 3 * C, hd, 0.0f,
                                   S, T, rows * T, H_);
      if (ctx.compute_dtype == DType::f32)
        kernels.causal_softmax_forward(S, {H_, rows, r0, T}, row_max_.f32() + b * H_ * T, row_inv_.f32() + b * H_ * T);
      else  // flash attention's rounded exponentials (the materialised forward's comment)
        kernels.causal_softmax_flash(S, {H_, rows, r0, T}, row_max_.f32() + b * H_ * T, row_inv_.f32() + b * H_ * T,
                                     ctx.compute_dtype);
      kernels.gemm_strided_batched(false, false, rows, hd, r1, 1.0f, S, T, rows * T, v, 3 * C, hd, 0.0f,
                                   y_.f32() + b * T * C + r0 * C, C, hd, H_);
    });
  }
  if (ctx.compute_dtype != DType::f32) {
    kernels.attention_rescale(y_.f32(), row_inv_.f32(), B, T, H_, hd, T, ctx.compute_dtype);
    ctx.rounded(y_);
  }
  scores_ = Tensor();  // the next layer may use the memory
}

// Per sample and row block [r0, r1): S again, P from it and the saved statistics (the forward's
// bits), dP = gy[r0:r1] v[:r1]^T, dS in place, then dq[r0:r1] = dS k[:r1] and the row block's
// shares dk[:r1] += dS^T q[r0:r1], dv[:r1] += P^T gy[r0:r1].
void MultiheadAttention::backward_recompute(RunCtx& ctx, const float* gy_all) {
  const int64_t B = x_.dim(0), T = x_.dim(1), C = C_, hd = C_ / H_;
  Kernels& kernels = ctx.kernels();
  const int64_t block = kernels.causal_row_block(T);
  ctx.ensure(scores_, {H_, block, T}, DType::f32);
  ctx.ensure(dp_, {H_, block, T}, DType::f32);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  float* P = scores_.f32();
  float* dP = dp_.f32();
  // Row blocks add their shares of dk and dv onto zeros; one block (a GPU's: T rows) writes them.
  const bool one_block = block >= T;
  const float dkv_beta = one_block ? 0.0f : 1.0f;
  if (!one_block) kernels.fill(dqkv_.f32(), 0.0f, B * T * 3 * C);
  for (int64_t b = 0; b < B; ++b) {
    const float* q = qkv_.f32() + b * T * 3 * C;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* dq = dqkv_.f32() + b * T * 3 * C;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* gy = gy_all + b * T * C;
    const float* mx = row_max_.f32() + b * H_ * T;
    const float* inv = row_inv_.f32() + b * H_ * T;
    for_causal_blocks(T, block, [&](int64_t r0, int64_t r1) {
      const int64_t rows = r1 - r0;
      const CausalRows g{H_, rows, r0, T};
      kernels.gemm_strided_batched(false, true, rows, r1, hd, scale, q + r0 * 3 * C, 3 * C, hd, k, 3 * C, hd, 0.0f, P,
                                   T, rows * T, H_);
      // P = exp(s - max) / sum in f32: flash attention's backward P too (its row statistics mean
      // the same); dS and then P are rounded as GEMM operands in param_dtype.
      kernels.causal_softmax_recompute(P, g, mx, inv);
      kernels.gemm_strided_batched(false, true, rows, r1, hd, 1.0f, gy + r0 * C, C, hd, v, 3 * C, hd, 0.0f, dP, T,
                                   rows * T, H_);
      kernels.causal_softmax_backward(dP, P, g, scale);
      ctx.round(dP, H_ * rows * T);
      ctx.round(P, H_ * rows * T);
      kernels.gemm_strided_batched(false, false, rows, hd, r1, 1.0f, dP, T, rows * T, k, 3 * C, hd, 0.0f,
                                   dq + r0 * 3 * C, 3 * C, hd, H_);
      kernels.gemm_strided_batched(true, false, r1, hd, rows, 1.0f, dP, T, rows * T, q + r0 * 3 * C, 3 * C, hd,
                                   dkv_beta, dk, 3 * C, hd, H_);
      kernels.gemm_strided_batched(true, false, r1, hd, rows, 1.0f, P, T, rows * T, gy + r0 * C, C, hd, dkv_beta, dv,
                                   3 * C, hd, H_);
    });
  }
  scores_ = dp_ = Tensor();
}

FusedAttentionShape MultiheadAttention::fused_shape() const {
  const int64_t hd = C_ / H_;  // the constructor checked C % heads == 0
  return {x_.dim(0), x_.dim(1), H_, hd, 1.0f / std::sqrt(static_cast<float>(hd))};
}

// qkv rounded to bf16 (a scratch), cuDNN's forward into a bf16 o (a scratch) and the row
// statistics (kept), then y = o in f32 (exact). Whether this kernel set has it is asked at every
// call (cheap after the first), so a run without it stops with one line in its first forward.
void MultiheadAttention::forward_fused(RunCtx& ctx) {
  Kernels& kernels = ctx.kernels();
  if (const std::string why = kernels.fused_attention_unavailable(); !why.empty())
    throw Error(name() + ": model.attention: fused: " + why);
  const FusedAttentionShape s = fused_shape();
  const int64_t BT = s.B * s.T, C = C_;
  Tensor o16, workspace;
  // The bf16 copy is what the backward reads too (the same bits a cast of qkv_ would give it
  // again), so the f32 projections go at once: no pack pass, no widening, no second copy.
  ctx.ensure(qkv16_, {s.B, s.T, 3 * C}, DType::bf16);
  kernels.cast(qkv16_.raw(), DType::bf16, qkv_.f32(), DType::f32, BT * 3 * C);
  qkv_ = Tensor();
  ctx.ensure(o16, {s.B, s.T, C}, DType::bf16);
  ctx.ensure(lse_, {s.B, H_, s.T}, DType::f32);
  if (const int64_t bytes = kernels.fused_attention_workspace_bytes(s, false); bytes > 0)
    ctx.ensure(workspace, {bytes}, DType::u8);
  kernels.fused_attention_forward(s, static_cast<const uint16_t*>(qkv16_.raw()), static_cast<uint16_t*>(o16.raw()),
                                  lse_.f32(), workspace.defined() ? workspace.raw() : nullptr);
  kernels.cast(y_.f32(), DType::f32, o16.raw(), DType::bf16, BT * C);
  if (ctx.compute_dtype == DType::bf16) ctx.rounded(y_);  // bf16 values (f16: not f16's)
}

// The forward's bf16 q | k | v (qkv16_), o in bf16 (y holds o exactly: the stash's packed bits
// of y where it packed y in bf16, which out_proj's backward at medium leaves packed, else a cast),
// dO = gy rounded, cuDNN's backward into a bf16 dqkv, then dqkv in f32 for the in_proj backward.
void MultiheadAttention::backward_fused(RunCtx& ctx, const Tensor& gy) {
  Kernels& kernels = ctx.kernels();
  const FusedAttentionShape s = fused_shape();
  const int64_t BT = s.B * s.T, C = C_;
  Tensor o16, do16, dqkv16, workspace;
  const Buffer& y = *y_.storage();
  const void* o = y.packed_dtype() == DType::bf16 ? y.packed_data() : nullptr;
  if (!o) {
    ctx.ensure(o16, {s.B, s.T, C}, DType::bf16);
    kernels.cast(o16.raw(), DType::bf16, y_.f32(), DType::f32, BT * C);
    o = o16.raw();
  }
  ctx.ensure(do16, {s.B, s.T, C}, DType::bf16);
  kernels.cast(do16.raw(), DType::bf16, gy.f32(), DType::f32, BT * C);
  ctx.ensure(dqkv16, {s.B, s.T, 3 * C}, DType::bf16);
  if (const int64_t bytes = kernels.fused_attention_workspace_bytes(s, true); bytes > 0)
    ctx.ensure(workspace, {bytes}, DType::u8);
  kernels.fused_attention_backward(s, static_cast<const uint16_t*>(qkv16_.raw()), static_cast<const uint16_t*>(o),
                                   static_cast<const uint16_t*>(do16.raw()), lse_.f32(),
                                   static_cast<uint16_t*>(dqkv16.raw()),
                                   workspace.defined() ? workspace.raw() : nullptr);
  kernels.cast(dqkv_.f32(), DType::f32, dqkv16.raw(), DType::bf16, BT * 3 * C);
}

TransformerBlock::TransformerBlock(const std::string& name, int64_t C, int64_t heads, int64_t d_ff,
                                   AttentionMode attention)
    : Layer(name, "TransformerBlock"),
      ln1(add_child<LayerNorm>(child_name("ln1"), C)),
      attn(add_child<MultiheadAttention>(child_name("attn"), C, heads, attention)),
      ln2(add_child<LayerNorm>(child_name("ln2"), C)),
      fc1(add_child<Linear>(child_name("fc1"), C, d_ff)),
      act(add_child<GELU>(child_name("act"))),
      fc2(add_child<Linear>(child_name("fc2"), d_ff, C)) {}

const Tensor& TransformerBlock::do_forward(RunCtx& ctx, const Tensor& x) {
  ctx.ensure(y_, x.shape(), DType::f32);
  int64_t n = x.numel();
  // a = x + attn(ln1(x)) and ln2(a) in one pass (LayerNorm::forward_adding).
  const Tensor h = ln2.forward_adding(ctx, x, attn.forward(ctx, ln1.forward(ctx, x)), a_);
  // fc2's output first, then the pointers: fc1 or fc2 may be an FSDP unit of its own, whose end
  // packs what the block rounded before it (a_), so a pointer taken earlier could be stale.
  const Tensor mlp = fc2.forward(ctx, act.forward(ctx, fc1.forward(ctx, h)));
  ctx.kernels().add(y_.f32(), a_.f32(), mlp.f32(), n);
  ctx.round(y_);
  return y_;
}

const Tensor& TransformerBlock::do_backward(RunCtx& ctx, const Tensor& dy) {
  // The residual stream's gradient joins each norm's in the norm's own dx pass (backward_adding).
  da_ = ln2.backward_adding(ctx, fc1.backward(ctx, act.backward(ctx, fc2.backward(ctx, dy))), dy);
  dx_ = ln1.backward_adding(ctx, attn.backward(ctx, da_), da_);
  return dx_;
}

}  // namespace fsdp
