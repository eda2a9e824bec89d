#pragma once
// Text and YAML helpers of the input-file reader (reader.cpp): UTF-8 checks, "did you mean"
// suggestions, YAML 1.2 numbers and booleans, where each document of a stream starts. Internal
// to config/.
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace fsdp::config_internal {

template <class... F>
struct Overload : F... {
  using F::operator()...;
};
template <class... F>
Overload(F...) -> Overload<F...>;  // clang 14 has no CTAD for aggregates (the fuzz build uses it)

std::string join(const std::vector<std::string>& items);
std::string describe(const YAML::Node& n);
// Offset of the first byte that is not part of well-formed UTF-8 (RFC 3629: no overlong forms,
// no surrogates, nothing above U+10FFFF), or npos. YAML input is UTF-8; yaml-cpp passes bad bytes
// through on the first read but its emitter and a second read turn them into U+FFFD, so a run
// resumed from the config a checkpoint stores would get another checkpoint.dir or data.path.
size_t first_bad_utf8(std::string_view s);
std::string hex_byte(char c);
bool is_prefix(std::string_view prefix, std::string_view path);
// Optimal string alignment distance, so that swapped letters count as one typo.
size_t edit_distance(std::string_view a, std::string_view b);
// A near spelling, else the same key name elsewhere in the same section ("train.lr" ->
// "train.optimizer.lr") when that is unambiguous.
std::string suggestion(const std::string& path, const std::set<std::string>& known);
// YAML 1.2 core booleans only: yaml-cpp would also take yes/no/on/off, which read as strings
// to most people.
std::optional<bool> parse_bool(const YAML::Node& n);

// YAML number syntax is wider than from_chars' (a leading '+'), and yaml-cpp's own conversion
// reads "010" as octal and accepts nan/inf, so numbers are parsed here.
template <class T>
std::optional<T> parse_number(std::string_view s) {
  if (s.size() > 1 && s[0] == '+' && s[1] != '-') s.remove_prefix(1);
  T v{};
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  if constexpr (std::is_floating_point_v<T>)
    if (!std::isfinite(v)) return std::nullopt;
  return v;
}
template <class T>
std::optional<T> number(const YAML::Node& n) {
  return n.IsScalar() ? parse_number<T>(n.Scalar()) : std::nullopt;
}

// Where each document of a YAML stream starts, and its first node (Reader::load).
class DocumentMarks final : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> starts, firsts;
  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { first(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { first(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t, const std::string&) override {
    first(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    first(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    first(mark);
  }
  void OnMapEnd() override {}

 private:
  void first(const YAML::Mark& mark) {
    if (firsts.size() < starts.size()) firsts.push_back(mark);
  }
};

}  // namespace fsdp::config_internal
