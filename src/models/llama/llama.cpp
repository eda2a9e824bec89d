// LlamaForCausalLM as a module tree (models/llama/llama.h). Every piece is a Layer (one input, one
// output), so FSDP units, hooks and activation checkpointing work on any of them; the rotary
// tables every attention reads live in the model's LlamaState. Shapes: B batch, T positions, C
// hidden_size, H heads, G key/value heads (num_key_value_heads), R = H / G query heads per key/value
// head, D = C / H head dim, I intermediate_size, V vocab.
#include "models/llama/llama.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "models/generate.h"
#include "nn/layers.h"
#include "tensor/error.h"

namespace fsdp {

void llama_rope_tables(float* cos, float* sin, int64_t positions, int64_t head_dim, double theta,
                       double scaling_factor) {
  const int64_t half = head_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {  // 1.0 / (base ** (arange(0, dim, 2).float() / dim)), in f32
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv_freq[static_cast<size_t>(i)] = 1.0f / std::pow(static_cast<float>(theta), exponent);
  }
  const auto scale = static_cast<float>(scaling_factor);
  for (int64_t p = 0; p < positions; ++p) {
    // t = arange(positions) (/ scaling_factor), freqs = outer(t, inv_freq), then cos and sin.
    const float t = scale == 1.0f ? static_cast<float>(p) : static_cast<float>(p) / scale;
    for (int64_t i = 0; i < half; ++i) {
      const float f = t * inv_freq[static_cast<size_t>(i)];
      cos[p * half + i] = std::cos(f);
      sin[p * half + i] = std::sin(f);
    }
  }
}

namespace {

// A Linear initialised as HF's LlamaPreTrainedModel._init_weights does: N(0, initializer_range),
// bias zero.
void hf_init(Linear& l, const LlamaConfig& c) {
  l.weight.init = ParamInit::normal(c.initializer_range);
  if (l.bias) l.bias->init = {ParamInit::Kind::constant, 0.0f, 0.0f};
}

// Decoding (generate()): the keys and values of the positions so far (HF's past_key_values), per
// decoder layer; the prompt is read in one forward, then one position per sequence per step.
struct LlamaCache {
  struct Layer {
    Tensor k, v;  // (N, Tmax, G*D): sequence n's position p at (n * Tmax + p) * G*D
  };
  int64_t t = 0;     // positions cached so far: the next forward's first position
  int64_t Tmax = 0;  // positions at most
  std::vector<Layer> layers;
};

// What every block reads: the rotary tables of positions [0, positions), made on the host and put
// where the kernels run, and while decoding the cache.
struct LlamaState {
  Tensor cos, sin;  // (positions, D/2)
  int64_t positions = 0;
  LlamaCache* cache = nullptr;  // set while decoding; training: null
};

// LlamaAttention: q_proj (H*D, C), k_proj and v_proj (G*D, C), o_proj (C, H*D); rotary embedding
// on q and k; scores q.k / sqrt(D), causal softmax, dropout; query head h reads key/value head
// h / R (HF's repeat_kv). x (B, T, C) -> (B, T, C).
class LlamaAttention : public Layer {
 public:
  LlamaAttention(const std::string& name, const LlamaConfig& c, LlamaState& state, size_t layer)
      : Layer(name, "LlamaAttention"),
        q_proj(add_child<Linear>(child_name("q_proj"), c.hidden_size, c.hidden_size, c.attention_bias)),
        k_proj(add_child<Linear>(child_name("k_proj"), c.hidden_size, kv_width(c), c.attention_bias)),
        v_proj(add_child<Linear>(child_name("v_proj"), c.hidden_size, kv_width(c), c.attention_bias)),
        o_proj(add_child<Linear>(child_name("o_proj"), c.hidden_size, c.hidden_size, c.attention_bias)),
        dropout(add_child<Dropout>(child_name("attention_dropout"), c.attention_dropout)),
        H_(c.num_attention_heads),
        G_(c.num_key_value_heads),
        D_(c.hidden_size / c.num_attention_heads),
        layer_(layer),
        state_(state) {
    for (Linear* l : {&q_proj, &k_proj, &v_proj, &o_proj}) hf_init(*l, c);
  }

