#pragma once
// A model family's hyperparameters by key: what the input file's model section sets, each key
// named as the family's Hugging Face config.json names it where the family has one. The family's
// table (models/family.h) gives every key's type, bounds and default; a value here always has its
// key's type, so the family's code reads it with the matching accessor.
#include <cstdint>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <variant>

namespace fsdp {

using ArgValue = std::variant<int64_t, double, bool, std::string>;

// An argument's value as YAML scalar text ("768", "1e-06", "true", "gated-gelu"): how presets and
// config.json values travel to the input file's reader and back into a run's yaml_text.
std::string arg_text(const ArgValue& v);
// The type's name for messages: "integer", "number", "boolean", "string".
const char* arg_type_name(const ArgValue& v);

class ModelArgs {
 public:
  int64_t i64(std::string_view key) const { return get<int64_t>(key); }
  double f64(std::string_view key) const { return get<double>(key); }
  bool flag(std::string_view key) const { return get<bool>(key); }
  const std::string& text(std::string_view key) const { return get<std::string>(key); }
  const ArgValue* find(std::string_view key) const {
    const auto it = values_.find(key);
    return it == values_.end() ? nullptr : &it->second;
  }
  void set(const std::string& key, ArgValue value) { values_[key] = std::move(value); }
  void erase(std::string_view key) {
    if (const auto it = values_.find(key); it != values_.end()) values_.erase(it);
  }
  const std::map<std::string, ArgValue, std::less<>>& values() const { return values_; }
  bool operator==(const ModelArgs&) const = default;

 private:
  // A missing key or another type is a bug in the family's code, not the user's input: the
  // reader fills every key of the family with a value of its type.
  template <class T>
  const T& get(std::string_view key) const;

  std::map<std::string, ArgValue, std::less<>> values_;
};

// A numeric key's allowed range: [lo, hi], either end open or infinite.
struct Bound {
  static constexpr double kInf = std::numeric_limits<double>::infinity();
  double lo = -kInf, hi = kInf;
  bool lo_open = false, hi_open = false;

  bool contains(double v) const { return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi); }
  bool unbounded() const { return lo == -kInf && hi == kInf; }
  std::string text() const {
    std::ostringstream s;
    if (hi == kInf)
      s << (lo_open ? "> " : ">= ") << lo;
    else
      s << "in " << (lo_open ? '(' : '[') << lo << ", " << hi << (hi_open ? ')' : ']');
    return s.str();
  }
};
inline Bound at_least(double lo) { return {lo}; }
inline Bound above(double lo) { return {lo, Bound::kInf, true}; }
inline Bound closed(double lo, double hi) { return {lo, hi}; }                    // [lo, hi]
inline Bound closed_open(double lo, double hi) { return {lo, hi, false, true}; }  // [lo, hi)
inline Bound open_open(double lo, double hi) { return {lo, hi, true, true}; }     // (lo, hi)
inline Bound open_closed(double lo, double hi) { return {lo, hi, true, false}; }  // (lo, hi]
inline Bound unbounded() { return {}; }

}  // namespace fsdp
