// T5ForConditionalGeneration as a module tree (models/t5.h). Every piece is a Layer (one input,
// one output), so FSDP units, hooks and activation checkpointing work on any of them; what a
// block reads besides its hidden state (the padding mask, the position bias block 0 computes,
// the encoder's output) and the gradients several blocks add up travel in its stack's
// StackState. Shapes: B batch, S source length, L target length, T a stack's length, C d_model,
// H heads, I = H * d_kv the inner attention width, F d_ff, V vocab.
#include "models/t5/t5.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "models/t5/t5_buckets.h"
#include "nn/layers.h"
#include "tensor/error.h"

namespace fsdp {

namespace {

// Decoding (generate()): the decoder runs one position per running sequence per step, against the
// keys and values of the positions before it (HF's past_key_values). N sequences, I = H * d_kv.
struct DecodeCache {
  struct Layer {
    Tensor k, v;              // (Tmax, N, I) self-attention keys and values, position-major: a
                              // step writes one contiguous (N, I) slab
    Tensor cross_k, cross_v;  // (N, S, I) of the encoder output, computed at the first step
  };
  int64_t t = 0;              // the position this step feeds
  int64_t Tmax = 0;           // positions at most
  std::vector<Layer> layers;  // per decoder block
};

struct StackState {
  bool decoder = false;
  DecodeCache* cache = nullptr;  // set while decoding (decoder only); training: null
  Tensor key_valid;              // (B, S) i32, 1 = a real source token: the encoder's keys, the cross-attention's
  Tensor bucket;                 // (T, T) i32 relative position buckets of the self-attention
  int64_t bucket_T = -1;         // the length `bucket` was made for
  Tensor position_bias;          // (H, T, T) from block 0's relative_attention_bias, read by every block
  Tensor d_position_bias;        // (H, T, T) the score gradients summed over blocks and samples
  Tensor encoder_out;            // decoder: (B, S, C), every cross-attention's keys and values
  Tensor d_encoder_out;          // decoder: (B, S, C) its gradient, summed over the cross-attentions
  Tensor ones;                   // (B) ones: sums score gradients over samples with one GEMM
};

// T5Attention: q, k, v, o without bias; scores q.k unscaled, plus the position bias (self-
// attention) and the masks; softmax; dropout on the probabilities. Self-attention: keys and
// values from the input; cross-attention: from the encoder's output (StackState).
// x (B, Tq, C) -> (B, Tq, C).
class T5Attention : public Layer {
 public:
  T5Attention(const std::string& name, const T5Config& c, bool cross, bool relative_bias, StackState& state,
              size_t block)
      : Layer(name, "T5Attention"),
        q(add_child<Linear>(child_name("q"), c.d_model, c.num_heads * c.d_kv, false)),
        k(add_child<Linear>(child_name("k"), c.d_model, c.num_heads * c.d_kv, false)),
        v(add_child<Linear>(child_name("v"), c.d_model, c.num_heads * c.d_kv, false)),
        o(add_child<Linear>(child_name("o"), c.num_heads * c.d_kv, c.d_model, false)),
        dropout(add_child<Dropout>(child_name("dropout"), c.dropout_rate)),
        H_(c.num_heads),
        dkv_(c.d_kv),
        cross_(cross),
        block_(block),
        state_(state) {
    const double f = c.initializer_factor, d_model = static_cast<double>(c.d_model);
    const double inner = static_cast<double>(c.num_heads * c.d_kv);
    q.weight.init = ParamInit::normal(f * std::pow(d_model * static_cast<double>(c.d_kv), -0.5));
    k.weight.init = ParamInit::normal(f * std::pow(d_model, -0.5));
    v.weight.init = ParamInit::normal(f * std::pow(d_model, -0.5));
    o.weight.init = ParamInit::normal(f * std::pow(inner, -0.5));
    if (relative_bias) {
      relative_attention_bias =
          &add_child<Embedding>(child_name("relative_attention_bias"), c.relative_attention_num_buckets, c.num_heads);
      relative_attention_bias->weight.init = ParamInit::normal(f * std::pow(d_model, -0.5));
    }
  }

