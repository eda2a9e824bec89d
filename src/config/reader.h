#pragma once
// Input file -> Config in three passes over one YAML tree (config.cpp's parse_config drives it):
//  1. the file is parsed and the --set overrides are merged into the tree (load, apply), so a
//     value from the command line goes through exactly the same checks as one from the file;
//  2. the tree is walked against the table of known keys (schema.h: unknown keys, sections that
//     are not maps, keys given twice);
//  3. each given value is converted and range-checked from the same table, then the rules that
//     involve several keys run (rules.cpp).
// Only keys the user gave are checked one by one: the defaults in config.h are valid by
// construction, and a missing key has no line to point at. Internal to config/.
#include <yaml-cpp/yaml.h>

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "config/schema.h"

namespace fsdp::config_internal {

class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  YAML::Node load(const std::string& text) const;
  void apply(const std::string& override_text, YAML::Node& root);
  void read(const YAML::Node& root, Config& c);
  // The model keys a model.init_from folder's config.json set (path, YAML text), model.kind
  // first when it came from there: parse_config writes them into yaml_text.
  const std::vector<std::pair<std::string, std::string>>& from_init_from() const { return from_init_from_; }

 private:
  struct Given {
    YAML::Node value;
    YAML::Mark mark;  // of the key: a value's own mark can be lines further down
  };

  // A value without a place (a config.json's) is named by its file alone.
  std::string file_at(const YAML::Mark& mark) const {
    if (mark.is_null()) return source_;
    return source_ + ":" + std::to_string(std::max(mark.line, 0) + 1);
  }
  std::string where(const std::string& path, const YAML::Mark& mark) const;
  std::string at(const std::string& path) const;
  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw ConfigError(at(path) + ": " + path + ": " + what);
  }
  bool given(const std::string& path) const { return given_.contains(path); }

  void walk(const YAML::Node& map, const std::string& prefix, const std::set<std::string>& fields,
            const std::set<std::string>& sections);
  void convert(const Field& f, const YAML::Node& v) const;
  ArgValue convert_arg(const std::string& path, const ArgSlot& slot, const YAML::Node& v) const;
  void check_optimizer(OptimizerConfig& o) const;
  void read_init_from_config(Config& c, const std::vector<Field>& table);
  void check_model(ModelConfig& m) const;
  void check_rules(const Config& c) const;  // check_generate_rules, check_data_rules, check_run_rules
  void check_generate_rules(const Config& c) const;
  void check_data_rules(const Config& c) const;
  void check_run_rules(const Config& c) const;
  std::string blame(const std::string& a, const std::string& b) const;

  std::string source_;
  std::vector<std::string> set_keys_;  // overrides applied so far, in order
  std::map<std::string, Given> given_;
  std::vector<std::pair<std::string, std::string>> from_init_from_;
};

// The merged tree as YAML text under a comment naming the overrides (Config::yaml_text).
std::string merged_text(const YAML::Node& root, const std::string& source, const std::vector<std::string>& overrides,
                        const std::string& keys_from);

}  // namespace fsdp::config_internal
