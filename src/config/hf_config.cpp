#include "config/hf_config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "config/config.h"
#include "tensor/error.h"

namespace fsdp {

namespace {

using Json = nlohmann::json;

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
  const ModelFamily* family = nullptr;
  std::string known;
  for (const ModelFamily* f : model_families()) {
    if (f->hf_model_type.empty()) continue;
    if (f->hf_model_type == model_type) family = f;
    known += (known.empty() ? "" : ", ") + f->hf_model_type + " (model.kind " + f->name + ")";
  }
  if (!family)
    throw Error(out.path + ": model_type " + (model_type.empty() ? std::string("missing") : "'" + model_type + "'") +
                "; fsdp_app reads " + known);
  out.kind = family->name;
  for (const ArgSpec& spec : family->args) {
    if (!spec.in_hf_config) continue;
    const auto it = j.find(spec.key);
    std::string value = it == j.end() ? "" : scalar_text(*it, spec.key, out.path);  // null: the default
    if (value.empty() && family->hf_keys_required)
      throw Error(out.path + ": no " + spec.key + " (model_type " + model_type + ")");
    if (value.empty() && !spec.default_from.empty())
      value = std::ranges::find(out.keys, spec.default_from, &std::pair<std::string, std::string>::first)->second;
    else if (value.empty())
      value = arg_text(spec.fallback);
    out.keys.emplace_back(spec.key, value);
  }
  std::vector<std::pair<std::string, std::string>> structured;
  if (family->hf_config_keys) try {
      structured = family->hf_config_keys(j.dump());
    } catch (const Error& e) {
      throw Error(out.path + ": " + e.what());
    }
  for (auto& [key, value] : structured) {
    const auto at = std::ranges::find(out.keys, key, &std::pair<std::string, std::string>::first);
    if (at != out.keys.end())
      at->second = value;
    else
      out.keys.emplace_back(key, value);
  }
  return out;
}

std::string hf_config_json(const ModelConfig& m, const std::string& torch_dtype) {
  const ModelFamily& family = m.family();
  if (family.hf_model_type.empty()) {
    std::string have;
    for (const ModelFamily* f : model_families())
      if (!f->hf_model_type.empty()) have += (have.empty() ? "" : ", ") + f->name;
    throw Error("model.kind " + m.kind + ": no Hugging Face export (" + have + " have one)");
  }
  nlohmann::ordered_json j;
  j["model_type"] = family.hf_model_type;
  for (const ArgSpec& spec : family.args) {
    if (!spec.in_hf_config) continue;
    std::visit([&](const auto& v) { j[spec.key] = v; }, *m.args.find(spec.key));
  }
  if (family.hf_extra_json) {
    const nlohmann::ordered_json extra = nlohmann::ordered_json::parse(family.hf_extra_json(m.args));
    for (const auto& [key, value] : extra.items()) j[key] = value;
  }
  j["torch_dtype"] = torch_dtype;
  return j.dump(2) + "\n";
}

}  // namespace fsdp