  const Tensor& do_forward(RunCtx& ctx, const Tensor& x) override {
    const int64_t B = x.dim(0), Tq = x.dim(1), I = H_ * dkv_;
    Q_ = q.forward(ctx, x);
    const Keys keys = state_.cache ? cached_keys(ctx, x) : projected_keys(ctx, x);
    const int64_t Tk = keys.count, P = Tq * Tk;
    Kernels& kernels = ctx.kernels();
    if (relative_attention_bias) {  // block 0 of the stack: the bias every block adds
      // The embedding is read here, not called: its hooks run here (size_based may make it a unit).
      ctx.pre_forward(*relative_attention_bias);
      ctx.ensure(state_.position_bias, {H_, Tq, Tk}, DType::f32);
      kernels.relative_bias_forward(state_.position_bias.f32(), relative_attention_bias->weight.data,
                                    state_.bucket.i32(), H_, Tq, Tk);
      ctx.post_forward(*relative_attention_bias);
    }
    ctx.ensure(probs_, {B, H_, Tq, Tk}, DType::f32);
    for (int64_t b = 0; b < B; ++b)  // scores (H, Tq, Tk) = q k^T per head, unscaled
      kernels.gemm_strided_batched(false, true, Tq, Tk, dkv_, 1.0f, Q_.f32() + b * Tq * I, I, dkv_,
                                   keys.k + b * keys.sample_stride, keys.ld, dkv_, 0.0f, probs_.f32() + b * H_ * P, Tk,
                                   P, H_);
    ctx.round(probs_);  // the scores, an op's output (the bias is added in f32 inside the softmax)
    // A decoding step's query is the last position: every cached key is at or before it.
    const bool causal = state_.decoder && !cross_ && !state_.cache;
    const float* bias = cross_ ? nullptr : state_.position_bias.f32();
    const int32_t* key_valid = cross_ || !state_.decoder ? state_.key_valid.i32() : nullptr;  // the source's pads
    kernels.attention_softmax_forward(probs_.f32(), bias, key_valid, causal, B, H_, Tq, Tk);
    ctx.round(probs_);
    dropped_ = dropout.forward(ctx, probs_);
    ctx.ensure(y_, {B, Tq, I}, DType::f32);
    for (int64_t b = 0; b < B; ++b)  // y_h (Tq, dkv) = P (Tq, Tk) @ v_h (Tk, dkv), heads side by side
      kernels.gemm_strided_batched(false, false, Tq, dkv_, Tk, 1.0f, dropped_.f32() + b * H_ * P, Tk, P,
                                   keys.v + b * keys.sample_stride, keys.ld, dkv_, 0.0f, y_.f32() + b * Tq * I, I, dkv_,
                                   H_);
    ctx.round(y_);
    out_ = o.forward(ctx, y_);
    return out_;
  }

  const Tensor& do_backward(RunCtx& ctx, const Tensor& dy) override {
    if (state_.cache) throw Error(name() + ": no backward while decoding");
    const int64_t B = Q_.dim(0), Tq = Q_.dim(1), Tk = K_.dim(1), I = H_ * dkv_, P = Tq * Tk;
    Kernels& kernels = ctx.kernels();
    const Tensor dY = o.backward(ctx, dy);  // (B, Tq, I)
    ctx.ensure(dV_, K_.shape(), DType::f32);
    ctx.ensure(dP_, probs_.shape(), DType::f32);
    for (int64_t b = 0; b < B; ++b) {
      const float* gy = dY.f32() + b * Tq * I;
      // dv (Tk, dkv) = P^T @ dy ; dP (Tq, Tk) = dy @ v^T
      kernels.gemm_strided_batched(true, false, Tk, dkv_, Tq, 1.0f, dropped_.f32() + b * H_ * P, Tk, P, gy, I, dkv_,
                                   0.0f, dV_.f32() + b * Tk * I, I, dkv_, H_);
      kernels.gemm_strided_batched(false, true, Tq, Tk, dkv_, 1.0f, gy, I, dkv_, V_.f32() + b * Tk * I, I, dkv_, 0.0f,
                                   dP_.f32() + b * H_ * P, Tk, P, H_);
    }
    ctx.round(dV_);
    ctx.round(dP_);
    Tensor dS = dropout.backward(ctx, dP_);  // writable: dP_ itself, or the dropout's own dx
    kernels.softmax_backward(dS.f32(), probs_.f32(), B * H_ * Tq, Tk);
    ctx.round(dS);
    if (!cross_ && B > 0) {  // the bias is shared by the samples and the blocks: its gradient sums both
      // A sum over the batch written as a GEMM with ones: not a matmul of the model, so never
      // rounded by train.matmul_precision (torch sums it in f32).
      const MatmulPrecision precision = kernels.matmul_precision();
      kernels.set_matmul_precision(MatmulPrecision::highest);
      kernels.gemm(false, false, 1, H_ * P, B, 1.0f, state_.ones.f32(), B, dS.f32(), H_ * P, 1.0f,
                   state_.d_position_bias.f32(), H_ * P);
      kernels.set_matmul_precision(precision);
    }
    ctx.ensure(dQ_, Q_.shape(), DType::f32);
    ctx.ensure(dK_, K_.shape(), DType::f32);
    for (int64_t b = 0; b < B; ++b) {
      const float* s = dS.f32() + b * H_ * P;
      // dq = dS @ k ; dk = dS^T @ q
      kernels.gemm_strided_batched(false, false, Tq, dkv_, Tk, 1.0f, s, Tk, P, K_.f32() + b * Tk * I, I, dkv_, 0.0f,
                                   dQ_.f32() + b * Tq * I, I, dkv_, H_);
      kernels.gemm_strided_batched(true, false, Tk, dkv_, Tq, 1.0f, s, Tk, P, Q_.f32() + b * Tq * I, I, dkv_, 0.0f,
                                   dK_.f32() + b * Tk * I, I, dkv_, H_);
    }
    ctx.round(dQ_);
    ctx.round(dK_);
    // Block 0 runs backward last in its stack: every block's share is in d_position_bias now.
    if (relative_attention_bias) {
      ctx.pre_backward(*relative_attention_bias);
      kernels.relative_bias_backward(relative_attention_bias->weight.grad, state_.d_position_bias.f32(),
                                     state_.bucket.i32(), 1, H_, Tq, Tk);
      ctx.post_backward(*relative_attention_bias);
    }
    const Tensor dq = q.backward(ctx, dQ_), dk = k.backward(ctx, dK_), dv = v.backward(ctx, dV_);
    if (cross_) {  // keys and values came from the encoder: their gradient goes back there
      // Autograd's sums of the encoder output's gradients, each rounded in a low compute dtype.
      kernels.add_inplace(state_.d_encoder_out.f32(), dk.f32(), dk.numel());
      ctx.round(state_.d_encoder_out);
      kernels.add_inplace(state_.d_encoder_out.f32(), dv.f32(), dv.numel());
      ctx.round(state_.d_encoder_out);
      return dq_ = dq;
    }
    ctx.ensure(dx_, dq.shape(), DType::f32);
    kernels.add(dx_.f32(), dq.f32(), dk.f32(), dq.numel());
    ctx.round(dx_);
    kernels.add_inplace(dx_.f32(), dv.f32(), dv.numel());
    ctx.round(dx_);
    return dx_;
  }

