// The input file's public entry points (config.h). The reader is reader.cpp (its passes) and
// rules.cpp (the checks between keys), the table of keys schema.cpp, the presets presets.h, the
// key reference reference.cpp.
//
// yaml_text: without overrides it is the file text verbatim (comments kept); with overrides it is
// the merged tree emitted by YAML::Emitter under a comment naming the overrides, so that parsing
// yaml_text alone reproduces the run exactly (a list of "--set" lines in a comment would not).
#include "config/config.h"

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "config/reader.h"

namespace fsdp {

using config_internal::merged_text;
using config_internal::Reader;

Config parse_config(const std::string& yaml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides) {
  Reader reader(source_name);
  YAML::Node root = reader.load(yaml_text);
  for (const auto& o : overrides) reader.apply(o, root);
  Config c;
  reader.read(root, c);
  c.source_path = source_name;
  // Keys from a model folder's config.json go into the text too: a checkpoint's config_yaml then
  // describes the model without the folder (fsdp_ckpt export-hf reads it).
  std::string keys_from;
  for (const auto& [path, text] : reader.from_init_from()) {
    root["model"][path.substr(path.find('.') + 1)] = text;
    keys_from = (std::filesystem::path(c.model.init_from) / "config.json").string();
  }
  c.yaml_text =
      overrides.empty() && keys_from.empty() ? yaml_text : merged_text(root, source_name, overrides, keys_from);
  return c;
}

std::string EvalEvery::text() const {
  return when == When::epoch ? "epoch" : when == When::never ? "never" : std::to_string(steps);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  struct Close {
    void operator()(std::FILE* f) const { (void)std::fclose(f); }  // opened for reading: nothing to lose
  };
  auto cannot_read = [&] { return ConfigError(path + ": cannot read input file (" + std::strerror(errno) + ")"); };
  const std::unique_ptr<std::FILE, Close> file(std::fopen(path.c_str(), "rb"));
  if (!file) throw cannot_read();
  std::string text;
  char buf[1 << 16];
  for (size_t n = 0; (n = std::fread(buf, 1, sizeof buf, file.get())) > 0;) text.append(buf, n);
  if (std::ferror(file.get())) throw cannot_read();  // e.g. a directory: EISDIR
  Config c = parse_config(text, path, overrides);
  // A file with no settings (empty, only comments, `{}`) would train the defaults without a word:
  // almost always the wrong file or one truncated on its way. With --set overrides it is a way to
  // give every key on the command line, and stays allowed.
  if (overrides.empty()) {
    const YAML::Node root = YAML::Load(text);  // parses: parse_config accepted it
    if (root.IsNull() || (root.IsMap() && root.size() == 0))
      throw ConfigError(path + ": empty input file: no settings (see input/ for examples)");
  }
  return c;
}

DType compute_dtype(const MixedPrecisionConfig& mp) {
  return mp.compute == ComputePrecision::param_dtype ? mp.param_dtype : DType::f32;
}

DType saved_activation_dtype(const MixedPrecisionConfig& mp) {
  return mp.saved_activations == ComputePrecision::param_dtype ? compute_dtype(mp) : DType::f32;
}

ModelRunFacts model_run_facts(const Config& c) {
  return {c.data.kind, c.train.device, c.train.matmul_precision, compute_dtype(c.fsdp.mixed_precision)};
}

Config for_world_size(const Config& config, int world_size) {
  Config c = config;
  const int64_t global = c.train.global_batch_size;
  if (global > 0) {
    if (global % world_size != 0)
      throw ConfigError(c.source_path + ": train.global_batch_size " + std::to_string(global) +
                        " is not divisible by the " + std::to_string(world_size) + " ranks of this run");
    c.train.batch_size = global / world_size;
  }
  return c;
}
}  // namespace fsdp