  const Tensor& do_forward(RunCtx& ctx, const Tensor& x) override {
    const int64_t B = x.dim(0), Tq = x.dim(1), pos0 = state_.cache ? state_.cache->t : 0;
    Kernels& kernels = ctx.kernels();
    // The projections' outputs, rotated in place: what the scores and their gradients read.
    Q_ = q_proj.forward(ctx, x);
    K_ = k_proj.forward(ctx, x);
    V_ = v_proj.forward(ctx, x);
    kernels.rope(Q_.f32(), state_.cos.f32(), state_.sin.f32(), B * Tq, Tq, H_, D_, H_ * D_, pos0, false);
    kernels.rope(K_.f32(), state_.cos.f32(), state_.sin.f32(), B * Tq, Tq, G_, D_, G_ * D_, pos0, false);
    // One rounding of each rotated value, where HF's bf16 q * cos + rotate_half(q) * sin rounds
    // three times (cos and sin in bf16 too): the last bits may differ there.
    ctx.round(Q_);
    ctx.round(K_);
    const Keys keys = state_.cache ? cached_keys(ctx, B, Tq) : Keys{K_.f32(), V_.f32(), Tq, Tq * G_ * D_};
    const int64_t Tk = keys.count;  // pos0 + Tq
    ctx.ensure(probs_, {B, H_, Tq, Tk}, DType::f32);
    const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D_)));
    // Query row i is position pos0 + i and reads the keys j <= pos0 + i, so a block of rows
    // [r0, r1) needs the keys < pos0 + r1 only (a decoding step: one row, every cached key). The
    // columns past them are masked: never computed; the softmax writes their zeros.
    const int64_t block = kernels.causal_row_block(Tq);
    each_group(B, Tq, Tk, keys.sample_stride, [&](const Heads& h) {  // scores (Tq, Tk) = q_h k_g^T / sqrt(D)
      for_causal_blocks(Tq, block, [&](int64_t r0, int64_t r1) {
        kernels.gemm_strided_batched(false, true, r1 - r0, pos0 + r1, D_, scale, Q_.f32() + h.q + r0 * H_ * D_, H_ * D_,
                                     h.q_stride, keys.k + h.kv, G_ * D_, D_, 0.0f, probs_.f32() + h.p + r0 * Tk, Tk,
                                     h.p_stride, G_);
      });
    });
    // In param_dtype, as the scaled_dot_product_attention HF's LlamaSdpaAttention calls (flash
    // attention): f32 scores and statistics, exp(s - max) rounded as the operand of P @ v, the
    // output divided by the row's f32 sum and rounded (nn/attention.cpp's materialised path).
    const DType flash = ctx.compute_dtype;
    if (flash == DType::f32) {
      kernels.causal_softmax_forward(probs_.f32(), CausalRows{B * H_, Tq, pos0, Tk}, nullptr, nullptr);
    } else {
      ctx.ensure(row_max_, {B, H_, Tk}, DType::f32);
      ctx.ensure(row_inv_, {B, H_, Tk}, DType::f32);
      kernels.causal_softmax_flash(probs_.f32(), CausalRows{B * H_, Tq, pos0, Tk}, row_max_.f32(), row_inv_.f32(),
                                   flash);
      ctx.rounded(probs_);
    }
    dropped_ = dropout.forward(ctx, probs_);
    ctx.ensure(y_, {B, Tq, H_ * D_}, DType::f32);
    each_group(B, Tq, Tk, keys.sample_stride, [&](const Heads& h) {  // y_h (Tq, D) = P_h @ v_g, heads side by side
      for_causal_blocks(Tq, block, [&](int64_t r0, int64_t r1) {
        kernels.gemm_strided_batched(false, false, r1 - r0, D_, pos0 + r1, 1.0f, dropped_.f32() + h.p + r0 * Tk, Tk,
                                     h.p_stride, keys.v + h.kv, G_ * D_, D_, 0.0f, y_.f32() + h.q + r0 * H_ * D_,
                                     H_ * D_, h.q_stride, G_);
      });
    });
    if (flash != DType::f32) {  // row i's statistics at position pos0 + i of its plane's Tk
      kernels.attention_rescale(y_.f32(), row_inv_.f32() + pos0, B, Tq, H_, D_, Tk, flash);
      ctx.rounded(y_);
    }
    out_ = o_proj.forward(ctx, y_);
    return out_;
  }

  // Training: pos0 0, Tk = T. The products with P^T and dS^T run in blocks of columns [c0, c1),
  // over the query rows >= c0 (the rows above are masked); the others in the forward's row blocks.
  const Tensor& do_backward(RunCtx& ctx, const Tensor& dy) override {
    if (state_.cache) throw Error(name() + ": no backward while decoding");
    const int64_t B = Q_.dim(0), T = Q_.dim(1), HD = H_ * D_, GD = G_ * D_;
    Kernels& kernels = ctx.kernels();
    const Tensor dY = o_proj.backward(ctx, dy);  // (B, T, H*D)
    ctx.ensure(dV_, V_.shape(), DType::f32);
    ctx.ensure(dP_, probs_.shape(), DType::f32);
    const int64_t block = kernels.causal_row_block(T);
    if (ctx.compute_dtype != DType::f32) {
      // Flash attention's P, normalised and rounded as the operand of dv's GEMM; dS uses the same
      // rounded P here (flash attention's uses its f32 P: the last bits of dS may differ).
      const CausalRows all = CausalRows::whole(B * H_, T);
      kernels.causal_softmax_normalize(probs_.f32(), all, row_inv_.f32(), ctx.compute_dtype);
      if (dropped_.raw() != probs_.raw())
        kernels.causal_softmax_normalize(dropped_.f32(), all, row_inv_.f32(), ctx.compute_dtype);
    }
    // A key/value head's gradient sums its R query heads' (repeat_kv's backward): the first writes
    // (beta 0), the others add (beta 1).
    each_group(B, T, T, T * GD, [&](const Heads& h) {
      const float beta = h.first ? 0.0f : 1.0f;
      for_causal_blocks(T, block, [&](int64_t c0, int64_t c1) {  // dv_g[c0:c1] += P_h[c0:, c0:c1]^T @ dy_h[c0:]
        kernels.gemm_strided_batched(true, false, c1 - c0, D_, T - c0, 1.0f, dropped_.f32() + h.p + c0 * T + c0, T,
                                     h.p_stride, dY.f32() + h.q + c0 * HD, HD, h.q_stride, beta,
                                     dV_.f32() + h.kv + c0 * GD, GD, D_, G_);
      });
      for_causal_blocks(T, block, [&](int64_t r0, int64_t r1) {  // dP_h[r0:r1, :r1] = dy_h[r0:r1] @ v_g[:r1]^T
        kernels.gemm_strided_batched(false, true, r1 - r0, r1, D_, 1.0f, dY.f32() + h.q + r0 * HD, HD, h.q_stride,
                                     V_.f32() + h.kv, GD, D_, 0.0f, dP_.f32() + h.p + r0 * T, T, h.p_stride, G_);
      });
    });
    ctx.round(dV_);  // an output of SDPA's backward; dP stays f32 inside it, dS rounds as an operand
    // dS = scale * P * (dP - rowsum(P dP)), the 1/sqrt(D) of the scores folded in. It reads j <= i
    // only and writes dS = 0 above the diagonal, over what the blocks left unwritten.
    Tensor dS = dropout.backward(ctx, dP_);  // writable: dP_ itself, or the dropout's own dx
    const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D_)));
    kernels.causal_softmax_backward(dS.f32(), probs_.f32(), CausalRows::whole(B * H_, T), scale);
    ctx.round(dS);
    ctx.ensure(dQ_, Q_.shape(), DType::f32);
    ctx.ensure(dK_, K_.shape(), DType::f32);
    each_group(B, T, T, T * GD, [&](const Heads& h) {
      for_causal_blocks(T, block, [&](int64_t r0, int64_t r1) {  // dq_h[r0:r1] = dS_h[r0:r1, :r1] @ k_g[:r1]
        kernels.gemm_strided_batched(false, false, r1 - r0, D_, r1, 1.0f, dS.f32() + h.p + r0 * T, T, h.p_stride,
                                     K_.f32() + h.kv, GD, D_, 0.0f, dQ_.f32() + h.q + r0 * HD, HD, h.q_stride, G_);
      });
      for_causal_blocks(T, block, [&](int64_t c0, int64_t c1) {  // dk_g[c0:c1] += dS_h[c0:, c0:c1]^T @ q_h[c0:]
        kernels.gemm_strided_batched(true, false, c1 - c0, D_, T - c0, 1.0f, dS.f32() + h.p + c0 * T + c0, T,
                                     h.p_stride, Q_.f32() + h.q + c0 * HD, HD, h.q_stride, h.first ? 0.0f : 1.0f,
                                     dK_.f32() + h.kv + c0 * GD, GD, D_, G_);
      });
    });
    // The gradients of the rotated q and k become those of the projections' outputs.
    kernels.rope(dQ_.f32(), state_.cos.f32(), state_.sin.f32(), B * T, T, H_, D_, HD, 0, true);
    kernels.rope(dK_.f32(), state_.cos.f32(), state_.sin.f32(), B * T, T, G_, D_, GD, 0, true);
    ctx.round(dQ_);  // the GEMMs' and the rotation's outputs, rounded once
    ctx.round(dK_);
    const Tensor dq = q_proj.backward(ctx, dQ_), dk = k_proj.backward(ctx, dK_), dv = v_proj.backward(ctx, dV_);
    ctx.ensure(dx_, dq.shape(), DType::f32);
    kernels.add(dx_.f32(), dq.f32(), dk.f32(), dq.numel());
    ctx.round(dx_);
    kernels.add_inplace(dx_.f32(), dv.f32(), dv.numel());
    ctx.round(dx_);
    return dx_;
  }

  void release_activations() override {
    Q_ = K_ = V_ = probs_ = dropped_ = y_ = out_ = dV_ = dP_ = dQ_ = dK_ = dx_ = row_max_ = row_inv_ = Tensor();
    for (Layer* l : std::array<Layer*, 5>{&q_proj, &k_proj, &v_proj, &o_proj, &dropout}) l->release_activations();
  }
  void drop_output() override { out_ = Tensor(); }  // o_proj's: backward starts from dy

  Linear& q_proj;
  Linear& k_proj;
  Linear& v_proj;
  Linear& o_proj;
  Dropout& dropout;  // on the probabilities (HF: F.dropout(p=attention_dropout))

 private:
  static int64_t kv_width(const LlamaConfig& c) {
    return c.num_key_value_heads * (c.hidden_size / c.num_attention_heads);
  }

  // Where the keys and values the queries read are: sample b's key j at k + b * sample_stride +
  // j * G*D (values alike at v); `count` keys.
  struct Keys {
    const float* k;
    const float* v;
    int64_t count, sample_stride;
  };

  // Decoding: this forward's keys and values (B, Tq, G*D) appended to the layer's cache at
  // positions [t, t + Tq); the queries read positions [0, t + Tq).
  Keys cached_keys(RunCtx& ctx, int64_t B, int64_t Tq) {
    LlamaCache& cache = *state_.cache;
    LlamaCache::Layer& layer = cache.layers.at(layer_);
    const int64_t W = G_ * D_;
    if (cache.t + Tq > cache.Tmax)
      throw Error(name() + ": " + std::to_string(cache.t + Tq) + " positions, more than the " +
                  std::to_string(cache.Tmax) + " the decoding was set up for");
    for (auto [src, dst] : {std::pair{&K_, &layer.k}, std::pair{&V_, &layer.v}}) {
      ctx.ensure(*dst, {B, cache.Tmax, W}, DType::f32);
      for (int64_t b = 0; b < B; ++b)
        ctx.kernels().cast(dst->f32() + (b * cache.Tmax + cache.t) * W, DType::f32, src->f32() + b * Tq * W, DType::f32,
                           Tq * W);
    }
    return {layer.k.f32(), layer.v.f32(), cache.t + Tq, cache.Tmax * W};
  }

  // One batched GEMM's worth of heads: query heads g * R + r of sample b for g = 0..G-1 (element
  // offsets into the (B, Tq, H*D) q side, the k/v side (samples kv_stride apart) and the
  // (B, H, Tq, Tk) scores, and the strides between consecutive g). first: r == 0.
  struct Heads {
    int64_t q, kv, p, q_stride, p_stride;
    bool first;
  };
  template <class Fn>
  void each_group(int64_t B, int64_t Tq, int64_t Tk, int64_t kv_stride, Fn&& fn) const {
    const int64_t R = H_ / G_;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t r = 0; r < R; ++r)
        fn(Heads{b * Tq * H_ * D_ + r * D_, b * kv_stride, (b * H_ + r) * Tq * Tk, R * D_, R * Tq * Tk, r == 0});
  }

  int64_t H_, G_, D_;
  size_t layer_;  // the decoder layer's index: its layer of the decoding cache
  LlamaState& state_;
  Tensor Q_, K_, V_;          // (B, T, H*D), (B, T, G*D) x2: rotated q and k, v
  Tensor probs_;              // (B, H, T, T) softmax probabilities
  Tensor dropped_;            // the same after dropout (probs_ itself when dropout is off)
  Tensor row_max_, row_inv_;  // (B, H, Tk): flash attention's row statistics (compute: param_dtype)
  Tensor y_, out_;            // (B, T, H*D) heads side by side; (B, T, C) after o_proj
  Tensor dV_, dP_, dQ_, dK_, dx_;
};

