// model.kind t5 (models/family.h): Hugging Face's T5ForConditionalGeneration, its config.json
// keys (T5Config's names and defaults, transformers 4.36) and the hub's presets.
#include <nlohmann/json.hpp>

#include "models/family.h"
#include "models/t5/t5.h"

namespace fsdp {

namespace {

std::vector<ArgSpec> t5_args() {
  return {
      {"vocab_size",
       int64_t{32128},
       at_least(1),
       {},
       true,
       "",
       "the vocabulary (rows of `shared`, outputs of the head); at least 259 for byte tokens, and at least "
       "data.tokenizer's pieces"},
      {"d_model", int64_t{512}, at_least(1), {}, true, "", "the hidden width, that of the residual stream"},
      {"d_kv",
       int64_t{64},
       at_least(1),
       {},
       true,
       "",
       "the width of each head's q, k and v; attention's inner width is num_heads x d_kv"},
      {"d_ff", int64_t{2048}, at_least(1), {}, true, "", "the inner width of each feed-forward layer"},
      {"num_layers", int64_t{6}, at_least(1), {}, true, "", "encoder blocks"},
      {"num_decoder_layers",
       int64_t{6},
       at_least(1),
       {},
       true,
       "num_layers",
       "decoder blocks; when not given, model.num_layers"},
      {"num_heads", int64_t{8}, at_least(1), {}, true, "", "attention heads"},
      {"relative_attention_num_buckets",
       int64_t{32},
       at_least(2),
       {},
       true,
       "",
       "buckets of the relative position bias"},
      {"relative_attention_max_distance",
       int64_t{128},
       at_least(1),
       {},
       true,
       "",
       "the distance from which relative positions share the last bucket"},
      {"feed_forward_proj",
       std::string("relu"),
       unbounded(),
       {"relu", "gated-gelu"},
       true,
       "",
       "the feed-forward layer: `relu` T5 v1.0's (wi, wo), `gated-gelu` v1.1's (wi_0, wi_1, wo; gelu_new)"},
      {"tie_word_embeddings",
       true,
       unbounded(),
       {},
       true,
       "",
       "the head is `shared.weight`, its input scaled by d_model^-0.5; false: a head of its own, "
       "`lm_head.weight` (v1.1)"},
      {"dropout_rate",
       0.1,
       closed_open(0, 1),
       {},
       true,
       "",
       "the probability of every dropout; `train.dropout: false` turns them off"},
      {"layer_norm_epsilon", 1e-6, above(0), {}, true, "", "epsilon of the RMS norms (T5LayerNorm)"},
      {"initializer_factor", 1.0, above(0), {}, true, "", "the scale of HF's initialisation (1 is HF's own)"},
  };
}

// The hub's configs (each config.json: vocab_size 32128, 32 buckets, max distance 128): t5-small
// 60,506,624 parameters, t5-base 222,903,552, t5-large 737,668,096.
std::vector<ModelPreset> t5_presets() {
  struct Row {
    const char* name;
    int64_t d_model, d_kv, d_ff, layers, heads;
    bool v1_1;  // gated-gelu, untied lm_head
  };
  constexpr Row kRows[] = {
      {"t5-small", 512, 64, 2048, 6, 8, false},
      {"t5-base", 768, 64, 3072, 12, 12, false},
      {"t5-large", 1024, 64, 4096, 24, 16, false},
      {"t5-3b", 1024, 128, 16384, 24, 32, false},
      {"t5-11b", 1024, 128, 65536, 24, 128, false},
      {"google/t5-v1_1-small", 512, 64, 1024, 8, 6, true},
      {"google/t5-v1_1-base", 768, 64, 2048, 12, 12, true},
      {"google/t5-v1_1-large", 1024, 64, 2816, 24, 16, true},
      {"google/t5-v1_1-xl", 2048, 64, 5120, 24, 32, true},
      {"google/t5-v1_1-xxl", 4096, 64, 10240, 24, 64, true},
  };
  std::vector<ModelPreset> out;
  for (const Row& r : kRows)
    out.push_back({r.name,
                   {{"d_model", r.d_model},
                    {"d_kv", r.d_kv},
                    {"d_ff", r.d_ff},
                    {"num_layers", r.layers},
                    {"num_heads", r.heads},
                    {"feed_forward_proj", std::string(r.v1_1 ? "gated-gelu" : "relu")},
                    {"tie_word_embeddings", !r.v1_1}}});
  return out;
}

T5Config t5_config(const ModelArgs& a) {
  T5Config t;
  t.vocab_size = a.i64("vocab_size");
  t.d_model = a.i64("d_model");
  t.d_kv = a.i64("d_kv");
  t.d_ff = a.i64("d_ff");
  t.num_layers = a.i64("num_layers");
  t.num_decoder_layers = a.i64("num_decoder_layers");
  t.num_heads = a.i64("num_heads");
  t.relative_attention_num_buckets = a.i64("relative_attention_num_buckets");
  t.relative_attention_max_distance = a.i64("relative_attention_max_distance");
  t.gated_gelu = a.text("feed_forward_proj") == "gated-gelu";
  t.tie_word_embeddings = a.flag("tie_word_embeddings");
  t.dropout_rate = static_cast<float>(a.f64("dropout_rate"));
  t.layer_norm_epsilon = static_cast<float>(a.f64("layer_norm_epsilon"));
  t.initializer_factor = static_cast<float>(a.f64("initializer_factor"));
  return t;
}

// What T5Config derives from feed_forward_proj (save_pretrained writes them too) and the token
// ids, so that T5ForConditionalGeneration.from_pretrained loads the folder.
std::string t5_hf_extra_json(const ModelArgs& a) {
  const bool gated = a.text("feed_forward_proj") == "gated-gelu";
  nlohmann::ordered_json j;
  j["architectures"] = {"T5ForConditionalGeneration"};
  j["dense_act_fn"] = gated ? "gelu_new" : "relu";
  j["is_gated_act"] = gated;
  j["is_encoder_decoder"] = true;
  j["decoder_start_token_id"] = 0;
  j["pad_token_id"] = 0;
  j["eos_token_id"] = 1;
  j["use_cache"] = true;
  return j.dump();
}

// T5's embedding is one tensor under up to four names (the tied lm_head.weight the fourth):
// save_pretrained writes shared.weight only, other writers (torch.save's state_dict, converted)
// write every alias.
HfNames t5_hf_names(const ModelArgs& a) {
  HfNames names;
  names.aliases["shared.weight"] = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight"};
  if (a.flag("tie_word_embeddings")) names.aliases["shared.weight"].push_back("lm_head.weight");
  return names;
}

}  // namespace

ModelFamily t5_family() {
  ModelFamily f;
  f.name = "t5";
  f.summary = "Hugging Face's T5ForConditionalGeneration (its state_dict names)";
  f.task = ModelTask::seq2seq;
  f.generates = true;
  f.args = t5_args();
  f.presets = t5_presets();
  f.vocab_key = "vocab_size";
  f.hf_model_type = "t5";
  f.make = [](const ModelArgs& a) { return make_t5(t5_config(a)); };
  f.hf_extra_json = t5_hf_extra_json;
  f.hf_names = t5_hf_names;
  return f;
}

}  // namespace fsdp
