#pragma once
// model.init_from as a Hugging Face model folder: its config.json gives the model keys. And the
// other way: the config.json `fsdp_ckpt export-hf` writes for a model config.
//
// T5 (model_type "t5"): the keys are T5Config's, which are model.kind t5's names; a key the file
// leaves out is T5Config's default (as transformers reads it), so the file alone fixes every key.
// Our decoder-only transformer (model_type "fsdp_transformer", what export-hf writes for it; no
// transformers class computes the same function): vocab, d_model, n_layers, n_heads, d_ff,
// seq_len, all required.
#include <string>
#include <utility>
#include <vector>

#include "config/enums.h"

namespace fsdp {

struct ModelConfig;

// How model.init_from is read: a folder is a Hugging Face model folder (config.json and
// safetensors), a path ending in .safetensors one safetensors file, anything else HDF5.
enum class InitFromKind { hdf5, safetensors_file, hf_folder };
InitFromKind init_from_kind(const std::string& path);

struct HfConfigKeys {
  std::string path;  // DIR/config.json, for messages
  ModelKind kind = ModelKind::t5;
  // Every model key of that kind with its value as YAML scalar text ("768", "gated-gelu", "true").
  std::vector<std::pair<std::string, std::string>> keys;
};

// DIR/config.json's model keys; Error with one line naming the file when it is missing, is not
// JSON, names another model_type, or holds a key that is not a scalar.
HfConfigKeys read_hf_config(const std::string& dir);

// The model keys a config.json sets for `kind`, in read_hf_config's order; none for mnist_cnn.
std::vector<std::string> hf_config_keys(ModelKind kind);

// The config.json of a model (T5: T5Config's keys and the token ids, loadable by
// T5ForConditionalGeneration.from_pretrained; transformer: model_type fsdp_transformer).
// torch_dtype: "float32" or "bfloat16", what the weights are stored as.
std::string hf_config_json(const ModelConfig& model, const std::string& torch_dtype);

}  // namespace fsdp