  void release_activations() override {
    Q_ = K_ = V_ = probs_ = dropped_ = y_ = out_ = dV_ = dP_ = dQ_ = dK_ = dq_ = dx_ = Tensor();
    for (Layer* l : std::array<Layer*, 5>{&q, &k, &v, &o, &dropout}) l->release_activations();
  }
  void drop_output() override { out_ = Tensor(); }  // o's: backward starts from dy

  Linear& q;
  Linear& k;
  Linear& v;
  Linear& o;
  Dropout& dropout;  // on the attention probabilities (HF: F.dropout(p=dropout_rate))
  Embedding* relative_attention_bias = nullptr;

 private:
  // Where the keys and values the queries read are: sample b's key j at k + b * sample_stride +
  // j * ld (values alike at v).
  struct Keys {
    const float* k;
    const float* v;
    int64_t count, ld, sample_stride;
  };

  // Training and evaluation: the projections of the input (self) or of the encoder output (cross).
  Keys projected_keys(RunCtx& ctx, const Tensor& x) {
    const Tensor& kv = cross_ ? state_.encoder_out : x;
    const int64_t Tk = kv.dim(1), I = H_ * dkv_;
    K_ = k.forward(ctx, kv);
    V_ = v.forward(ctx, kv);
    return {K_.f32(), V_.f32(), Tk, I, Tk * I};
  }

  // Decoding: self-attention appends this position's key and value (N, 1, I) to the cache and
  // reads positions 0..t; cross-attention projects the encoder output at the first step only.
  Keys cached_keys(RunCtx& ctx, const Tensor& x) {
    DecodeCache& cache = *state_.cache;
    DecodeCache::Layer& layer = cache.layers.at(block_);
    Kernels& kernels = ctx.kernels();
    const int64_t N = x.dim(0), I = H_ * dkv_;
    if (cross_) {
      const int64_t S = state_.encoder_out.dim(1);
      if (cache.t == 0)
        for (auto [proj, dst] : {std::pair{&k, &layer.cross_k}, std::pair{&v, &layer.cross_v}}) {
          const Tensor y = proj->forward(ctx, state_.encoder_out);
          ctx.ensure(*dst, y.shape(), DType::f32);
          kernels.cast(dst->raw(), DType::f32, y.raw(), DType::f32, y.numel());
        }
      return {layer.cross_k.f32(), layer.cross_v.f32(), S, I, S * I};
    }
    if (x.dim(1) != 1 || cache.t >= cache.Tmax)
      throw Error(name() + ": a decoding step takes one position (" + std::to_string(cache.Tmax) + " at most)");
    for (auto [proj, dst] : {std::pair{&k, &layer.k}, std::pair{&v, &layer.v}}) {
      ctx.ensure(*dst, {cache.Tmax, N, I}, DType::f32);
      const Tensor y = proj->forward(ctx, x);  // (N, 1, I)
      kernels.cast(dst->f32() + cache.t * N * I, DType::f32, y.raw(), DType::f32, N * I);
    }
    return {layer.k.f32(), layer.v.f32(), cache.t + 1, N * I, I};
  }

