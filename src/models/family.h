#pragma once
// A model family is one registration (torchtitan's TrainSpec): everything the rest of the program
// knows about a kind of model comes from its ModelFamily, defined in the family's folder
// (models/<name>/family.cpp) and listed once in models/families.cpp. The input file's reader
// (model.* keys, defaults, presets, rules), the Hugging Face folder reader and writer, the data
// loader, the trainer and the plan read the table; none of them switches on a model's name.
//
// What a family does not list here its Model says itself, as transformers' PreTrainedModel does:
// the block classes the transformer_layer policy wraps (Model::block_types, HF's
// _no_split_modules) and decoding (Model::generate, for ModelTask::seq2seq).
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "data/kinds.h"
#include "models/args.h"
#include "tensor/matmul_precision.h"
#include "tensor/tensor.h"  // Device

namespace fsdp {

class Model;

// What a family's model reads and outputs; the data it trains on follows from it.
enum class ModelTask {
  image_classification,  // images (fashion_mnist, synthetic images) -> class log-probs
  causal_lm,             // token sequences (text, synthetic tokens) -> next-token logits
  seq2seq,               // (source, target) pairs (seq2seq, synthetic pairs) -> target logits; decodes
};
inline constexpr NameTable<ModelTask, 3> kModelTasks{{{ModelTask::image_classification, "image classification"},
                                                      {ModelTask::causal_lm, "causal language modelling"},
                                                      {ModelTask::seq2seq, "sequence to sequence"}}};

// One model.<key>: its type and default (the alternative `fallback` holds), its range or allowed
// values, whether config.json holds it (under the same name), and its line in the key reference.
struct ArgSpec {
  std::string key;
  ArgValue fallback;
  Bound bound = {};                  // numbers
  std::vector<std::string> choices;  // strings: the allowed values (empty: any)
  bool in_hf_config = true;          // a key of the family's config.json
  std::string default_from;          // non-empty: the default is this key's value (T5's num_decoder_layers)
  std::string doc;
};

// model.preset NAME: the keys a Hugging Face hub model's config.json sets, as values of the
// keys' types; the other keys keep their defaults.
struct ModelPreset {
  std::string name;
  std::vector<std::pair<std::string, ArgValue>> values;
};

// How a Hugging Face checkpoint names what this model names once.
struct HfNames {
  // Our name -> other names a file may hold it under, tried in order when it lacks ours (T5's
  // shared.weight saved as encoder.embed_tokens.weight, its tied alias). Present aliases must
  // have the parameter's shape and its values (the loaders compare them).
  std::map<std::string, std::vector<std::string>> aliases;
  // Names a file may hold that this model does not read (a tied T5's lm_head.weight).
  std::set<std::string> ignored;
};

// What of the rest of the run a family's own rules may read.
struct ModelRunFacts {
  DataKind data_kind = DataKind::fashion_mnist;
  Device device = Device::cpu;
  MatmulPrecision matmul_precision = MatmulPrecision::highest;
  DType compute_dtype = DType::f32;  // the dtype the model computes in (fsdp.mixed_precision.compute)
};

// A family's rule broken: `key` is the model key at fault, `other` ("" none) the key of another
// section it conflicts with (the reader blames the one the input file gave last).
struct ArgProblem {
  std::string key;
  std::string other;
  std::string message;  // "model.d_model (100) must be divisible by model.n_heads (8)"
};

struct ModelFamily {
  std::string name;     // model.kind
  std::string summary;  // the key reference's one line: what the model is
  ModelTask task = ModelTask::image_classification;
  std::vector<ArgSpec> args;
  // Keys of other families this one accepts and ignores (mnist_cnn the transformer's sizes, so
  // that one input file switches between the two).
  std::vector<std::string> ignores;
  std::vector<ModelPreset> presets;
  // The keys whose values size the data: vocab_key the token ids (causal_lm, seq2seq), seq_len_key
  // a causal LM's tokens per sample (the data's, not the model's, for families without one).
  std::string vocab_key, seq_len_key;
  // causal_lm: the keys of the bos and eos ids the data's tokenizer must use ("" none: 1 and 2).
  std::string bos_key, eos_key;
  int64_t classes = 0;  // image_classification: outputs
  // Its Model implements generate() (`fsdp_app --generate`, the generate.* keys): t5 and llama.
  bool generates = false;
  // config.json's model_type: a Hugging Face folder of this family (model.init_from, fsdp_ckpt
  // export-hf); "" none. A key config.json leaves out takes its default, as transformers reads
  // it, unless hf_keys_required (a model_type no transformers class reads: every key is needed).
  std::string hf_model_type;
  bool hf_keys_required = false;

  std::function<std::unique_ptr<Model>(const ModelArgs&)> make;
  // config.json's other entries (architectures, what HF derives from the keys, token ids), added
  // after model_type and the keys: the JSON text of an object (a string keeps nlohmann out of
  // this header). Empty function: none.
  std::function<std::string(const ModelArgs&)> hf_extra_json;
  std::function<HfNames(const ModelArgs&)> hf_names;  // empty function: no aliases
  // Keys read from config.json's entries that are not scalars (Llama's rope_scaling object), as
  // (key, YAML text) pairs given the JSON text of the whole file; they replace what the scalar
  // keys gave. An Error names the entry at fault. Empty function: none.
  std::function<std::vector<std::pair<std::string, std::string>>(const std::string& config_json)> hf_config_keys;
  // The family's rules between its keys and the rest of the run; empty function: none.
  std::function<std::optional<ArgProblem>(const ModelArgs&, const ModelRunFacts&)> check;
  // model.attention: auto (a family whose attention can be fused): sets the key to the mode this run
  // takes, from its facts and the kernels' word on fused attention (kernels_refusal: "" available,
  // else why not), and returns the banner's words for it ("" when the key was not auto). Empty
  // function: nothing to resolve.
  std::function<std::string(ModelArgs&, const ModelRunFacts&, const std::string& kernels_refusal)> resolve_attention;

  const ArgSpec* spec(std::string_view key) const;
  // Every key's default (default_from resolved): the arguments of a model no input file changed.
  ModelArgs defaults() const;
  // The model's outputs per position: its vocabulary (vocab_key) or its classes.
  int64_t outputs(const ModelArgs& a) const { return vocab_key.empty() ? classes : a.i64(vocab_key); }
  std::vector<std::string> keys() const;  // args' keys in table order
};

// Every registered family, in registration order (models/families.cpp).
const std::vector<const ModelFamily*>& model_families();
// The family named `name`; nullptr when none is.
const ModelFamily* find_family(std::string_view name);
// The family named `name`; an Error naming the registered ones when none is.
const ModelFamily& family_of(std::string_view name);
// "mnist_cnn, transformer or t5": for messages.
std::string family_names();
// The families whose task is `task`, as family_names writes them ("t5").
std::string family_names(ModelTask task);
// The families that generate text (ModelFamily::generates): "t5 or llama".
std::string generating_family_names();

}  // namespace fsdp
