// The checks that involve several keys, and the keys a model folder's config.json fills
// (model.init_from): the reader's last pass (reader.h).
#include <cmath>
#include <filesystem>

#include "config/hf_config.h"
#include "config/reader.h"
#include "config/yaml_text.h"

namespace fsdp::config_internal {

void Reader::check_optimizer(OptimizerConfig& o) const {
  const std::string p = "train.optimizer.";
  const std::vector<std::string> own = optimizer_keys(o.kind);
  for (const auto& [path, g] : given_)
    if (path.starts_with(p) && path != p + "kind" && std::ranges::find(own, path.substr(p.size())) == own.end())
      fail(path, "not a setting of optimizer " + std::string(enum_name(o.kind)) + " (it takes " + join(own) + ")");
  if (o.kind == OptimizerKind::sgd && !given(p + "lr"))
    throw ConfigError(at(p + "kind") + ": " + p + "lr: required for sgd (PyTorch has no default)");
  for (const KindDefault& d : kKindDefaults)
    if (o.kind == d.kind && !given(p + d.key)) o.*d.member = d.value;
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
    fail(p + "nesterov", "requires momentum > 0 and dampening 0");
}

// The keys of model.kind's family: one another family takes is an error (unless this family
// ignores it); the others come from the preset or the defaults, in that order.
void Reader::check_model(ModelConfig& m) const {
  const std::string p = "model.";
  const ModelFamily& family = m.family();
  const std::vector<std::string> own = model_keys(family);
  for (const auto& [path, g] : given_) {
    if (!path.starts_with(p) || path == p + "kind" || path == p + "init_from") continue;
    const std::string key = path.substr(p.size());
    if (std::ranges::find(own, key) != own.end()) continue;
    if (std::ranges::find(family.ignores, key) != family.ignores.end()) {
      m.args.erase(key);
      continue;
    }
    fail(path, "not a setting of model " + family.name + " (it takes " +
                   (own.empty() ? std::string("none") : join(own)) + ")");
  }
  const ModelPreset* preset = nullptr;
  for (const ModelPreset& candidate : family.presets)
    if (candidate.name == m.preset) preset = &candidate;
  if (!m.preset.empty() && !preset) fail(p + "preset", "'" + m.preset + "' is not a preset of model " + family.name);
  auto preset_value = [&](const std::string& key) -> const ArgValue* {
    if (!preset) return nullptr;
    const auto it = std::ranges::find(preset->values, key, &std::pair<std::string, ArgValue>::first);
    return it == preset->values.end() ? nullptr : &it->second;
  };
  for (const ArgSpec& spec : family.args) {  // default_from names an earlier key
    if (m.args.find(spec.key)) continue;     // given, or from model.init_from's config.json
    if (const ArgValue* v = preset_value(spec.key))
      m.args.set(spec.key, *v);
    else
      m.args.set(spec.key, spec.default_from.empty() ? spec.fallback : *m.args.find(spec.default_from));
  }
}

// model.init_from as a Hugging Face folder: its config.json fills the model keys (model.kind
// too, when the YAML leaves it out). A key the YAML also gives must have the file's value: the
// folder's weights were made with it, and an override would fail later as a shape mismatch or,
// for layer_norm_epsilon, not at all. The exception is dropout_rate, a training choice the YAML
// may change, as transformers' from_pretrained(DIR, dropout_rate=...) does.
void Reader::read_init_from_config(Config& c, const std::vector<Field>& table) {
  if (c.model.init_from.empty() || init_from_kind(c.model.init_from) != InitFromKind::hf_folder) return;
  HfConfigKeys hf;
  try {
    hf = read_hf_config(c.model.init_from);
  } catch (const Error& e) {
    fail("model.init_from", e.what());
  }
  const std::string& kind = hf.kind;
  if (given("model.kind") && c.model.kind != hf.kind)
    fail("model.kind", "is " + c.model.kind + ", but " + hf.path + " describes a " + kind + " model");
  if (!given("model.kind")) from_init_from_.emplace_back("model.kind", kind);
  c.model.kind = hf.kind;
  if (given("model.preset"))
    fail("model.preset",
         "a preset and a model folder (model.init_from) both set the model keys; give one (" + hf.path + " has them)");
  auto field = [](const std::vector<Field>& fields, const std::string& path) -> const Field& {
    return *std::ranges::find_if(fields, [&](const Field& f) { return f.path == path; });
  };
  Reader file(hf.path);  // its messages name config.json
  for (const auto& [key, text] : hf.keys) {
    const std::string path = "model." + key;
    const YAML::Node value(text);
    file.given_.emplace(path, Given{value, YAML::Mark::null_mark()});
    if (!given(path)) {
      file.convert(field(table, path), value);
      from_init_from_.emplace_back(path, text);
      continue;
    }
    Config in_file, in_yaml;
    in_file.model.kind = in_yaml.model.kind = kind;
    file.convert(field(schema(in_file), path), value);
    convert(field(schema(in_yaml), path), given_.at(path).value);
    if (key == "dropout_rate" || in_file.model == in_yaml.model) continue;
    fail(path, "'" + given_.at(path).value.Scalar() + "' disagrees with " + text + " in " + hf.path +
                   " (the folder's weights were made with that; remove the key or make it agree)");
  }
}

// The later key of a pair is the one more likely just edited.
std::string Reader::blame(const std::string& a, const std::string& b) const { return given(b) ? b : a; }

// Rules are checked in a fixed order (model and generation, data, run): the first broken one is
// the error, so an input that breaks several always names the same one.
void Reader::check_rules(const Config& c) const {
  check_generate_rules(c);
  check_data_rules(c);
  check_run_rules(c);
}

// The family's own check, then generate.* against what the model decodes.
void Reader::check_generate_rules(const Config& c) const {
  const ModelConfig& m = c.model;
  const ModelFamily& family = m.family();
  if (family.check)
    if (const auto problem = family.check(m.args, model_run_facts(c)))
      fail(problem->other.empty() ? problem->key : blame(problem->key, problem->other), problem->message);
  const bool seq2seq = family.task == ModelTask::seq2seq;
  const std::string seq2seq_kinds = family_names(ModelTask::seq2seq);
  const bool lm = family.task == ModelTask::causal_lm;
  for (const auto& [path, g] : given_) {
    if (!path.starts_with("generate.")) continue;
    if (!family.generates)
      fail(path, "text generation needs a model that generates (model.kind " + generating_family_names() +
                     "); model.kind is " + m.kind);
    const bool seq2seq_only =
        path == "generate.length_penalty" || path == "generate.rouge_samples" || path == "generate.num_beams";
    if (lm && seq2seq_only && !(path == "generate.num_beams" && c.generate.num_beams == 1))
      fail(path, "is for model.kind " + seq2seq_kinds + " (beam search, ROUGE); model.kind " + m.kind +
                     " decodes greedily or samples");
    if (seq2seq && path == "generate.prompt_len")
      fail(path, "is for causal LMs (model.kind " + family_names(ModelTask::causal_lm) + "); model.kind " + m.kind +
                     " decodes from its source");
  }
  if (c.generate.do_sample && c.generate.num_beams > 1)
    fail(blame("generate.do_sample", "generate.num_beams"),
         "sampling with beams (HF's beam sampling) is not implemented: generate.num_beams must be 1");
  if (lm && !family.seq_len_key.empty() && c.generate.prompt_len >= m.args.i64(family.seq_len_key))
    fail(blame("model." + family.seq_len_key, "generate.prompt_len"),
         "generate.prompt_len (" + std::to_string(c.generate.prompt_len) + ") must be below model." +
             family.seq_len_key + " (" + std::to_string(m.args.i64(family.seq_len_key)) +
             "): a validation sample is the prompt and its reference");
}

// data.* against the model's task and against each other.
void Reader::check_data_rules(const Config& c) const {
  const ModelConfig& m = c.model;
  const ModelFamily& family = m.family();
  const bool seq2seq = family.task == ModelTask::seq2seq;
  const std::string seq2seq_kinds = family_names(ModelTask::seq2seq);
  const bool pairs = c.data.kind == DataKind::seq2seq || c.data.kind == DataKind::synthetic;
  const bool lm = family.task == ModelTask::causal_lm;
  if ((c.data.kind == DataKind::seq2seq && !seq2seq) || (seq2seq && !pairs))
    fail(blame("model.kind", "data.kind"), "model.kind " + (seq2seq ? m.kind : seq2seq_kinds) +
                                               " reads data.kind seq2seq (or synthetic); got model.kind " + m.kind +
                                               " with data.kind " + std::string(enum_name(c.data.kind)));
  const bool causal_lm_data = c.data.kind == DataKind::causal_lm;
  if (causal_lm_data && !lm)
    fail(blame("model.kind", "data.kind"), "data.kind causal_lm is text for a causal LM (model.kind " +
                                               family_names(ModelTask::causal_lm) + "); model.kind is " + m.kind);
  // With data.tokenizer the model's size is checked against the model file when it is read.
  if ((seq2seq || causal_lm_data) && c.data.tokenizer.empty() && family.outputs(m.args) < 259)
    fail("model." + family.vocab_key,
         "must be >= 259 for " + m.kind + "'s byte tokens (ids 3..258), got " + std::to_string(family.outputs(m.args)));
  if (c.data.kind == DataKind::seq2seq && c.data.path.empty())
    fail("data.path", "data.kind seq2seq needs data.path (a CSV or JSON-lines file)");
  if (causal_lm_data && c.data.path.empty())
    fail("data.path", "data.kind causal_lm needs data.path (a text or JSON-lines file, or a folder)");
  if (!c.data.tokenizer.empty() && !seq2seq && !causal_lm_data)
    fail(blame("data.kind", "data.tokenizer"), "is for data.kind seq2seq or causal_lm (SentencePiece ids); data.kind " +
                                                   std::string(enum_name(c.data.kind)) + " reads bytes");
  if (!c.data.eval_path.empty() && c.data.kind != DataKind::seq2seq && !causal_lm_data)
    fail("data.eval_path", "is for data.kind seq2seq or causal_lm (a validation file beside data.path)");
  for (const char* key : {"data.field", "data.sft", "data.pack", "data.prompt", "data.response"})
    if (given(key) && !causal_lm_data)
      fail(blame("data.kind", key), "is for data.kind causal_lm; data.kind is " + std::string(enum_name(c.data.kind)));
  for (const char* key : {"data.pack", "data.prompt", "data.response"})
    if (given(key) && !c.data.sft) fail(blame("data.sft", key), "is for data.sft: true (prompt/response pairs)");
  if (given("data.field") && c.data.sft)
    fail(blame("data.sft", "data.field"),
         "is for pretraining rows; with data.sft the rows are data.prompt and data.response");
  if (!c.data.eval_path.empty() && given("data.eval_fraction"))
    fail(blame("data.eval_path", "data.eval_fraction"),
         "data.eval_path and data.eval_fraction both given: the validation rows come from one of them");
}

// train, fsdp, comm, checkpoint and output keys that depend on one another.
void Reader::check_run_rules(const Config& c) const {
  if (c.train.epochs == 0 && c.train.steps == 0)
    fail(blame("train.epochs", "train.steps"),
         "train.epochs and train.steps are both 0; one of them must bound the run");
  // Both are about device memory: on cpu the shards are already host memory, and NCCL moves only
  // device buffers.
  if (c.fsdp.cpu_offload && c.train.device != Device::cuda)
    fail(blame("fsdp.cpu_offload", "train.device"),
         "fsdp.cpu_offload needs train.device: cuda (on cpu the shards already live in host memory)");
  if (c.comm.backend == "nccl" && c.train.device != Device::cuda)
    fail(blame("comm.backend", "train.device"),
         "comm.backend nccl needs train.device: cuda (NCCL moves device memory)");
  // Checkpoints and output.save_weights take any device: device shards, optimizer state and
  // gathered units are staged through host memory for HDF5 (train/checkpointing.h, trainer.cpp).
  if (c.fsdp.wrap_policy == WrapPolicy::manual && c.fsdp.wrap_modules.empty())
    fail("fsdp.auto_wrap.policy", "manual requires a non-empty fsdp.auto_wrap.modules list");
  const CheckpointConfig& k = c.checkpoint;
  if (k.dir.empty()) {
    if (k.every_steps > 0) fail("checkpoint.every_steps", "needs checkpoint.dir");
    if (k.save_best) fail("checkpoint.save_best", "needs checkpoint.dir");
    if (k.resume == "auto")
      fail("checkpoint.resume", "auto needs checkpoint.dir (it resumes from the newest file there)");
  }
  if (given("output.trace_steps") && c.output.trace.empty())
    fail("output.trace_steps", "needs output.trace (the file the steps are traced to)");
  if (k.save_best && c.train.eval_every.never())
    fail(blame("checkpoint.save_best", "train.eval_every"),
         "checkpoint.save_best needs evaluations (train.eval_every is never)");
}

}  // namespace fsdp::config_internal