  int64_t H_, dkv_;
  bool cross_;
  size_t block_;  // the block's index in its stack: its layer of the decoding cache
  StackState& state_;
  Tensor Q_, K_, V_;  // (B, Tq, I), (B, Tk, I), (B, Tk, I): the projections' outputs
  Tensor probs_;      // (B, H, Tq, Tk) softmax probabilities
  Tensor dropped_;    // the same after dropout (probs_ itself when dropout is off)
  Tensor y_, out_;    // (B, Tq, I) heads side by side; (B, Tq, C) after o
  Tensor dV_, dP_, dQ_, dK_, dq_, dx_;
};

// x + dropout(f(layer_norm(x))) around an attention or feed-forward module `sub_name`, a Sub made
// from args (HF's T5LayerSelfAttention, T5LayerCrossAttention, T5LayerFF). The sublayer is
// registered first, as HF registers it.
class Residual : public Layer {
 public:
  template <class Sub, class... Args>
  Residual(const std::string& name, const std::string& type, const T5Config& c, const std::string& sub_name,
           std::in_place_type_t<Sub>, Args&&... args)
      : Layer(name, type),
        sub_(&add_child<Sub>(child_name(sub_name), std::forward<Args>(args)...)),
        norm_(&add_child<RMSNorm>(child_name("layer_norm"), "T5LayerNorm", c.d_model, c.layer_norm_epsilon,
                                  c.initializer_factor)),
        dropout_(&add_child<Dropout>(child_name("dropout"), c.dropout_rate)) {}
  const Tensor& do_forward(RunCtx& ctx, const Tensor& x) override {
    const Tensor f = dropout_->forward(ctx, sub_->forward(ctx, norm_->forward(ctx, x)));
    ctx.ensure(y_, x.shape(), DType::f32);
    ctx.kernels().add(y_.f32(), x.f32(), f.f32(), x.numel());
    ctx.round(y_);
    return y_;
  }
  const Tensor& do_backward(RunCtx& ctx, const Tensor& dy) override {
    // dy + the norm's dx, added in the norm's own dx pass.
    dx_ = norm_->backward_adding(ctx, sub_->backward(ctx, dropout_->backward(ctx, dy)), dy);
    return dx_;
  }
  void release_activations() override {
    y_ = dx_ = Tensor();
    for (Layer* l : std::array<Layer*, 3>{sub_, norm_, dropout_}) l->release_activations();
  }
  Layer& sub() const { return *sub_; }
  const RMSNorm& norm() const { return *norm_; }

 private:
  Layer* sub_;
  RMSNorm* norm_;
  Dropout* dropout_;
  Tensor y_, dx_;
};

// T5DenseActDense (wo(dropout(relu(wi(x))))) or T5DenseGatedActDense
// (wo(dropout(gelu_new(wi_0(x)) * wi_1(x)))). x (B, T, C) -> (B, T, C), F = d_ff in between.
class DenseActDense : public Layer {
 public:
  DenseActDense(const std::string& name, const T5Config& c)
      : Layer(name, c.gated_gelu ? "T5DenseGatedActDense" : "T5DenseActDense"), gated_(c.gated_gelu) {
    const double f = c.initializer_factor;
    const double in_std = f * std::pow(static_cast<double>(c.d_model), -0.5);
    if (gated_) {
      wi = &add_child<Linear>(child_name("wi_0"), c.d_model, c.d_ff, false);
      wi_1 = &add_child<Linear>(child_name("wi_1"), c.d_model, c.d_ff, false);
      wi_1->weight.init = ParamInit::normal(in_std);
    } else {
      wi = &add_child<Linear>(child_name("wi"), c.d_model, c.d_ff, false);
    }
    wi->weight.init = ParamInit::normal(in_std);
    wo = &add_child<Linear>(child_name("wo"), c.d_ff, c.d_model, false);
    wo->weight.init = ParamInit::normal(f * std::pow(static_cast<double>(c.d_ff), -0.5));
    dropout = &add_child<Dropout>(child_name("dropout"), c.dropout_rate);
    if (gated_)
      act = &add_child<GELU>(child_name("act"), true);
    else
      act = &add_child<ReLU>(child_name("act"));
  }
  const Tensor& do_forward(RunCtx& ctx, const Tensor& x) override {
    Tensor h = act->forward(ctx, wi->forward(ctx, x));
    if (gated_) {
      linear_ = wi_1->forward(ctx, x);
      gelu_ = h;
      ctx.ensure(gated_out_, h.shape(), DType::f32);
      ctx.kernels().mul(gated_out_.f32(), gelu_.f32(), linear_.f32(), h.numel());
      ctx.round(gated_out_);
      h = gated_out_;
    }
    out_ = wo->forward(ctx, dropout->forward(ctx, h));
    return out_;
  }
  const Tensor& do_backward(RunCtx& ctx, const Tensor& dy) override {
    const Tensor dh = dropout->backward(ctx, wo->backward(ctx, dy));
    if (!gated_) {
      dx_ = wi->backward(ctx, act->backward(ctx, dh));
      return dx_;
    }
    Kernels& kernels = ctx.kernels();
    ctx.ensure(dgelu_, dh.shape(), DType::f32);
    ctx.ensure(dlinear_, dh.shape(), DType::f32);
    kernels.mul(dgelu_.f32(), dh.f32(), linear_.f32(), dh.numel());
    kernels.mul(dlinear_.f32(), dh.f32(), gelu_.f32(), dh.numel());
    ctx.round(dgelu_);
    ctx.round(dlinear_);
    const Tensor d0 = wi->backward(ctx, act->backward(ctx, dgelu_));
    const Tensor d1 = wi_1->backward(ctx, dlinear_);
    ctx.ensure(dx_, d0.shape(), DType::f32);
    kernels.add(dx_.f32(), d0.f32(), d1.f32(), d0.numel());
    ctx.round(dx_);
    return dx_;
  }
  void release_activations() override {
    linear_ = gelu_ = gated_out_ = out_ = dgelu_ = dlinear_ = dx_ = Tensor();
    for (Layer* l : std::array<Layer*, 5>{wi, wi_1, wo, dropout, act})
      if (l) l->release_activations();
  }
  void drop_output() override { out_ = Tensor(); }  // the dropout's: backward starts from dy