// LlamaMLP: down_proj(silu(gate_proj(x)) * up_proj(x)). x (B, T, C) -> (B, T, C), I in between.
class LlamaMLP : public Layer {
 public:
  LlamaMLP(const std::string& name, const LlamaConfig& c)
      : Layer(name, "LlamaMLP"),
        gate_proj(add_child<Linear>(child_name("gate_proj"), c.hidden_size, c.intermediate_size, false)),
        up_proj(add_child<Linear>(child_name("up_proj"), c.hidden_size, c.intermediate_size, false)),
        down_proj(add_child<Linear>(child_name("down_proj"), c.intermediate_size, c.hidden_size, false)),
        act_fn(add_child<SiLU>(child_name("act_fn"))) {
    for (Linear* l : {&gate_proj, &up_proj, &down_proj}) hf_init(*l, c);
  }
  const Tensor& do_forward(RunCtx& ctx, const Tensor& x) override {
    act_ = act_fn.forward(ctx, gate_proj.forward(ctx, x));
    up_ = up_proj.forward(ctx, x);
    ctx.ensure(h_, act_.shape(), DType::f32);
    ctx.kernels().mul(h_.f32(), act_.f32(), up_.f32(), h_.numel());
    ctx.round(h_);
    out_ = down_proj.forward(ctx, h_);
    return out_;
  }
  const Tensor& do_backward(RunCtx& ctx, const Tensor& dy) override {
    const Tensor dh = down_proj.backward(ctx, dy);
    Kernels& kernels = ctx.kernels();
    ctx.ensure(dact_, dh.shape(), DType::f32);
    ctx.ensure(dup_, dh.shape(), DType::f32);
    kernels.mul(dact_.f32(), dh.f32(), up_.f32(), dh.numel());
    kernels.mul(dup_.f32(), dh.f32(), act_.f32(), dh.numel());
    ctx.round(dact_);
    ctx.round(dup_);
    const Tensor dg = gate_proj.backward(ctx, act_fn.backward(ctx, dact_));
    const Tensor du = up_proj.backward(ctx, dup_);
    ctx.ensure(dx_, dg.shape(), DType::f32);
    kernels.add(dx_.f32(), dg.f32(), du.f32(), dg.numel());
    ctx.round(dx_);
    return dx_;
  }
  void release_activations() override {
    act_ = up_ = h_ = out_ = dact_ = dup_ = dx_ = Tensor();
    for (Layer* l : std::array<Layer*, 4>{&gate_proj, &up_proj, &down_proj, &act_fn}) l->release_activations();
  }
  void drop_output() override { out_ = Tensor(); }  // down_proj's: backward starts from dy

