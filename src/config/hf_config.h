#pragma once
// model.init_from as a Hugging Face model folder: its config.json gives the model keys. And the
// other way: the config.json `fsdp_ckpt export-hf` writes for a model config.
//
// The family is the one whose hf_model_type is config.json's model_type (models/family.h); its
// keys marked in_hf_config are config.json's names. A key the file leaves out takes the family's
// default, as transformers reads it (T5: T5Config's), unless the family requires every key (our
// decoder-only transformer, model_type "fsdp_transformer": no transformers class reads it).
#include <string>
#include <utility>
#include <vector>

namespace fsdp {

struct ModelConfig;

// How model.init_from is read: a folder is a Hugging Face model folder (config.json and
// safetensors), a path ending in .safetensors one safetensors file, anything else HDF5.
enum class InitFromKind { hdf5, safetensors_file, hf_folder };
InitFromKind init_from_kind(const std::string& path);

struct HfConfigKeys {
  std::string path;  // DIR/config.json, for messages
  std::string kind;  // the family's name (model.kind)
  // Every model key of that kind with its value as YAML scalar text ("768", "gated-gelu", "true").
  std::vector<std::pair<std::string, std::string>> keys;
};

// DIR/config.json's model keys; Error with one line naming the file when it is missing, is not
// JSON, names another model_type, or holds a key that is not a scalar.
HfConfigKeys read_hf_config(const std::string& dir);

// The config.json of a model: model_type, the family's keys, what the family adds
// (ModelFamily::hf_extra_json: T5's architectures and token ids, so that
// T5ForConditionalGeneration.from_pretrained loads it), torch_dtype.
// torch_dtype: "float32" or "bfloat16", what the weights are stored as.
std::string hf_config_json(const ModelConfig& model, const std::string& torch_dtype);

}  // namespace fsdp
