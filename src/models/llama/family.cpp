// model.kind llama (models/family.h): Hugging Face's LlamaForCausalLM, its config.json keys
// (LlamaConfig's names and defaults, transformers 4.36) and the hub's common shapes as presets.
#include <nlohmann/json.hpp>

#include "models/family.h"
#include "models/llama/llama.h"
#include "tensor/error.h"

namespace fsdp {

namespace {

// LlamaConfig's keys, one entry each with its doc line: long because it is a table (as schema()).
// NOLINTNEXTLINE(readability-function-size): the reason is above
std::vector<ArgSpec> llama_args() {
  return {
      {"vocab_size",
       int64_t{32000},
       at_least(1),
       {},
       true,
       "",
       "the vocabulary (rows of `model.embed_tokens`, outputs of `lm_head`); at least 256 with `data.kind: text` "
       "(bytes)"},
      {"hidden_size", int64_t{4096}, at_least(2), {}, true, "", "the hidden width, that of the residual stream"},
      {"intermediate_size", int64_t{11008}, at_least(1), {}, true, "", "the inner width of each SwiGLU MLP"},
      {"num_hidden_layers", int64_t{32}, at_least(1), {}, true, "", "decoder layers"},
      {"num_attention_heads",
       int64_t{32},
       at_least(1),
       {},
       true,
       "",
       "query heads; must divide model.hidden_size into an even head dim"},
      {"num_key_value_heads",
       int64_t{32},
       at_least(1),
       {},
       true,
       "num_attention_heads",
       "key/value heads (grouped-query attention when fewer than the query heads; must divide them); when not "
       "given, model.num_attention_heads"},
      {"hidden_act", std::string("silu"), unbounded(), {"silu"}, true, "", "the MLP's gate activation"},
      {"max_position_embeddings",
       int64_t{2048},
       at_least(1),
       {},
       true,
       "",
       "the context the model was trained for (written to config.json; HF's rotary cache grows past it, and so "
       "do the tables here)"},
      {"initializer_range",
       0.02,
       above(0),
       {},
       true,
       "",
       "the std of HF's initialisation of every Linear and the embedding"},
      {"rms_norm_eps", 1e-6, above(0), {}, true, "", "epsilon of the RMS norms (LlamaRMSNorm)"},
      {"rope_theta", 10000.0, above(0), {}, true, "", "the base of the rotary embedding's frequencies"},
      {"rope_scaling_type",
       std::string("none"),
       unbounded(),
       {"none", "linear"},
       false,
       "",
       "config.json's rope_scaling.type: `linear` divides positions by model.rope_scaling_factor (HF's "
       "LlamaLinearScalingRotaryEmbedding); `dynamic` and the others are refused by name"},
      {"rope_scaling_factor", 1.0, at_least(1), {}, false, "", "config.json's rope_scaling.factor"},
      {"attention_bias", false, unbounded(), {}, true, "", "biases on q_proj, k_proj, v_proj and o_proj"},
      {"attention_dropout",
       0.0,
       closed_open(0, 1),
       {},
       true,
       "",
       "dropout on the attention probabilities; `train.dropout: false` turns it off"},
      {"tie_word_embeddings",
       false,
       unbounded(),
       {},
       true,
       "",
       "true: `lm_head` is `model.embed_tokens.weight` (no `lm_head.weight` of its own)"},
      {"pad_token_id",
       int64_t{-1},
       at_least(-1),
       {},
       true,
       "",
       "-1 (config.json's null): none; else nn.Embedding's padding_idx: that row starts at zero and gets no "
       "gradient from the embedding"},
      {"bos_token_id", int64_t{1}, at_least(0), {}, true, "", "written to config.json (generation reads it)"},
      {"eos_token_id", int64_t{2}, at_least(0), {}, true, "", "written to config.json (generation reads it)"},
      {"seq_len",
       int64_t{2048},
       at_least(1),
       {},
       false,
       "",
       "tokens per training sample (positions 0..seq_len-1); a text sample is this many bytes, a causal_lm block this "
       "many tokens"},
  };
}

// The hub's config.json values of each shape (num_key_value_heads < num_attention_heads: GQA).
// Parameters (tests/test_config.cpp checks them): TinyLlama 1,100,048,384; Llama 2 7B 6,738,415,616,
// 13B 13,015,864,320, 70B 68,976,648,192; Llama 3 8B 8,030,261,248, 70B 70,553,706,496; Mistral 7B
// v0.1 7,241,732,096 (its sliding window of 4096 is not implemented: full causal attention).
std::vector<ModelPreset> llama_presets() {
  struct Row {
    const char* name;
    int64_t vocab, hidden, intermediate, layers, heads, kv_heads, max_positions;
    double rope_theta;
    int64_t bos, eos;
  };
  constexpr Row kRows[] = {
      {"TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T", 32000, 2048, 5632, 22, 32, 4, 2048, 10000.0, 1, 2},
      {"meta-llama/Llama-2-7b-hf", 32000, 4096, 11008, 32, 32, 32, 4096, 10000.0, 1, 2},
      {"meta-llama/Llama-2-13b-hf", 32000, 5120, 13824, 40, 40, 40, 4096, 10000.0, 1, 2},
      {"meta-llama/Llama-2-70b-hf", 32000, 8192, 28672, 80, 64, 8, 4096, 10000.0, 1, 2},
      {"meta-llama/Meta-Llama-3-8B", 128256, 4096, 14336, 32, 32, 8, 8192, 500000.0, 128000, 128001},
      {"meta-llama/Meta-Llama-3-70B", 128256, 8192, 28672, 80, 64, 8, 8192, 500000.0, 128000, 128001},
      {"mistralai/Mistral-7B-v0.1", 32000, 4096, 14336, 32, 32, 8, 32768, 10000.0, 1, 2},
  };
  std::vector<ModelPreset> out;
  for (const Row& r : kRows)
    out.push_back({r.name,
                   {{"vocab_size", r.vocab},
                    {"hidden_size", r.hidden},
                    {"intermediate_size", r.intermediate},
                    {"num_hidden_layers", r.layers},
                    {"num_attention_heads", r.heads},
                    {"num_key_value_heads", r.kv_heads},
                    {"max_position_embeddings", r.max_positions},
                    {"rms_norm_eps", 1e-5},
                    {"rope_theta", r.rope_theta},
                    {"bos_token_id", r.bos},
                    {"eos_token_id", r.eos}}});
  return out;
}

LlamaConfig llama_config(const ModelArgs& a) {
  LlamaConfig c;
  c.vocab_size = a.i64("vocab_size");
  c.hidden_size = a.i64("hidden_size");
  c.intermediate_size = a.i64("intermediate_size");
  c.num_hidden_layers = a.i64("num_hidden_layers");
  c.num_attention_heads = a.i64("num_attention_heads");
  c.num_key_value_heads = a.i64("num_key_value_heads");
  c.initializer_range = a.f64("initializer_range");
  c.rms_norm_eps = static_cast<float>(a.f64("rms_norm_eps"));
  c.rope_theta = a.f64("rope_theta");
  c.rope_scaling_factor = a.text("rope_scaling_type") == "linear" ? a.f64("rope_scaling_factor") : 1.0;
  c.attention_bias = a.flag("attention_bias");
  c.attention_dropout = static_cast<float>(a.f64("attention_dropout"));
  c.tie_word_embeddings = a.flag("tie_word_embeddings");
  c.pad_token_id = a.i64("pad_token_id");
  c.eos_token_id = a.i64("eos_token_id");
  return c;
}

std::optional<ArgProblem> llama_check(const ModelArgs& a, const ModelRunFacts& run) {
  const int64_t hidden = a.i64("hidden_size"), heads = a.i64("num_attention_heads");
  const int64_t kv = a.i64("num_key_value_heads");
  if (hidden % heads != 0 || (hidden / heads) % 2 != 0)
    return ArgProblem{"model.hidden_size", "model.num_attention_heads",
                      "model.hidden_size (" + std::to_string(hidden) + ") must be model.num_attention_heads (" +
                          std::to_string(heads) + ") times an even head dim"};
  if (heads % kv != 0)
    return ArgProblem{"model.num_key_value_heads", "model.num_attention_heads",
                      "model.num_key_value_heads (" + std::to_string(kv) + ") must divide model.num_attention_heads (" +
                          std::to_string(heads) + ")"};
  if (a.i64("pad_token_id") >= a.i64("vocab_size"))
    return ArgProblem{"model.pad_token_id", "model.vocab_size",
                      "model.pad_token_id (" + std::to_string(a.i64("pad_token_id")) +
                          ") must be -1 or an id below model.vocab_size (" + std::to_string(a.i64("vocab_size")) + ")"};
  if (run.data_kind == DataKind::text && a.i64("vocab_size") < 256)
    return ArgProblem{
        "model.vocab_size", "",
        "must be >= 256 when data.kind is text (tokens are bytes), got " + std::to_string(a.i64("vocab_size"))};
  return std::nullopt;
}

// config.json's rope_scaling: null, or {"type": "linear", "factor": F}. transformers 4.36 also
// knows "dynamic" (NTK scaling, which changes the tables with the sequence length): refused by name.
std::vector<std::pair<std::string, std::string>> llama_hf_config_keys(const std::string& config_json) {
  const nlohmann::json j = nlohmann::json::parse(config_json);
  const auto it = j.find("rope_scaling");
  if (it == j.end() || it->is_null()) return {{"rope_scaling_type", "none"}, {"rope_scaling_factor", "1.0"}};
  const nlohmann::json& r = *it;
  if (!r.is_object() || !r.contains("type") || !r["type"].is_string() || !r.contains("factor") ||
      !r["factor"].is_number())
    throw Error("rope_scaling is " + r.dump() + R"(, not null or {"type": "linear", "factor": F})");
  const std::string type = r["type"].get<std::string>();
  if (type != "linear")
    throw Error("rope_scaling type '" + type + "' is not implemented (model.kind llama has none and linear)");
  return {{"rope_scaling_type", "linear"}, {"rope_scaling_factor", r["factor"].dump()}};
}

std::string llama_hf_extra_json(const ModelArgs& a) {
  nlohmann::ordered_json j;
  j["architectures"] = {"LlamaForCausalLM"};
  if (a.text("rope_scaling_type") == "linear")
    j["rope_scaling"] = {{"type", "linear"}, {"factor", a.f64("rope_scaling_factor")}};
  else
    j["rope_scaling"] = nullptr;
  if (a.i64("pad_token_id") < 0) j["pad_token_id"] = nullptr;
  j["pretraining_tp"] = 1;
  j["use_cache"] = true;
  return j.dump();
}

// Older conversions keep each layer's rotary inverse frequencies as a tensor (a buffer, not a
// parameter: the tables are computed here); a tied model's state_dict holds lm_head.weight, the
// embedding under a second name.
HfNames llama_hf_names(const ModelArgs& a) {
  HfNames names;
  for (int64_t i = 0; i < a.i64("num_hidden_layers"); ++i)
    names.ignored.insert("model.layers." + std::to_string(i) + ".self_attn.rotary_emb.inv_freq");
  if (a.flag("tie_word_embeddings")) names.aliases["model.embed_tokens.weight"] = {"lm_head.weight"};
  return names;
}

}  // namespace

ModelFamily llama_family() {
  ModelFamily f;
  f.name = "llama";
  f.summary = "Hugging Face's LlamaForCausalLM (Llama 2 and 3, TinyLlama, Mistral without its sliding window)";
  f.task = ModelTask::causal_lm;
  f.generates = true;
  f.args = llama_args();
  f.presets = llama_presets();
  f.vocab_key = "vocab_size";
  f.seq_len_key = "seq_len";
  f.bos_key = "bos_token_id";
  f.eos_key = "eos_token_id";
  f.hf_model_type = "llama";
  f.make = [](const ModelArgs& a) { return make_llama(llama_config(a)); };
  f.hf_extra_json = llama_hf_extra_json;
  f.hf_names = llama_hf_names;
  f.hf_config_keys = llama_hf_config_keys;
  f.check = llama_check;
  return f;
}

}  // namespace fsdp
