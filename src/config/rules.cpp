// The checks that involve several keys, and the keys a model folder's config.json fills
// (model.init_from): the reader's last pass (reader.h).
#include <cmath>
#include <filesystem>

#include "config/hf_config.h"
#include "config/presets.h"
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

void Reader::check_model(ModelConfig& m) const {
  const std::string p = "model.";
  const std::vector<std::string> own = model_keys(m.kind);
  // mnist_cnn has always ignored the transformer's keys (inputs set them for either kind); a
  // key of the other LM, though, is a mistake worth a line.
  const std::vector<std::string> t5_keys = model_keys(ModelKind::t5), lm_keys = model_keys(ModelKind::transformer);
  for (const auto& [path, g] : given_) {
    if (!path.starts_with(p) || path == p + "kind" || path == p + "init_from") continue;
    const std::string key = path.substr(p.size());
    if (std::ranges::find(own, key) != own.end()) continue;
    const bool t5_key =
        std::ranges::find(t5_keys, key) != t5_keys.end() && std::ranges::find(lm_keys, key) == lm_keys.end();
    if (m.kind == ModelKind::t5 || t5_key)
      fail(path, "not a setting of model " + std::string(enum_name(m.kind)) + " (it takes " +
                     (own.empty() ? std::string("none") : join(own)) + ")");
  }
  if (m.kind != ModelKind::t5) return;
  for (const T5Preset& t : kT5Presets) {
    if (m.preset != t.name) continue;
    auto set = [&](const char* key, auto& field, auto value) {
      if (!given(p + key)) field = value;
    };
    set("d_model", m.d_model, t.d_model);
    set("d_kv", m.d_kv, t.d_kv);
    set("d_ff", m.d_ff, t.d_ff);
    set("num_layers", m.num_layers, t.layers);
    set("num_heads", m.num_heads, t.heads);
    set("feed_forward_proj", m.feed_forward_proj, t.v1_1 ? FeedForwardProj::gated_gelu : FeedForwardProj::relu);
    set("tie_word_embeddings", m.tie_word_embeddings, !t.v1_1);
  }
  const bool from_file =
      std::ranges::any_of(from_init_from_, [&](const auto& kv) { return kv.first == p + "num_decoder_layers"; });
  if (!given(p + "num_decoder_layers") && !from_file) m.num_decoder_layers = m.num_layers;
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
  const std::string kind(name_of(kModelKinds, hf.kind));
  if (given("model.kind") && c.model.kind != hf.kind)
    fail("model.kind", "is " + std::string(name_of(kModelKinds, c.model.kind)) + ", but " + hf.path + " describes a " +
                           kind + " model");
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
    file.convert(field(schema(in_file), path), value);
    convert(field(schema(in_yaml), path), given_.at(path).value);
    if (key == "dropout_rate" || in_file.model == in_yaml.model) continue;
    fail(path, "'" + given_.at(path).value.Scalar() + "' disagrees with " + text + " in " + hf.path +
                   " (the folder's weights were made with that; remove the key or make it agree)");
  }
}

void Reader::check_rules(const Config& c) const {
  // The later key of a pair is the one more likely just edited.
  auto blame = [&](const std::string& a, const std::string& b) { return given(b) ? b : a; };
  const ModelConfig& m = c.model;
  if (m.kind != ModelKind::t5 && m.d_model % m.n_heads != 0)
    fail(blame("model.d_model", "model.n_heads"), "model.d_model (" + std::to_string(m.d_model) +
                                                      ") must be divisible by model.n_heads (" +
                                                      std::to_string(m.n_heads) + ")");
  if (m.kind != ModelKind::transformer && m.attention != AttentionMode::materialized)
    fail(blame("model.kind", "model.attention"), "model.attention: " + std::string(enum_name(m.attention)) +
                                                     " is for model.kind transformer (model.kind is " +
                                                     std::string(enum_name(m.kind)) + ")");
  const bool pairs = c.data.kind == DataKind::seq2seq || c.data.kind == DataKind::synthetic;
  if (m.kind != ModelKind::t5)
    for (const auto& [path, g] : given_)
      if (path.starts_with("generate."))
        fail(path, "text generation needs a sequence-to-sequence model (model.kind t5); model.kind is " +
                       std::string(enum_name(m.kind)));
  if ((c.data.kind == DataKind::seq2seq && m.kind != ModelKind::t5) || (m.kind == ModelKind::t5 && !pairs))
    fail(blame("model.kind", "data.kind"), "model.kind t5 reads data.kind seq2seq (or synthetic); got model.kind " +
                                               std::string(enum_name(m.kind)) + " with data.kind " +
                                               std::string(enum_name(c.data.kind)));
  // With data.tokenizer the model's size is checked against the model file when it is read.
  if (m.kind == ModelKind::t5 && c.data.tokenizer.empty() && m.vocab_size < 259)
    fail("model.vocab_size", "must be >= 259 for t5's byte tokens (ids 3..258), got " + std::to_string(m.vocab_size));
  if (c.data.kind == DataKind::seq2seq && c.data.path.empty())
    fail("data.path", "data.kind seq2seq needs data.path (a CSV or JSON-lines file)");
  if (!c.data.tokenizer.empty() && m.kind != ModelKind::t5)
    fail("data.tokenizer",
         "is for model.kind t5 (SentencePiece ids); model.kind " + std::string(enum_name(m.kind)) + " reads bytes");
  if (!c.data.eval_path.empty() && c.data.kind != DataKind::seq2seq)
    fail("data.eval_path", "is for data.kind seq2seq (a validation file beside data.path)");
  if (!c.data.eval_path.empty() && given("data.eval_fraction"))
    fail(blame("data.eval_path", "data.eval_fraction"),
         "data.eval_path and data.eval_fraction both given: the validation rows come from one of them");
  if (c.data.kind == DataKind::text && m.vocab > 256)
    fail("model.vocab", "must be <= 256 when data.kind is text (tokens are bytes), got " + std::to_string(m.vocab));
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
  // Fused attention is cuDNN's flash attention: a GPU's, with bf16 operands (what medium already
  // does to every GEMM operand), head dims in multiples of 8.
  if (m.attention == AttentionMode::fused && m.kind == ModelKind::transformer) {
    if (c.train.device != Device::cuda)
      fail(blame("model.attention", "train.device"),
           "model.attention: fused needs train.device: cuda (cuDNN's flash attention); on the CPU, recompute keeps "
           "the same memory");
    else if (c.train.matmul_precision != MatmulPrecision::medium)
      fail(blame("model.attention", "train.matmul_precision"),
           "model.attention: fused multiplies bf16 operands; it needs train.matmul_precision: medium (is " +
               std::string(matmul_precision_name(c.train.matmul_precision)) + ")");
    else if (m.d_model % m.n_heads == 0 && (m.d_model / m.n_heads) % 8 != 0)
      fail(blame("model.attention", "model.n_heads"),
           "model.attention: fused needs a head dim (d_model / n_heads) that is a multiple of 8, got " +
               std::to_string(m.d_model / m.n_heads));
  }
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