  Linear& gate_proj;
  Linear& up_proj;
  Linear& down_proj;
  SiLU& act_fn;

 private:
  Tensor act_, up_, h_, out_, dact_, dup_, dx_;
};

// LlamaDecoderLayer: h = x + self_attn(input_layernorm(x)); y = h + mlp(post_attention_layernorm(h)).
// Registered as HF registers it (self_attn, mlp, then the norms). The transformer_layer policy's unit.
class LlamaDecoderLayer : public Layer {
 public:
  LlamaDecoderLayer(const std::string& name, const LlamaConfig& c, LlamaState& state, size_t index)
      : Layer(name, "LlamaDecoderLayer"),
        self_attn(add_child<LlamaAttention>(child_name("self_attn"), c, state, index)),
        mlp(add_child<LlamaMLP>(child_name("mlp"), c)),
        input_layernorm(
            add_child<RMSNorm>(child_name("input_layernorm"), "LlamaRMSNorm", c.hidden_size, c.rms_norm_eps)),
        post_attention_layernorm(add_child<RMSNorm>(child_name("post_attention_layernorm"), "LlamaRMSNorm",
                                                    c.hidden_size, c.rms_norm_eps)) {}
  const Tensor& do_forward(RunCtx& ctx, const Tensor& x) override {
    Kernels& kernels = ctx.kernels();
    // h = x + self_attn(...) and post_attention_layernorm(h) in one pass (RMSNorm::forward_adding).
    const Tensor n =
        post_attention_layernorm.forward_adding(ctx, x, self_attn.forward(ctx, input_layernorm.forward(ctx, x)), h_);
    const Tensor m = mlp.forward(ctx, n);
    ctx.ensure(y_, x.shape(), DType::f32);
    kernels.add(y_.f32(), h_.f32(), m.f32(), x.numel());
    ctx.round(y_);
    return y_;
  }
  const Tensor& do_backward(RunCtx& ctx, const Tensor& dy) override {
    // Each residual's gradient added in its norm's own dx pass.
    const Tensor dh = post_attention_layernorm.backward_adding(ctx, mlp.backward(ctx, dy), dy);
    dx_ = input_layernorm.backward_adding(ctx, self_attn.backward(ctx, dh), dh);
    return dx_;
  }
  void release_activations() override {
    h_ = y_ = dx_ = Tensor();
    for (Layer* l : std::array<Layer*, 4>{&self_attn, &mlp, &input_layernorm, &post_attention_layernorm})
      l->release_activations();
  }

