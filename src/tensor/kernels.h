#pragma once
// Every compute kernel the models, the losses, the optimizers and FSDP run, behind one interface
// with a host and a device implementation:
//   CpuKernels  (tensor/cpu_kernels.cpp): OpenBLAS and the OpenMP loops of ops.h.
//   CudaKernels (tensor/cuda/):           cuBLAS/cuBLASLt and our .cu kernels, enqueued on the
//                                         runtime's compute stream (they return at once).
// Pointers are in the implementation's memory. Shapes in the comments; row-major throughout.
// The per-element math both share (GELU, the optimizer updates, dropout's counter RNG, bf16
// rounding) lives in FSDP_HD functions (tensor/kernel_math.h), so host and device compute the
// same formulas from one source.
// Functions that return a host value (loss sums, norms, finiteness) synchronise with the
// compute stream: they are the step's only host waits, and each says so.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/matmul_precision.h"
#include "tensor/tensor.h"

namespace fsdp {

struct AdamWArgs {  // scalars of one AdamW step (optim/optimizer.cpp computes them in f64)
  float decay;      // 1 - lr * weight_decay (1 when there is no decay)
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float bias_correction2_sqrt, eps, neg_step_size;  // -(lr / bias_correction1)
  bool has_weight_decay;
};
struct SgdArgs {
  float weight_decay, momentum, keep;  // keep = 1 - dampening
  float neg_lr;
  bool has_weight_decay, has_momentum, first_step, nesterov;
};
struct AdadeltaArgs {
  float weight_decay, rho, one_minus_rho, eps, neg_lr;
  bool has_weight_decay;
};

// CpuKernels::causal_row_block: 32 rows. The bench transformer's attention GEMMs (T 256, head dim
// 64, one thread, OpenBLAS on Zen 3) took 0.039-0.044 s per layer in blocks of 32 rows,
// 0.045-0.049 in blocks of 64, 0.042-0.048 in blocks of 16 and 0.056-0.061 over the full square.
inline int64_t host_causal_row_block(int64_t T) { return T < 32 ? T : 32; }

// fn(r0, r1) for each block of `block` rows of T (the last one may be shorter): causal attention's
// GEMMs run per block (nn/attention.cpp, models/llama/llama.cpp).
template <typename Fn>
void for_causal_blocks(int64_t T, int64_t block, Fn&& fn) {
  for (int64_t r0 = 0; r0 < T; r0 += block) fn(r0, std::min(T, r0 + block));
}

// Rows [row0, row0 + rows) of `planes` causal (T, T) score matrices, held as planes x rows x T
// (row stride T, plane stride rows * T): row r of a plane is query row i = row0 + r and keeps the
// key columns j <= i. Whole planes are {planes, T, 0, T}; nn/attention.cpp's recompute mode
// passes one block of rows at a time.
struct CausalRows {
  int64_t planes = 0;
  int64_t rows = 0;
  int64_t row0 = 0;
  int64_t T = 0;
  static CausalRows whole(int64_t planes, int64_t T) { return {planes, T, 0, T}; }
};

// Causal self-attention of nn.MultiheadAttention's packed projections, fused (flash attention:
// no (T, T) scores in memory), bf16 operands, f32 softmax and accumulation. qkv (B, T, 3C) holds
// q | k | v side by side in each row, head h at columns h*hd of each third (C = H * hd); o
// (B, T, C) heads side by side; stats (B, H, T) each row's log-sum-exp of the scaled scores,
// which the backward needs. On a GPU: cuDNN's SDPA (tensor/cuda/cudnn_attention.cpp).
struct FusedAttentionShape {
  int64_t B = 0, T = 0, H = 0, hd = 0;
  float scale = 1.0f;  // 1 / sqrt(hd)
};

class Kernels {
 public:
  virtual ~Kernels() = default;
  virtual Device device() const = 0;

