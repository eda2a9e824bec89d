// The model an input file names and the FSDP options of its fsdp section: the config is read
// here, in train/, so that models/ (which takes sizes) depends on nn/ and tensor/ only, and
// fsdp/ reads no Config.
#include "train/model_from_config.h"
#include "ckpt/hf_weights.h"
#include "config/config.h"
#include "fsdp/fsdp.h"
#include "models/model.h"
#include "models/t5.h"
#include "tensor/error.h"

namespace fsdp {

std::unique_ptr<Model> make_model(const ModelConfig& config) {
  if (config.kind == ModelKind::mnist_cnn) return make_mnist_cnn();
  if (config.kind == ModelKind::transformer)
    return make_transformer(config.vocab, config.d_model, config.n_layers, config.n_heads, config.d_ff, config.seq_len,
                            config.attention);
  if (config.kind == ModelKind::t5) {
    T5Config t;
    t.vocab_size = config.vocab_size;
    t.d_model = config.d_model;
    t.d_kv = config.d_kv;
    t.d_ff = config.d_ff;
    t.num_layers = config.num_layers;
    t.num_decoder_layers = config.num_decoder_layers;
    t.num_heads = config.num_heads;
    t.relative_attention_num_buckets = config.relative_attention_num_buckets;
    t.relative_attention_max_distance = config.relative_attention_max_distance;
    t.gated_gelu = config.feed_forward_proj == FeedForwardProj::gated_gelu;
    t.tie_word_embeddings = config.tie_word_embeddings;
    t.dropout_rate = static_cast<float>(config.dropout_rate);
    t.layer_norm_epsilon = static_cast<float>(config.layer_norm_epsilon);
    t.initializer_factor = static_cast<float>(config.initializer_factor);
    return make_t5(t);
  }
  throw Error("model.kind: not " + names_of(kModelKinds));
}

FsdpOptions fsdp_options(const FsdpConfig& c) {
  FsdpOptions o;
  o.strategy = c.sharding_strategy;
  o.wrap_policy = c.wrap_policy;
  o.min_num_params = c.min_num_params;
  o.wrap_modules = c.wrap_modules;
  o.param_dtype = c.mixed_precision.param_dtype;
  o.reduce_dtype = c.mixed_precision.reduce_dtype;
  o.backward_prefetch = c.backward_prefetch;
  o.forward_prefetch = c.forward_prefetch;
  o.limit_all_gathers = c.limit_all_gathers;
  o.node_shared_params = c.node_shared_params;
  o.activation_checkpointing = c.activation_checkpointing;
  o.cpu_offload = c.cpu_offload;
  o.shard_group_size = static_cast<int>(c.shard_group_size);
  return o;
}

HfNames hf_names(const ModelConfig& config) {
  HfNames names;
  if (config.kind != ModelKind::t5) return names;
  // T5's embedding is one tensor under up to four names: save_pretrained writes shared.weight
  // only, other writers (torch.save's state_dict, converted) write every alias.
  names.aliases["shared.weight"] = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight"};
  if (config.tie_word_embeddings) names.ignored.insert("lm_head.weight");
  return names;
}

}  // namespace fsdp