  LlamaAttention& self_attn;
  LlamaMLP& mlp;
  RMSNorm& input_layernorm;
  RMSNorm& post_attention_layernorm;

 private:
  Tensor h_, y_, dx_;
};

// LlamaModel ("model"): embed_tokens, the decoder layers, norm. ids (B, T) i32 -> (B, T, C).
class LlamaModel : public Layer {
 public:
  LlamaModel(const std::string& name, const LlamaConfig& c) : Layer(name, "LlamaModel"), c_(c) {
    embed_tokens = &add_child<Embedding>(child_name("embed_tokens"), c.vocab_size, c.hidden_size);
    embed_tokens->weight.init = ParamInit::normal(c.initializer_range);
    embed_tokens->weight.init.zero_row = c.pad_token_id;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      layers_.push_back(
          &add_child<LlamaDecoderLayer>(child_name("layers." + std::to_string(i)), c, state_, static_cast<size_t>(i)));
    norm = &add_child<RMSNorm>(child_name("norm"), "LlamaRMSNorm", c.hidden_size, c.rms_norm_eps);
    need_input_grad = false;
  }

  const Tensor& do_forward(RunCtx& ctx, const Tensor& ids) override {
    const int64_t B = ids.dim(0), T = ids.dim(1), C = c_.hidden_size;
    ensure_rope_tables(ctx, state_.cache ? state_.cache->Tmax : T);
    ids_ = ids;
    ctx.pre_forward(*embed_tokens);  // read here, not called: its hooks run here (size_based may make it a unit)
    ctx.ensure(emb_, {B, T, C}, DType::f32);
    ctx.kernels().embedding_forward(emb_.f32(), ids.i32(), embed_tokens->weight.data, nullptr, B, T, C);
    ctx.post_forward(*embed_tokens);
    Tensor h = emb_;
    for (LlamaDecoderLayer* l : layers_) h = l->forward(ctx, h);
    out_ = norm->forward(ctx, h);
    return out_;
  }