  // --- GEMM: C (M,N) = alpha * op(A) (M,K) @ op(B) (K,N) + beta * C, f32 accumulate.
  virtual void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                    int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) = 0;
  // `batch` independent GEMMs, operand i at base + i * stride (attention's B*H heads).
  virtual void gemm_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                                    const float* A, int64_t lda, int64_t stride_a, const float* B, int64_t ldb,
                                    int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c,
                                    int64_t batch) = 0;
  // Rows per GEMM block of causal self-attention (nn/attention.cpp, the Llama family). Rows [r0, r1) of a (T, T)
  // score plane need key columns < r1 only, so blocks smaller than T skip most of the masked upper
  // triangle at the price of more, smaller GEMMs. The default, T, is one GEMM over the full square:
  // on a GPU each block would be a launch of its own. The host's is host_causal_row_block (the
  // memory plan's kernels give the planned device's: attention's recompute mode sizes its scratch
  // by it).
  virtual int64_t causal_row_block(int64_t T) const { return T; }
  // bf16 operands (raw bits), f32 accumulate and output (cuBLAS: CUBLAS_COMPUTE_32F).
  virtual void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                         int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) = 0;

  // --- Linear (torch.nn.Linear): Y (rows,out) = X (rows,in) @ W^T + b; dW += dY^T X,
  // db += colsum(dY), dX = dY W (dX null: skipped).
  virtual void linear_forward(float* Y, const float* X, const float* W, const float* b, int64_t rows, int64_t in,
                              int64_t out) = 0;
  virtual void linear_backward(float* dX, float* dW, float* db, const float* dY, const float* X, const float* W,
                               int64_t rows, int64_t in, int64_t out) = 0;
  // linear_backward with X (rows, in) held as bf16 bits (a saved activation the stash packed:
  // Buffer::packed_data) at matmul_precision medium, where a bf16 X is exactly the rounded operand
  // of the dW GEMM: it takes X as it is, neither widened back to f32 nor rounded into a copy. The
  // same arithmetic as linear_backward on X's values. Other precisions: Error (callers check).
  virtual void linear_backward_bf16_x(float* dX, float* dW, float* db, const float* dY, const uint16_t* X,
                                      const float* W, int64_t rows, int64_t in, int64_t out) = 0;

  // --- Conv2d (stride 1) via im2col over the whole batch: col (C*K*K, B*OH*OW).
  virtual void im2col(const float* x, float* col, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K, int64_t pad,
                      int64_t OH, int64_t OW) = 0;
  // dx (B,C,H,W) = col2im(dcol); dx is overwritten (zeroed first by the kernel).
  virtual void col2im(const float* dcol, float* dx, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K, int64_t pad,
                      int64_t OH, int64_t OW) = 0;
  // y (B,out,P) = ybuf (out, B*P) permuted, + bias (out).
  virtual void conv_bias_permute(float* y, const float* ybuf, const float* bias, int64_t B, int64_t out, int64_t P) = 0;
  // dyt (out, B*P) = dy (B,out,P) permuted; db (out) += its row sums.
  virtual void conv_grad_permute(float* dyt, float* db, const float* dy, int64_t B, int64_t out, int64_t P) = 0;

  // --- Elementwise (n elements).
  virtual void relu_forward(float* y, const float* x, int64_t n) = 0;
  virtual void relu_backward(float* dx, const float* dy, const float* y, int64_t n) = 0;
  virtual void gelu_forward(float* y, const float* x, int64_t n) = 0;  // exact (erf)
  virtual void gelu_backward(float* dx, const float* dy, const float* x, int64_t n) = 0;
  // HF's NewGELUActivation ("gelu_new"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  virtual void gelu_tanh_forward(float* y, const float* x, int64_t n) = 0;
  virtual void gelu_tanh_backward(float* dx, const float* dy, const float* x, int64_t n) = 0;
  // SiLU, torch.nn.functional.silu: x / (1 + exp(-x)) (Llama's gate activation).
  virtual void silu_forward(float* y, const float* x, int64_t n) = 0;
  virtual void silu_backward(float* dx, const float* dy, const float* x, int64_t n) = 0;
  virtual void add(float* y, const float* a, const float* b, int64_t n) = 0;
  virtual void add_inplace(float* y, const float* x, int64_t n) = 0;
  virtual void mul(float* y, const float* a, const float* b, int64_t n) = 0;
  virtual void scale(float* x, float factor, int64_t n) = 0;
  virtual void fill(float* x, float value, int64_t n) = 0;

  // --- Dropout: element i kept (keep[i] = 1, else 0) where CounterRng(key, stream).uniform(counter
  // of element i) >= p, the counter being (sample_offset + n) * per_sample + j for element j of
  // local sample n; y = x * (kept ? scale : 0), scale = kmath::dropout_scale(p). A byte a mask
  // element, as PyTorch's bool mask (a mask of f32 scales was 4 bytes an element of what the
  // forward keeps). Bitwise the same on host and device (kernel_math.h's Philox).
  virtual void dropout_forward(float* y, uint8_t* keep, const float* x, int64_t B, int64_t per_sample, float p,
                               uint64_t key, uint64_t stream, int64_t sample_offset) = 0;
  // dx = dy * (keep[i] ? scale : 0) (n elements): the forward's factor, the same product bits.
  virtual void dropout_backward(float* dx, const float* dy, const uint8_t* keep, float p, int64_t n) = 0;

  // --- Normalisation and softmax.
  virtual void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w, const float* b,
                                 int64_t rows, int64_t C, float eps) = 0;
  // dx = residual + d(layernorm) where residual is not null: a pre-norm block's residual stream
  // gradient added in the pass that writes dx (the same bits as a separate add, one pass less).
  virtual void layernorm_backward(float* dx, const float* residual, float* dw, float* db, const float* dy,
                                  const float* x, const float* w, const float* mean, const float* rstd, int64_t rows,
                                  int64_t C) = 0;
  // A pre-norm block's residual stream and its next norm in one pass: sum = x + residual (add's
  // bits), y = layernorm(sum) (layernorm_forward's bits), both stored rounded to `dtype`
  // (round_to's bits; f32: as computed). The same for rmsnorm below.
  virtual void add_layernorm_forward(float* sum, float* y, float* mean, float* rstd, const float* x,
                                     const float* residual, const float* w, const float* b, int64_t rows, int64_t C,
                                     float eps, DType dtype) = 0;
  virtual void log_softmax_forward(float* y, const float* x, int64_t rows, int64_t C) = 0;
  virtual void log_softmax_backward(float* dx, const float* dy, const float* y, int64_t rows, int64_t C) = 0;
  // Causal softmax in place on the rows `g` of `planes` (T,T) score matrices (CausalRows): row i
  // keeps j <= i, zeros above. row_max/row_inv (both or neither) receive each row's maximum and
  // 1/sum at [plane * T + i], so causal_softmax_recompute gives the same P from the same scores.
  virtual void causal_softmax_forward(float* P, CausalRows g, float* row_max, float* row_inv) = 0;
  // In place: P = exp(S - row_max) * row_inv for j <= i, zeros above: the forward's P, bit for bit
  // (the same exp, the same two roundings), from scores S and the forward's row statistics.
  virtual void causal_softmax_recompute(float* P, CausalRows g, const float* row_max, const float* row_inv) = 0;
  // dS = scale * P * (dP - rowsum(P * dP)) in place of dP, zeros above the diagonal.
  virtual void causal_softmax_backward(float* dP, const float* P, CausalRows g, float scale) = 0;
  // Flash attention's probabilities (fsdp.mixed_precision.compute: param_dtype, as PyTorch 2's
  // scaled_dot_product_attention computes in bf16 on the CPU and CUDA): in place on the rows g,
  // P = exp(S - row_max) rounded to `dtype`, not yet divided by the row's sum; row_max and row_inv
  // (1 / the sum of the unrounded exponentials, both required) saved as causal_softmax_forward
  // saves them. The GEMM P @ v then sums the rounded values and attention_rescale divides.
  virtual void causal_softmax_flash(float* P, CausalRows g, float* row_max, float* row_inv, DType dtype) = 0;
  // y (B, T, H * hd), head h of row t scaled by row_inv[(b * H + h) * inv_stride + t] and rounded to
  // dtype: flash attention's division of its accumulated output by the row's sum (inv_stride: T, or
  // a decoding step's key count with row_inv at its first query's position).
  virtual void attention_rescale(float* y, const float* row_inv, int64_t B, int64_t T, int64_t H, int64_t hd,
                                 int64_t inv_stride, DType dtype) = 0;
  // In place on the rows g: P = P * row_inv (causal_softmax_flash's P normalised), rounded to dtype
  // (f32: not), zeros above the diagonal.
  virtual void causal_softmax_normalize(float* P, CausalRows g, const float* row_inv, DType dtype) = 0;
  // T5LayerNorm (RMS norm): rstd[r] = 1 / sqrt(mean_c x^2 + eps), y = w * (x * rstd); no mean,
  // no bias. The sum of squares is accumulated in f64 (then rounded to f32) on host and device:
  // their different summation orders give the same rstd unless the sum lies at an f32 rounding
  // boundary.
  virtual void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t rows, int64_t C,
                               float eps) = 0;
  virtual void add_rmsnorm_forward(float* sum, float* y, float* rstd, const float* x, const float* residual,
                                   const float* w, int64_t rows, int64_t C, float eps, DType dtype) = 0;
  // dx overwritten (null: skipped; residual + d(rmsnorm) where residual is not null, as
  // layernorm_backward), dw (C) += sum over rows of dy * x * rstd.
  virtual void rmsnorm_backward(float* dx, const float* residual, float* dw, const float* dy, const float* x,
                                const float* w, const float* rstd, int64_t rows, int64_t C) = 0;
  // Rotary position embedding in place (HF Llama's apply_rotary_pos_emb; kernel_math.h's
  // rope_pair) on x: `rows` rows of `heads` heads of D, row r at x + r * ld, its head h at + h * D;
  // row r is at position pos0 + r % T. cos and sin (positions, D/2): the angle of position p and
  // pair i at [p * D/2 + i] (HF's cos_cached, whose two halves are equal). backward: the
  // transpose (sin negated), turning the gradient of the rotated x into that of x.
  virtual void rope(float* x, const float* cos, const float* sin, int64_t rows, int64_t T, int64_t heads, int64_t D,
                    int64_t ld, int64_t pos0, bool backward) = 0;
  // Attention softmax in place on P (B, H, Tq, Tk), raw scores on entry:
  // P = softmax_j(scores + bias[h, i, j]) over the unmasked j, exactly 0 at masked j.
  // bias (H, Tq, Tk): null for none. key_valid (B, Tk): null for all valid, else key j of sample
  // b is masked where key_valid[b * Tk + j] == 0. causal: j > i masked as well. A row with every
  // key masked is uniform, 1/Tk everywhere (what HF's additive finfo.min mask gives).
  virtual void attention_softmax_forward(float* P, const float* bias, const int32_t* key_valid, bool causal, int64_t B,
                                         int64_t H, int64_t Tq, int64_t Tk) = 0;
  // dS = P * (dP - rowsum(P * dP)) in place of dP, rows of Tk (masked entries: P = 0, so 0).
  // A fully masked row (uniform P) gets that formula too, as torch's autograd does through HF's
  // additive mask, although the forward is constant there.
  virtual void softmax_backward(float* dP, const float* P, int64_t rows, int64_t Tk) = 0;
  // T5 relative position bias: bias (H, Tq, Tk) = table[bucket[i, j], h], table (num_buckets, H)
  // (nn.Embedding(num_buckets, n_heads).weight), bucket (Tq, Tk) from t5_relative_buckets.
  virtual void relative_bias_forward(float* bias, const float* table, const int32_t* bucket, int64_t H, int64_t Tq,
                                     int64_t Tk) = 0;
  // dtable[bucket[i, j], h] += sum over b of dS[b, h, i, j], dS (B, H, Tq, Tk). Host: a fixed
  // order. Device: atomics (duplicate buckets add up in a run-dependent order).
  virtual void relative_bias_backward(float* dtable, const float* dS, const int32_t* bucket, int64_t B, int64_t H,
                                      int64_t Tq, int64_t Tk) = 0;

  // --- Pooling: 2x2 max-pool, stride 2, on (planes, H, W); argmax = flat index in the plane.
  virtual void maxpool2_forward(float* y, int32_t* argmax, const float* x, int64_t planes, int64_t H, int64_t W) = 0;
  virtual void maxpool2_backward(float* dx, const float* dy, const int32_t* argmax, int64_t planes, int64_t H,
                                 int64_t W) = 0;

  // --- Embeddings: y (B*T, C) = wte[tokens] + wpe[t]; tokens already checked in [0, V) on the host.
  // wpe null: no position term (T5), y = wte[tokens].
  virtual void embedding_forward(float* y, const int32_t* tokens, const float* wte, const float* wpe, int64_t B,
                                 int64_t T, int64_t C) = 0;
  // dwte[tokens] += dy, dwpe[t] += dy (atomics on device: duplicates add up); dwpe null: skipped.
  // A negative token adds nothing: nn.Embedding's padding_idx (the caller maps that id to -1).
  virtual void embedding_backward(float* dwte, float* dwpe, const float* dy, const int32_t* tokens, int64_t B,
                                  int64_t T, int64_t C) = 0;

  // --- Losses over rows of (rows, C) log-probabilities and i32 targets. Host values: waits.
  // A negative target (HF's ignore_index -100) ignores its row: it adds 0 to the sum, is not
  // counted as correct, and gets a zero gradient row.
  // Sum over rows of -logp[r, t[r]] and the count of rows whose argmax (first max) is t[r].
  virtual void nll_sum(const float* logp, const int32_t* targets, int64_t rows, int64_t C, double* sum,
                       int64_t* correct) = 0;
  // d (rows, C) = 0 except d[r, t[r]] = g.
  virtual void nll_backward(float* d, const int32_t* targets, int64_t rows, int64_t C, float g) = 0;
  // d = (exp(logp) - onehot(t)) * inv_n.
  virtual void cross_entropy_backward(float* d, const float* logp, const int32_t* targets, int64_t rows, int64_t C,
                                      float inv_n) = 0;
  // Cross-entropy from the logits themselves, no (rows, C) log-probabilities in memory: lse (rows)
  // each row's log-sum-exp (log_softmax_forward's arithmetic, so logits - lse are its bits), the
  // sum over rows of -(logits[r, t] - lse[r]) and the count of rows whose logits' argmax (first
  // max) is t. Host values: waits.
  virtual void cross_entropy_sum(const float* logits, const int32_t* targets, int64_t rows, int64_t C, float* lse,
                                 double* sum, int64_t* correct) = 0;
  // d = (exp(logits - lse) - onehot(t)) * inv_n, cross_entropy_backward's bits; d may be the
  // logits themselves (in place: the loss's gradient takes the logits' memory).
  virtual void cross_entropy_backward_logits(float* d, const float* logits, const float* lse, const int32_t* targets,
                                             int64_t rows, int64_t C, float inv_n) = 0;

  // --- Optimizers on flat shards (n elements), kernel_math.h's update per element.
  virtual void adamw_step(float* p, const float* g, float* exp_avg, float* exp_avg_sq, int64_t n,
                          const AdamWArgs& a) = 0;
  virtual void sgd_step(float* p, const float* g, float* momentum_buffer, int64_t n, const SgdArgs& a) = 0;
  virtual void adadelta_step(float* p, const float* g, float* square_avg, float* acc_delta, int64_t n,
                             const AdadeltaArgs& a) = 0;

  // --- Fused attention (FusedAttentionShape). fused_attention_unavailable: "" where this kernel
  // set has it, else one line saying why (the CPU's; a GPU build without the cuDNN frontend; no
  // libcudnn on this machine). Workspace: device bytes the call needs (the caller allocates them).
  // backward: dqkv (B, T, 3C) overwritten from dO (B, T, C) and the forward's o and stats.
  virtual std::string fused_attention_unavailable() {
    return "fused attention runs on a GPU (cuDNN); on the CPU, model.attention: recompute keeps the same "
           "memory (no (T, T) probabilities between forward and backward)";
  }
  virtual int64_t fused_attention_workspace_bytes(const FusedAttentionShape& s, bool backward);
  virtual void fused_attention_forward(const FusedAttentionShape& s, const uint16_t* qkv, uint16_t* o, float* stats,
                                       void* workspace);
  virtual void fused_attention_backward(const FusedAttentionShape& s, const uint16_t* qkv, const uint16_t* o,
                                        const uint16_t* dO, const float* stats, uint16_t* dqkv, void* workspace);

  // --- FSDP: precision casts (round to nearest even, as torch's .to()) and reductions.
  virtual void cast(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) = 0;
  // x[i] = x[i] rounded to nearest even in `dtype` (bf16 or f16; f32: nothing) and kept in f32:
  // fsdp.mixed_precision.compute: param_dtype rounds every op's output so (RunCtx::round), the
  // values a tensor of that dtype would hold.
  virtual void round_to(float* x, DType dtype, int64_t n) = 0;
  // Sum of squares in f64 (clip_grad_norm's partial sum). Host value: waits.
  virtual double sum_squares(const float* x, int64_t n) = 0;
  // True when every element is finite. Host value: waits.
  virtual bool all_finite(const float* x, int64_t n) = 0;

  // How gemm, gemm_strided_batched and the linear kernels treat f32 operands from the next call
  // on (train.matmul_precision; tensor/matmul_precision.h). A setting of this kernel set only.
  virtual void set_matmul_precision(MatmulPrecision p) { precision_ = p; }
  MatmulPrecision matmul_precision() const { return precision_; }
  // linear_backward_bf16_x's precondition, one message for every implementation.
  void require_medium_for_bf16_x() const {
    if (precision_ != MatmulPrecision::medium)
      throw Error("linear_backward_bf16_x at matmul_precision " + std::string(matmul_precision_name(precision_)) +
                  ": a bf16 input is the GEMM's rounded operand only at medium");
  }

 protected:
  MatmulPrecision precision_ = MatmulPrecision::highest;
};

// The host implementation (tensor/cpu_kernels.cpp): a set of one's own (a runtime's), and the
// process-wide one that tests and helpers share (its matmul precision stays highest).
std::unique_ptr<Kernels> make_cpu_kernels();
Kernels& cpu_kernels();

}  // namespace fsdp