  Linear* wi = nullptr;    // "wi" or "wi_0"
  Linear* wi_1 = nullptr;  // gated only
  Linear* wo = nullptr;
  Dropout* dropout = nullptr;
  Layer* act = nullptr;

 private:
  bool gated_;
  Tensor linear_, gelu_, gated_out_, out_, dgelu_, dlinear_, dx_;
};

// T5Block: layer.0 self-attention, (decoder) layer.1 cross-attention, then the feed-forward.
// The transformer_layer wrap policy's unit.
class T5Block : public Layer {
 public:
  T5Block(const std::string& name, const T5Config& c, size_t index, StackState& state) : Layer(name, "T5Block") {
    const std::string layer = child_name("layer");
    sub_.push_back(&add_child<Residual>(layer + ".0", "T5LayerSelfAttention", c, "SelfAttention",
                                        std::in_place_type<T5Attention>, c, false, index == 0, state, index));
    if (state.decoder)
      sub_.push_back(&add_child<Residual>(layer + ".1", "T5LayerCrossAttention", c, "EncDecAttention",
                                          std::in_place_type<T5Attention>, c, true, false, state, index));
    sub_.push_back(&add_child<Residual>(layer + "." + std::to_string(sub_.size()), "T5LayerFF", c, "DenseReluDense",
                                        std::in_place_type<DenseActDense>, c));
  }
  const Tensor& do_forward(RunCtx& ctx, const Tensor& x) override {
    y_ = x;
    for (Layer* l : sub_) y_ = l->forward(ctx, y_);
    return y_;
  }
  const Tensor& do_backward(RunCtx& ctx, const Tensor& dy) override {
    dx_ = dy;
    for (size_t i = sub_.size(); i-- > 0;) dx_ = sub_[i]->backward(ctx, dx_);
    return dx_;
  }
  void release_activations() override {
    y_ = dx_ = Tensor();
    for (Layer* l : sub_) l->release_activations();
  }

 private:
  std::vector<Residual*> sub_;
  Tensor y_, dx_;
};

// T5Stack: the shared token embedding, dropout, the blocks, final_layer_norm, dropout.
// ids (B, T) i32 -> (B, T, C). The decoder's encoder output and the source mask are set by the
// model before forward (set_inputs); the gradient of the encoder output is there after backward.
class T5Stack : public Layer {
 public:
  T5Stack(const std::string& name, const T5Config& c, Embedding& shared, bool decoder)
      : Layer(name, "T5Stack"), shared_(shared), c_(c) {
    state_.decoder = decoder;
    use_param(shared.weight);  // HF: embed_tokens is the model's `shared` module
    const int64_t n = decoder ? c.num_decoder_layers : c.num_layers;
    for (int64_t i = 0; i < n; ++i)
      blocks_.push_back(
          &add_child<T5Block>(child_name("block." + std::to_string(i)), c, static_cast<size_t>(i), state_));
    // T5LayerNorm: nn's RMSNorm, its weight starting at initializer_factor.
    final_layer_norm = &add_child<RMSNorm>(child_name("final_layer_norm"), "T5LayerNorm", c.d_model,
                                           c.layer_norm_epsilon, c.initializer_factor);
    // HF calls one dropout module twice (after the embedding and after the final norm); two
    // here, each with its own mask stream.
    dropout_ = &add_child<Dropout>(child_name("dropout"), c.dropout_rate);
    final_dropout_ = &add_child<Dropout>(child_name("final_dropout"), c.dropout_rate);
    need_input_grad = false;
  }
  void set_inputs(const Tensor& key_valid, const Tensor& encoder_out) {
    state_.key_valid = key_valid;
    state_.encoder_out = encoder_out;
  }
  const Tensor& d_encoder_out() const { return state_.d_encoder_out; }
  // Decoding: forward takes one position per sequence, (N, 1) ids at position cache->t, and the
  // blocks read and extend `cache`; null ends it. The decoder stack's only.
  void set_decode_cache(DecodeCache* cache) {
    state_.cache = cache;
    state_.bucket_T = -1;  // the buckets of a step are one row: training's are made again
    if (cache) cache->layers.resize(blocks_.size());
  }

