#pragma once
// The input file's keys as one table (schema.cpp: schema()): each key's dotted path, where its
// value goes in a Config, its bounds and its one-line description. The reader (reader.cpp) checks
// a file against it, the rules (rules.cpp) add what involves several keys, and the key reference
// (reference.cpp, fsdp_app --keys) prints it. Internal to config/.
#include <cstddef>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "config/config.h"

namespace fsdp::config_internal {

// Bounds are models/args.h's: the model families' keys carry the same ones.
constexpr double kInf = Bound::kInf;

// Targets that need more than one scalar conversion.
struct Betas {
  double* b1;
  double* b2;
};
struct StepWindow {  // [first, last]
  int64_t* first;
  int64_t* last;
};
// An enumerated key: the value must be one of `names`; set(i) stores the i-th value, current()
// names the stored one (the key reference's default).
struct Choice {
  std::vector<std::string> names;
  std::function<void(size_t)> set;
  std::function<std::string()> current;
  bool per_build = false;  // `names` depend on the build: the key reference describes them instead
};
// A model family's key (models/family.h): converted by the ArgSpec of model.kind's family (of the
// first family that has the key, for a key the kind does not take: Reader::check_model names it).
struct ArgSlot {
  ModelConfig* model;
  std::string key;
};
using Target = std::variant<int64_t*, uint64_t*, double*, bool*, std::string*, std::vector<std::string>*, Betas,
                            EvalEvery*, StepWindow, Choice, ArgSlot>;

// The choice of one enum's name table (config/enums.h).
template <class E, size_t N>
Choice choice(E* dst, const NameTable<E, N>& table) {
  Choice c;
  for (const auto& [value, name] : table) c.names.emplace_back(name);
  c.set = [dst, &table](size_t i) { *dst = table[i].first; };
  c.current = [dst, &table] { return std::string(name_of(table, *dst)); };
  return c;
}

// A choice among values that name themselves (a subset of DType, Device).
template <class E, class NameFn>
Choice choice(E* dst, std::vector<E> values, NameFn name) {
  Choice c;
  for (E v : values) c.names.emplace_back(name(v));
  c.set = [dst, values = std::move(values)](size_t i) { *dst = values[i]; };
  c.current = [dst, name] { return std::string(name(*dst)); };
  return c;
}

// A string that must be one of `names` (comm.backend: the backends this build has; model.preset).
Choice choice(std::string* dst, std::vector<std::string> names);

struct Field {
  std::string path;  // dotted, as written in the YAML
  Target target;
  Bound bound = {};
  const char* doc = "";  // one line for the key reference: meaning, units, the PyTorch/HF name
};

// The one list of known keys, bound to c's members.
std::vector<Field> schema(Config& c);
// The model keys a family reads (model.kind and model.init_from: every kind): model.preset when
// it has presets, then its ArgSpecs' keys.
std::vector<std::string> model_keys(const ModelFamily& family);
// A Field over `value` (set to the spec's default first) that converts and describes model.<key>
// as `spec` types and bounds it: the reader's and the key reference's view of a family's key.
Field arg_field(const ArgSpec& spec, ArgValue& value);
// The spec of model.<key> for model.kind `kind`: its family's, or for a key it does not take the
// first registered family's that has one; nullptr when no family has the key.
const ArgSpec* arg_spec(const std::string& kind, const std::string& key);
// The settings each optimizer takes, as in PyTorch's constructors (which reject the others).
std::vector<std::string> optimizer_keys(OptimizerKind kind);

// PyTorch's defaults where they differ from OptimizerConfig's (which are adadelta's): applied when
// the key is not given, and listed by the key reference.
struct KindDefault {
  OptimizerKind kind;
  const char* key;
  double OptimizerConfig::*member;
  double value;
};
inline constexpr KindDefault kKindDefaults[] = {
    {OptimizerKind::adamw, "lr", &OptimizerConfig::lr, 1e-3},
    {OptimizerKind::adamw, "eps", &OptimizerConfig::eps, 1e-8},
    {OptimizerKind::adamw, "weight_decay", &OptimizerConfig::weight_decay, 0.01},
};

}  // namespace fsdp::config_internal
