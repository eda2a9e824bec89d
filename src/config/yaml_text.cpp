#include "config/yaml_text.h"

#include <algorithm>
#include <cstdio>

namespace fsdp::config_internal {

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::string describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Scalar: return "'" + n.Scalar() + "'";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a map";
    default: return "nothing";
  }
}

// Offset of the first byte that is not part of well-formed UTF-8 (RFC 3629: no overlong forms,
// no surrogates, nothing above U+10FFFF), or npos. YAML input is UTF-8; yaml-cpp passes bad bytes
// through on the first read but its emitter and a second read turn them into U+FFFD, so a run
// resumed from the config a checkpoint stores would get another checkpoint.dir or data.path.
size_t first_bad_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      if (b == 0xE0) lo = 0xA0;  // overlong
      if (b == 0xED) hi = 0x9F;  // surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      if (b == 0xF0) lo = 0x90;  // overlong
      if (b == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return i;
    }
    if (i + len > s.size()) return i;
    for (size_t k = 1; k < len; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

std::string hex_byte(char c) {
  char text[8];
  std::snprintf(text, sizeof text, "0x%02x", static_cast<unsigned char>(c));
  return text;
}

bool is_prefix(std::string_view prefix, std::string_view path) {
  return path.starts_with(prefix) && (path.size() == prefix.size() || path[prefix.size()] == '.');
}

// Optimal string alignment distance, so that swapped letters count as one typo.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// A near spelling, else the same key name elsewhere in the same section ("train.lr" ->
// "train.optimizer.lr") when that is unambiguous.
std::string suggestion(const std::string& path, const std::set<std::string>& known) {
  std::string best;
  size_t best_d = 3;
  for (const auto& k : known)
    if (size_t d = edit_distance(path, k); d < best_d) best = k, best_d = d;
  if (best.empty()) {
    const std::string top = path.substr(0, path.find('.'));
    const std::string leaf = path.substr(path.rfind('.') + 1);
    int matches = 0;
    for (const auto& k : known)
      if (k != path && is_prefix(top, k) && k.substr(k.rfind('.') + 1) == leaf) best = k, ++matches;
    if (matches != 1) best.clear();
  }
  return best.empty() ? "" : " (did you mean '" + best + "'?)";
}

// YAML 1.2 core booleans only: yaml-cpp would also take yes/no/on/off, which read as strings
// to most people.
std::optional<bool> parse_bool(const YAML::Node& n) {
  if (!n.IsScalar()) return std::nullopt;
  const std::string& s = n.Scalar();
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  return std::nullopt;
}

}  // namespace fsdp::config_internal