  const Tensor& do_forward(RunCtx& ctx, const Tensor& ids) override {
    ids_ = ids;
    const int64_t B = ids.dim(0), T = ids.dim(1), C = c_.d_model;
    if (state_.cache) {  // the buckets of query t against keys 0..t (causal)
      const int64_t t = state_.cache->t;
      Tensor host = Tensor::empty({1, t + 1}, DType::i32, MemCategory::activations, ctx.mem);
      for (int64_t j = 0; j <= t; ++j)
        host.i32()[j] =
            t5_relative_bucket(j - t, false, c_.relative_attention_num_buckets, c_.relative_attention_max_distance);
      state_.bucket = ctx.to_run_device(host);
    } else if (state_.bucket_T != T) {  // the same for every batch of one length: made once
      Tensor host = Tensor::empty({T, T}, DType::i32, MemCategory::activations, ctx.mem);
      t5_relative_buckets(host.i32(), T, T, !state_.decoder, c_.relative_attention_num_buckets,
                          c_.relative_attention_max_distance);
      state_.bucket = ctx.to_run_device(host);
      state_.bucket_T = T;
    }
    ctx.ensure(state_.ones, {B}, DType::f32);
    ctx.kernels().fill(state_.ones.f32(), 1.0f, B);
    ctx.ensure(emb_, {B, T, C}, DType::f32);
    ctx.kernels().embedding_forward(emb_.f32(), ids.i32(), shared_.weight.data, nullptr, B, T, C);
    Tensor h = dropout_->forward(ctx, emb_);
    for (T5Block* b : blocks_) h = b->forward(ctx, h);
    out_ = final_dropout_->forward(ctx, final_layer_norm->forward(ctx, h));
    return out_;
  }

  const Tensor& do_backward(RunCtx& ctx, const Tensor& dy) override {
    Kernels& kernels = ctx.kernels();
    ctx.ensure(state_.d_position_bias, state_.position_bias.shape(), DType::f32);
    kernels.fill(state_.d_position_bias.f32(), 0.0f, state_.d_position_bias.numel());
    if (state_.decoder) {
      ctx.ensure(state_.d_encoder_out, state_.encoder_out.shape(), DType::f32);
      kernels.fill(state_.d_encoder_out.f32(), 0.0f, state_.d_encoder_out.numel());
    }
    Tensor d = final_layer_norm->backward(ctx, final_dropout_->backward(ctx, dy));
    for (size_t i = blocks_.size(); i-- > 0;) d = blocks_[i]->backward(ctx, d);
    d = dropout_->backward(ctx, d);
    kernels.embedding_backward(shared_.weight.grad, nullptr, d.f32(), ids_.i32(), ids_.dim(0), ids_.dim(1), c_.d_model);
    return none_;  // token ids have no gradient
  }

  void release_activations() override {
    ids_ = emb_ = out_ = Tensor();
    state_.position_bias = state_.d_position_bias = Tensor();
    for (T5Block* b : blocks_) b->release_activations();
    for (Layer* l : std::array<Layer*, 3>{final_layer_norm, dropout_, final_dropout_}) l->release_activations();
  }

  RMSNorm* final_layer_norm = nullptr;