  // Decoding: forward reads (N, Tq) ids at positions cache->t.. and extends `cache`; null ends it.
  void set_decode_cache(LlamaCache* cache) {
    state_.cache = cache;
    if (cache) cache->layers.resize(layers_.size());
  }

  const Tensor& do_backward(RunCtx& ctx, const Tensor& dy) override {
    Tensor d = norm->backward(ctx, dy);
    for (size_t i = layers_.size(); i-- > 0;) d = layers_[i]->backward(ctx, d);
    ctx.pre_backward(*embed_tokens);
    ctx.kernels().embedding_backward(embed_tokens->weight.grad, nullptr, d.f32(), grad_ids(ctx).i32(), ids_.dim(0),
                                     ids_.dim(1), c_.hidden_size);
    ctx.post_backward(*embed_tokens);
    return none_;  // token ids have no gradient
  }

  void release_activations() override {
    ids_ = emb_ = out_ = pad_masked_ = Tensor();
    for (LlamaDecoderLayer* l : layers_) l->release_activations();
    norm->release_activations();
  }

  Embedding* embed_tokens = nullptr;
  RMSNorm* norm = nullptr;

 private:
  // The tables of positions [0, T): made on the host, put where the kernels run, kept for the
  // next batch of the same length (a position's angles do not depend on the table's length).
  void ensure_rope_tables(RunCtx& ctx, int64_t T) {
    if (state_.positions == T) return;
    const int64_t half = c_.hidden_size / c_.num_attention_heads / 2;
    Tensor cos = Tensor::empty({T, half}, DType::f32, MemCategory::activations, ctx.mem);
    Tensor sin = Tensor::empty({T, half}, DType::f32, MemCategory::activations, ctx.mem);
    llama_rope_tables(cos.f32(), sin.f32(), T, 2 * half, c_.rope_theta, c_.rope_scaling_factor);
    state_.cos = ctx.to_run_device(cos);
    state_.sin = ctx.to_run_device(sin);
    state_.positions = T;
  }

