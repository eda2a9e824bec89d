// The registration: one line per model family. A new family is a folder under models/ whose
// family.cpp defines its ModelFamily, and a line here.
#include <algorithm>

#include "models/family.h"
#include "tensor/error.h"

namespace fsdp {

ModelFamily mnist_cnn_family();
ModelFamily transformer_family();
ModelFamily t5_family();
ModelFamily llama_family();

const std::vector<const ModelFamily*>& model_families() {
  // Made once, on first use (no static initialisation order between the families' files).
  static const std::vector<ModelFamily> families = {
      mnist_cnn_family(),
      transformer_family(),
      t5_family(),
      llama_family(),
  };
  static const std::vector<const ModelFamily*> pointers = [] {
    std::vector<const ModelFamily*> out;
    out.reserve(families.size());
    for (const ModelFamily& f : families) out.push_back(&f);
    return out;
  }();
  return pointers;
}

const ArgSpec* ModelFamily::spec(std::string_view key) const {
  const auto it = std::ranges::find(args, key, &ArgSpec::key);
  return it == args.end() ? nullptr : &*it;
}

ModelArgs ModelFamily::defaults() const {
  ModelArgs a;
  for (const ArgSpec& s : args) a.set(s.key, s.default_from.empty() ? s.fallback : *a.find(s.default_from));
  return a;
}

std::vector<std::string> ModelFamily::keys() const {
  std::vector<std::string> out;
  out.reserve(args.size());
  for (const ArgSpec& s : args) out.push_back(s.key);
  return out;
}

const ModelFamily* find_family(std::string_view name) {
  for (const ModelFamily* f : model_families())
    if (f->name == name) return f;
  return nullptr;
}

namespace {

std::string names_where(const std::function<bool(const ModelFamily&)>& keep) {
  std::vector<std::string> names;
  for (const ModelFamily* f : model_families())
    if (keep(*f)) names.push_back(f->name);
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

}  // namespace

const ModelFamily& family_of(std::string_view name) {
  if (const ModelFamily* f = find_family(name)) return *f;
  throw Error("model.kind '" + std::string(name) + "': not " + family_names());
}

std::string family_names() {
  return names_where([](const ModelFamily&) { return true; });
}

std::string family_names(ModelTask task) {
  return names_where([task](const ModelFamily& f) { return f.task == task; });
}

std::string generating_family_names() {
  return names_where([](const ModelFamily& f) { return f.generates; });
}

}  // namespace fsdp