 private:
  Embedding& shared_;
  const T5Config& c_;
  StackState state_;
  std::vector<T5Block*> blocks_;
  Dropout* dropout_ = nullptr;
  Dropout* final_dropout_ = nullptr;
  Tensor ids_, emb_, out_, none_;
};

// generate()'s steps: the decoder's own forward, one position per running sequence per step, its
// blocks keeping the keys and values of the positions so far (DecodeCache; HF's
// past_key_values), then lm_head. N = batch * beams sequences; no dropout (not training).
class T5Decoding final : public DecodeSteps {
 public:
  // enc (B, S, C): the encoder's output; valid (B, S) i32 the source mask on the host.
  T5Decoding(RunCtx& ctx, const T5Config& c, T5Stack& decoder, LmHead& head, const Tensor& enc, const Tensor& valid,
             int64_t beams, int64_t max_steps)
      : ctx_(ctx), c_(c), decoder_(decoder), head_(head), N_(enc.dim(0) * beams) {
    const int64_t S = enc.dim(1), C = c.d_model;
    // Sequence i = b * beams + j reads sample b's encoder output and mask.
    Tensor rows = Tensor::empty({N_}, DType::i32, MemCategory::activations, ctx.mem);
    Tensor mask = Tensor::empty({N_, S}, DType::i32, MemCategory::activations, ctx.mem);
    for (int64_t i = 0; i < N_; ++i) {
      rows.i32()[i] = static_cast<int32_t>(i / beams);
      std::copy_n(valid.i32() + (i / beams) * S, S, mask.i32() + i * S);
    }
    ctx.ensure(enc_, {N_, S, C}, DType::f32);
    ctx.kernels().embedding_forward(enc_.f32(), ctx.to_run_device(rows).i32(), enc.f32(), nullptr, 1, N_, S * C);
    cache_.Tmax = max_steps;
    decoder_.set_inputs(ctx.to_run_device(mask), enc_);
    decoder_.set_decode_cache(&cache_);
  }
  ~T5Decoding() override {
    decoder_.set_decode_cache(nullptr);
    decoder_.release_activations();
    head_.release_activations();
  }
  T5Decoding(const T5Decoding&) = delete;
  T5Decoding& operator=(const T5Decoding&) = delete;

  int64_t vocab_size() const override { return c_.vocab_size; }

  const float* step(std::span<const int32_t> tokens, std::span<const int32_t> origin) override {
    if (cache_.t >= cache_.Tmax)
      throw Error("t5 generate: more steps than the " + std::to_string(cache_.Tmax) + " it was set up for");
    reorder(origin);
    Tensor ids = Tensor::empty({N_, 1}, DType::i32, MemCategory::activations, ctx_.mem);
    for (int64_t i = 0; i < N_; ++i) {
      if (tokens[static_cast<size_t>(i)] < 0 || tokens[static_cast<size_t>(i)] >= c_.vocab_size)
        throw Error("t5 generate: token " + std::to_string(tokens[static_cast<size_t>(i)]) + " outside the vocab");
      ids.i32()[i] = tokens[static_cast<size_t>(i)];
    }
    const Tensor logits = head_.forward(ctx_, decoder_.forward(ctx_, ctx_.to_run_device(ids)));  // (N, 1, V)
    ++cache_.t;
    host_logits_ = ctx_.to_host_memory(logits);
    return host_logits_.f32();
  }

 private:
  // Beam search moved sequences: sequence i continues sequence origin[i]. One row gather over
  // the positions so far, per self-attention cache (the embedding kernel gathers rows of a
  // table); the cross-attention's rows are the sample's, the same for its beams.
  void reorder(std::span<const int32_t> origin) {
    bool identity = true;
    for (int64_t i = 0; i < N_; ++i) identity = identity && origin[static_cast<size_t>(i)] == i;
    const int64_t t = cache_.t;
    if (identity || t == 0) return;
    Tensor rows = Tensor::empty({t * N_}, DType::i32, MemCategory::activations, ctx_.mem);
    for (int64_t p = 0; p < t; ++p)
      for (int64_t i = 0; i < N_; ++i)
        rows.i32()[p * N_ + i] = static_cast<int32_t>(p * N_ + origin[static_cast<size_t>(i)]);
    const Tensor dev_rows = ctx_.to_run_device(rows);
    const int64_t I = c_.num_heads * c_.d_kv;
    for (DecodeCache::Layer& layer : cache_.layers)
      for (Tensor* kv : {&layer.k, &layer.v}) {
        ctx_.ensure(scratch_, kv->shape(), DType::f32);
        ctx_.kernels().embedding_forward(scratch_.f32(), dev_rows.i32(), kv->f32(), nullptr, 1, t * N_, I);
        std::swap(*kv, scratch_);
      }
  }

  RunCtx& ctx_;
  const T5Config& c_;
  T5Stack& decoder_;
  LmHead& head_;
  int64_t N_;
  DecodeCache cache_;
  Tensor enc_;  // (N, S, C) the encoder output, per sequence
  Tensor host_logits_, scratch_;
};

class T5Model : public Model {
 public:
  explicit T5Model(const T5Config& c)
      : Model("T5ForConditionalGeneration", std::make_unique<CrossEntropyLoss>(kIgnoreIndex)), c_(c) {
    shared_ = &add_child<Embedding>("shared", c.vocab_size, c.d_model);
    shared_->weight.init = ParamInit::normal(c.initializer_factor);
    encoder_ = &add_child<T5Stack>("encoder", c_, *shared_, false);
    decoder_ = &add_child<T5Stack>("decoder", c_, *shared_, true);
    // lm_head: its own weight, or shared.weight when tied (then x is first scaled by d_model^-0.5,
    // as HF does).
    lm_head_ = &add_child<LmHead>("lm_head", c.d_model, c.vocab_size, ParamInit::normal(c.initializer_factor),
                                  c.tie_word_embeddings ? &shared_->weight : nullptr,
                                  static_cast<float>(std::pow(static_cast<double>(c.d_model), -0.5)));
  }
  std::vector<std::string> block_types() const override { return {"T5Block"}; }