  // The ids the embedding's gradient reads: the inputs, or with a padding_idx a copy with that id
  // as -1 (nn.Embedding gives its row no gradient; the kernel skips negative ids).
  const Tensor& grad_ids(RunCtx& ctx) {
    if (c_.pad_token_id < 0) return ids_;
    const Tensor ids = ctx.to_host_memory(ids_);
    Tensor host = Tensor::empty(ids_.shape(), DType::i32, MemCategory::activations, ctx.mem);
    for (int64_t i = 0; i < ids_.numel(); ++i) host.i32()[i] = ids.i32()[i] == c_.pad_token_id ? -1 : ids.i32()[i];
    pad_masked_ = ctx.to_run_device(host);
    return pad_masked_;
  }

  const LlamaConfig& c_;
  LlamaState state_;
  std::vector<LlamaDecoderLayer*> layers_;
  Tensor ids_, emb_, out_, none_;
  Tensor pad_masked_;  // (B, T) i32: ids with the padding id as -1, during backward
};

// generate()'s steps: the prompts (N, P) read in one forward of the model's own modules, filling
// the cache; the first step returns the logits of each prompt's last position, every later step
// feeds one token per sequence. No dropout (not training).
class LlamaDecoding final : public DecodeSteps {
 public:
  LlamaDecoding(RunCtx& ctx, const LlamaConfig& c, LlamaModel& model, LmHead& head, const Tensor& prompts,
                int64_t max_new_tokens)
      : ctx_(ctx), c_(c), model_(model), head_(head), N_(prompts.dim(0)) {
    const int64_t P = prompts.dim(1);
    cache_.Tmax = P + max_new_tokens;
    model_.set_decode_cache(&cache_);
    const Tensor logits = head_.forward(ctx_, model_.forward(ctx_, prompts));  // (N, P, V)
    cache_.t = P;
    keep_rows(logits, P - 1, P);
  }
  ~LlamaDecoding() override {
    model_.set_decode_cache(nullptr);
    model_.release_activations();
    head_.release_activations();
  }
  LlamaDecoding(const LlamaDecoding&) = delete;
  LlamaDecoding& operator=(const LlamaDecoding&) = delete;

  int64_t vocab_size() const override { return c_.vocab_size; }

  const float* step(std::span<const int32_t> tokens, std::span<const int32_t> origin) override {
    for (int64_t i = 0; i < N_; ++i)
      if (origin[static_cast<size_t>(i)] != i) throw Error("llama generate: no beam search (generate.num_beams 1)");
    if (first_) {  // the prompt's forward already gave this step's logits
      first_ = false;
      return last_.data();
    }
    Tensor ids = Tensor::empty({N_, 1}, DType::i32, MemCategory::activations, ctx_.mem);
    for (int64_t i = 0; i < N_; ++i) {
      const int32_t id = tokens[static_cast<size_t>(i)];
      if (id < 0 || id >= c_.vocab_size)
        throw Error("llama generate: token " + std::to_string(id) + " outside the vocab");
      ids.i32()[i] = id;
    }
    const Tensor logits = head_.forward(ctx_, model_.forward(ctx_, ctx_.to_run_device(ids)));  // (N, 1, V)
    ++cache_.t;
    keep_rows(logits, 0, 1);
    return last_.data();
  }

