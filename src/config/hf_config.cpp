#include "config/hf_config.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "config/config.h"
#include "tensor/error.h"

namespace fsdp {

namespace {

using Json = nlohmann::json;

constexpr const char* kTransformerType = "fsdp_transformer";

// T5Config's keys that model.kind t5 reads, with T5Config's defaults (transformers 4.36) for a
// file that leaves one out. num_decoder_layers' default is num_layers, the key before it.
constexpr std::pair<const char*, const char*> kT5Keys[] = {
    {"vocab_size", "32128"},
    {"d_model", "512"},
    {"d_kv", "64"},
    {"d_ff", "2048"},
    {"num_layers", "6"},
    {"num_decoder_layers", ""},
    {"num_heads", "8"},
    {"relative_attention_num_buckets", "32"},
    {"relative_attention_max_distance", "128"},
    {"feed_forward_proj", "relu"},
    {"tie_word_embeddings", "true"},
    {"dropout_rate", "0.1"},
    {"layer_norm_epsilon", "1e-06"},
    {"initializer_factor", "1.0"},
};
constexpr const char* kTransformerKeys[] = {"vocab", "d_model", "n_layers", "n_heads", "d_ff", "seq_len"};

// A scalar as YAML text; "" for null (transformers reads null as the default).
std::string scalar_text(const Json& v, const std::string& key, const std::string& path) {
  if (v.is_null()) return "";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean() || v.is_number()) return v.dump();
  throw Error(path + ": " + key + " is " + std::string(v.type_name()) + ", not a number, string or boolean");
}

}  // namespace

InitFromKind init_from_kind(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return InitFromKind::hf_folder;
  if (path.ends_with(".safetensors")) return InitFromKind::safetensors_file;
  return InitFromKind::hdf5;
}

std::vector<std::string> hf_config_keys(ModelKind kind) {
  std::vector<std::string> keys;
  if (kind == ModelKind::t5)
    for (const auto& k : kT5Keys) keys.emplace_back(k.first);
  if (kind == ModelKind::transformer) keys.assign(std::begin(kTransformerKeys), std::end(kTransformerKeys));
  return keys;
}

HfConfigKeys read_hf_config(const std::string& dir) {
  HfConfigKeys out;
  out.path = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream in(out.path, std::ios::binary);
  if (!in.is_open()) throw Error(out.path + ": cannot open (a Hugging Face model folder has a config.json)");
  std::stringstream text;
  text << in.rdbuf();
  Json j;
  try {
    j = Json::parse(text.str());
  } catch (const Json::exception& e) {
    throw Error(out.path + ": bad JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw Error(out.path + ": not a JSON object");
  const auto type = j.find("model_type");
  const std::string model_type = type != j.end() && type->is_string() ? type->get<std::string>() : "";
  if (model_type == "t5") {
    out.kind = ModelKind::t5;
    for (const auto& [key, fallback] : kT5Keys) {
      const auto it = j.find(key);
      std::string value = it == j.end() ? "" : scalar_text(*it, key, out.path);
      if (value.empty()) value = *fallback ? fallback : out.keys.back().second;  // the key before: num_layers
      out.keys.emplace_back(key, value);
    }
  } else if (model_type == kTransformerType) {
    out.kind = ModelKind::transformer;
    for (const char* key : kTransformerKeys) {
      const auto it = j.find(key);
      if (it == j.end()) throw Error(out.path + ": no " + key + " (model_type " + kTransformerType + ")");
      out.keys.emplace_back(key, scalar_text(*it, key, out.path));
    }
  } else {
    throw Error(out.path + ": model_type " + (model_type.empty() ? std::string("missing") : "'" + model_type + "'") +
                "; fsdp_app reads t5 (T5ForConditionalGeneration) and " + kTransformerType);
  }
  return out;
}

std::string hf_config_json(const ModelConfig& m, const std::string& torch_dtype) {
  nlohmann::ordered_json j;
  if (m.kind == ModelKind::t5) {
    const bool gated = m.feed_forward_proj == FeedForwardProj::gated_gelu;
    j["architectures"] = {"T5ForConditionalGeneration"};
    j["model_type"] = "t5";
    j["vocab_size"] = m.vocab_size;
    j["d_model"] = m.d_model;
    j["d_kv"] = m.d_kv;
    j["d_ff"] = m.d_ff;
    j["num_layers"] = m.num_layers;
    j["num_decoder_layers"] = m.num_decoder_layers;
    j["num_heads"] = m.num_heads;
    j["relative_attention_num_buckets"] = m.relative_attention_num_buckets;
    j["relative_attention_max_distance"] = m.relative_attention_max_distance;
    j["feed_forward_proj"] = std::string(name_of(kFeedForwardProjs, m.feed_forward_proj));
    // What T5Config derives from feed_forward_proj (save_pretrained writes them too).
    j["dense_act_fn"] = gated ? "gelu_new" : "relu";
    j["is_gated_act"] = gated;
    j["tie_word_embeddings"] = m.tie_word_embeddings;
    j["dropout_rate"] = m.dropout_rate;
    j["layer_norm_epsilon"] = m.layer_norm_epsilon;
    j["initializer_factor"] = m.initializer_factor;
    j["is_encoder_decoder"] = true;
    j["decoder_start_token_id"] = 0;
    j["pad_token_id"] = 0;
    j["eos_token_id"] = 1;
    j["use_cache"] = true;
  } else if (m.kind == ModelKind::transformer) {
    j["model_type"] = kTransformerType;
    j["description"] =
        "fsdp-hpc's decoder-only transformer: tok_emb + pos_emb (learned), n_layers pre-norm blocks (LayerNorm eps "
        "1e-5, causal torch.nn.MultiheadAttention with in_proj, exact GELU MLP), ln_f, head (Linear with bias, "
        "untied); state_dict names as tests/reference/torch_models.py's LM. No transformers class computes this.";
    j["vocab"] = m.vocab;
    j["d_model"] = m.d_model;
    j["n_layers"] = m.n_layers;
    j["n_heads"] = m.n_heads;
    j["d_ff"] = m.d_ff;
    j["seq_len"] = m.seq_len;
    j["layer_norm_eps"] = 1e-5;
    j["activation_function"] = "gelu";
    j["tie_word_embeddings"] = false;
  } else {
    throw Error("model.kind " + std::string(name_of(kModelKinds, m.kind)) +
                ": no Hugging Face export (t5 and transformer have one)");
  }
  j["torch_dtype"] = torch_dtype;
  return j.dump(2) + "\n";
}

}  // namespace fsdp