  std::vector<std::vector<int32_t>> generate(RunCtx& ctx, const Tensor& inputs, const GenerateOptions& o) override {
    if (inputs.ndim() != 2) throw Error("t5 generate: inputs " + shape_str(inputs.shape()) + " are not (B, S)");
    const Tensor valid = source_mask(ctx, inputs);
    encoder_->set_inputs(ctx.to_run_device(valid), Tensor());
    const Tensor enc = encoder_->forward(ctx, inputs);
    GenerateOptions t5 = o;
    t5.decoder_start_id = static_cast<int32_t>(c_.decoder_start_token_id);
    std::vector<std::vector<int32_t>> out;
    {
      T5Decoding steps(ctx, c_, *decoder_, *lm_head_, enc, valid, o.num_beams, o.max_new_tokens);
      out = o.num_beams == 1 ? greedy_search(steps, inputs.dim(0), t5) : beam_search(steps, inputs.dim(0), t5);
    }
    encoder_->release_activations();
    return out;
  }

 protected:
  Tensor run_forward(RunCtx& ctx, const Tensor& inputs, const Tensor& targets) override {
    if (inputs.ndim() != 2 || targets.ndim() != 2 || inputs.dim(0) != targets.dim(0))
      throw Error("t5: inputs " + shape_str(inputs.shape()) + " and labels " + shape_str(targets.shape()) +
                  " are not (B, S) and (B, L)");
    prepare(ctx, inputs, targets);
    encoder_->set_inputs(key_valid_, Tensor());
    const Tensor enc = encoder_->forward(ctx, inputs);
    decoder_->set_inputs(key_valid_, enc);
    return lm_head_->forward(ctx, decoder_->forward(ctx, decoder_ids_));
  }
  Tensor run_backward(RunCtx& ctx, const Tensor& d_logits) override {
    decoder_->backward(ctx, lm_head_->backward(ctx, d_logits));
    encoder_->backward(ctx, decoder_->d_encoder_out());
    return Tensor();
  }

 private:
  static constexpr int32_t kIgnoreIndex = -100;

  // (B, S) i32 on the host: 1 where the source token is not pad (0). Errors on ids outside the vocab.
  Tensor source_mask(RunCtx& ctx, const Tensor& inputs) const {
    const Tensor src = ctx.to_host_memory(inputs);
    Tensor valid = Tensor::empty(src.shape(), DType::i32, MemCategory::activations, ctx.mem);
    for (int64_t i = 0; i < src.numel(); ++i) {
      const int32_t id = src.i32()[i];
      if (id < 0 || id >= c_.vocab_size)
        throw Error("t5: source token " + std::to_string(id) + " outside vocab_size " + std::to_string(c_.vocab_size));
      valid.i32()[i] = id != 0;
    }
    return valid;
  }

  // The source's padding mask (id != 0) and the decoder's input (the labels shifted right behind
  // decoder_start_token_id, ignored labels as pad 0), made on the host: a device run brings the
  // ids over once per step (a host wait; the batch is a few KB).
  void prepare(RunCtx& ctx, const Tensor& inputs, const Tensor& targets) {
    const Tensor labels = ctx.to_host_memory(targets);
    const int64_t B = labels.dim(0), L = labels.dim(1), V = c_.vocab_size;
    const Tensor valid = source_mask(ctx, inputs);
    Tensor dec = Tensor::empty({B, L}, DType::i32, MemCategory::activations, ctx.mem);
    const int32_t* y = labels.i32();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < L; ++t) {
        const int32_t label = y[b * L + t];
        if (label != kIgnoreIndex && (label < 0 || label >= V))
          throw Error("t5: label " + std::to_string(label) + " outside vocab_size " + std::to_string(V) +
                      " (and not the ignored -100)");
        const int32_t prev = t == 0 ? static_cast<int32_t>(c_.decoder_start_token_id) : y[b * L + t - 1];
        dec.i32()[b * L + t] = prev == kIgnoreIndex ? 0 : prev;
      }
    key_valid_ = ctx.to_run_device(valid);
    decoder_ids_ = ctx.to_run_device(dec);
  }

  T5Config c_;
  Embedding* shared_ = nullptr;
  T5Stack* encoder_ = nullptr;
  T5Stack* decoder_ = nullptr;
  LmHead* lm_head_ = nullptr;
  Tensor key_valid_;    // (B, S) i32
  Tensor decoder_ids_;  // (B, L) i32
};

}  // namespace

std::unique_ptr<Model> make_t5(const T5Config& config) { return std::make_unique<T5Model>(config); }

}  // namespace fsdp