 private:
  // Position `at` of each sequence's (T, V) logits, on the host, as (N, V).
  void keep_rows(const Tensor& logits, int64_t at, int64_t T) {
    const int64_t V = c_.vocab_size;
    const Tensor host = ctx_.to_host_memory(logits);
    last_.resize(static_cast<size_t>(N_ * V));
    for (int64_t i = 0; i < N_; ++i) std::copy_n(host.f32() + (i * T + at) * V, V, last_.data() + i * V);
  }

  RunCtx& ctx_;
  const LlamaConfig& c_;
  LlamaModel& model_;
  LmHead& head_;
  int64_t N_;
  LlamaCache cache_;
  bool first_ = true;
  std::vector<float> last_;  // (N, V) the latest step's logits
};

class LlamaForCausalLM : public Model {
 public:
  explicit LlamaForCausalLM(const LlamaConfig& c)
      : Model("LlamaForCausalLM", std::make_unique<CrossEntropyLoss>(kIgnoreIndex)), c_(c) {
    model_ = &add_child<LlamaModel>("model", c_);
    lm_head_ = &add_child<LmHead>("lm_head", c.hidden_size, c.vocab_size, ParamInit::normal(c.initializer_range),
                                  c.tie_word_embeddings ? &model_->embed_tokens->weight : nullptr);
  }
  std::vector<std::string> block_types() const override { return {"LlamaDecoderLayer"}; }

  std::vector<std::vector<int32_t>> generate(RunCtx& ctx, const Tensor& prompts, const GenerateOptions& o) override {
    if (prompts.ndim() != 2 || prompts.dim(1) < 1)
      throw Error("llama generate: prompts " + shape_str(prompts.shape()) + " are not (B, P) with P >= 1");
    if (o.num_beams != 1) throw Error("llama generate: beam search is not implemented (generate.num_beams 1)");
    const Tensor host = ctx.to_host_memory(prompts);
    for (int64_t i = 0; i < host.numel(); ++i)
      if (host.i32()[i] < 0 || host.i32()[i] >= c_.vocab_size)
        throw Error("llama generate: prompt token " + std::to_string(host.i32()[i]) + " outside vocab_size " +
                    std::to_string(c_.vocab_size));
    GenerateOptions lm = o;
    lm.eos_id = static_cast<int32_t>(c_.eos_token_id);
    lm.pad_id = static_cast<int32_t>(c_.pad_token_id >= 0 ? c_.pad_token_id : c_.eos_token_id);  // HF's fallback
    LlamaDecoding steps(ctx, c_, *model_, *lm_head_, prompts, o.max_new_tokens);
    return greedy_search(steps, prompts.dim(0), lm);
  }

 protected:
  Tensor run_forward(RunCtx& ctx, const Tensor& inputs, const Tensor& targets) override {
    if (inputs.ndim() != 2 || targets.shape() != inputs.shape())
      throw Error("llama: inputs " + shape_str(inputs.shape()) + " and targets " + shape_str(targets.shape()) +
                  " are not both (B, T)");
    return lm_head_->forward(ctx, model_->forward(ctx, inputs));
  }
  Tensor run_backward(RunCtx& ctx, const Tensor& d_logits) override {
    model_->backward(ctx, lm_head_->backward(ctx, d_logits));
    return Tensor();
  }

 private:
  static constexpr int32_t kIgnoreIndex = -100;
  LlamaConfig c_;
  LlamaModel* model_ = nullptr;
  LmHead* lm_head_ = nullptr;
};

}  // namespace

std::unique_ptr<Model> make_llama(const LlamaConfig& config) {
  if (config.hidden_size % config.num_attention_heads != 0 ||
      config.num_attention_heads % config.num_key_value_heads != 0 ||
      (config.hidden_size / config.num_attention_heads) % 2 != 0)
    throw Error("llama: hidden_size " + std::to_string(config.hidden_size) + ", num_attention_heads " +
                std::to_string(config.num_attention_heads) + " and num_key_value_heads " +
                std::to_string(config.num_key_value_heads) +
                " need heads dividing the width, key/value heads dividing the heads and an even head dim");
  return std::make_unique<LlamaForCausalLM>(config);
}

}  // namespace fsdp
