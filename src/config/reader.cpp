// The input-file reader's passes (reader.h); the rules between keys are in rules.cpp.
#include "config/reader.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>

#include "config/yaml_text.h"

namespace fsdp::config_internal {

// An override replaces the whole subtree at its key, so the latest one at or above `path`
// supplied the value. Sections an override created have no mark: blame the override below them.
// Reverse iterators, not std::views::reverse: clang 14 (the fuzz build, tests/fuzz) cannot
// compile libstdc++ 12's range views.
std::string Reader::where(const std::string& path, const YAML::Mark& mark) const {
  for (auto k = set_keys_.rbegin(); k != set_keys_.rend(); ++k)
    if (is_prefix(*k, path)) return "--set " + *k;
  if (mark.is_null())
    for (auto k = set_keys_.rbegin(); k != set_keys_.rend(); ++k)
      if (is_prefix(path, *k)) return "--set " + *k;
  return file_at(mark);
}

std::string Reader::at(const std::string& path) const {
  const auto it = given_.find(path);
  return it != given_.end() ? where(path, it->second.mark) : source_ + ":1";  // defaults never fail
}

YAML::Node Reader::load(const std::string& text) const {
  if (const size_t bad = first_bad_utf8(text); bad != std::string_view::npos) {
    const size_t newline = bad == 0 ? std::string::npos : text.rfind('\n', bad - 1);
    const size_t column = newline == std::string::npos ? bad + 1 : bad - newline;
    throw ConfigError(source_ + ":" + std::to_string(std::count(text.data(), text.data() + bad, '\n') + 1) +
                      ": not UTF-8 text (byte " + hex_byte(text[bad]) + " at column " + std::to_string(column) +
                      "); YAML input must be UTF-8");
  }
  // Documents are counted with the parser here, not with YAML::LoadAll: yaml-cpp 0.7 (Debian 12)
  // never returns from LoadAll on a stray ',' outside brackets, handing out the same empty
  // document forever (jbeder/yaml-cpp#1040, fixed upstream after 0.8). Three documents tell
  // that repeat (a document starting where the last one did) from a genuine second document.
  DocumentMarks marks;
  std::vector<YAML::Node> docs;
  try {
    std::istringstream in(text);
    YAML::Parser parser(in);
    while (marks.starts.size() < 3 && parser.HandleNextDocument(marks)) {
      const size_t n = marks.starts.size();
      if (n >= 2 && marks.starts[n - 1].pos == marks.starts[n - 2].pos) {
        const YAML::Mark at = marks.firsts.size() == n ? marks.firsts[n - 1] : marks.starts[n - 1];
        const bool shown = at.pos >= 0 && static_cast<size_t>(at.pos) < text.size() &&
                           std::isgraph(static_cast<unsigned char>(text[at.pos]));
        throw ConfigError(file_at(at) + ": malformed YAML: unexpected " +
                          (shown ? "'" + std::string(1, text[at.pos]) + "'" : std::string("token")));
      }
    }
    if (marks.starts.size() == 1) docs.push_back(YAML::Load(text));
  } catch (const YAML::Exception& e) {  // e.msg is the message without yaml-cpp's position
    throw ConfigError(file_at(e.mark) + ": malformed YAML: " + e.msg);
  }
  if (marks.starts.size() > 1)
    throw ConfigError(file_at(marks.firsts.size() > 1 ? marks.firsts[1] : marks.starts[1]) +
                      ": only one YAML document is allowed");
  if (docs.empty() || docs[0].IsNull()) return YAML::Node(YAML::NodeType::Map);
  if (!docs[0].IsMap())
    throw ConfigError(file_at(docs[0].Mark()) +
                      ": the top level must be a map of sections (model, data, train, ...), got " + describe(docs[0]));
  return docs[0];
}

void Reader::apply(const std::string& text, YAML::Node& root) {
  const size_t eq = text.find('=');
  const std::string key = text.substr(0, eq);
  if (const size_t bad = first_bad_utf8(text); bad != std::string_view::npos)
    throw ConfigError("--set " + key.substr(0, std::min(bad, key.size())) + ": not UTF-8 text (byte " +
                      hex_byte(text[bad]) + " at offset " + std::to_string(bad) + "); YAML input must be UTF-8");
  std::vector<std::string> parts;
  for (size_t b = 0, e = 0; e != std::string::npos; b = e + 1)
    parts.push_back(key.substr(b, (e = key.find('.', b)) - b));
  if (eq == std::string::npos || std::ranges::any_of(parts, &std::string::empty))
    throw ConfigError("--set '" + text + "': expected dotted.key=value");
  YAML::Node value;
  try {
    value = YAML::Load(text.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    throw ConfigError("--set " + key + ": malformed YAML value: " + e.msg);
  }
  set_keys_.push_back(key);
  // yaml-cpp: assigning to a Node writes through to the tree, reset() only rebinds the handle.
  YAML::Node cur = root;
  std::string path;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    path += (i ? "." : "") + parts[i];
    YAML::Node next = cur[parts[i]];
    if (!next.IsDefined() || next.IsNull())
      next = YAML::Node(YAML::NodeType::Map);
    else if (!next.IsMap())
      throw ConfigError(where(path, next.Mark()) + ": " + path + ": expected a map, got " + describe(next));
    cur.reset(next);
  }
  cur[parts.back()] = value;
}

void Reader::walk(const YAML::Node& map, const std::string& prefix, const std::set<std::string>& fields,
                  const std::set<std::string>& sections) {
  for (const auto& kv : map) {
    const std::string name = kv.first.IsScalar() ? kv.first.Scalar() : describe(kv.first);
    // NOLINTNEXTLINE(performance-inefficient-string-concatenation): once per key of a config file
    const std::string path = prefix.empty() ? name : prefix + "." + name;
    const YAML::Mark mark = kv.first.Mark();
    if (!fields.contains(path) && !sections.contains(path)) {
      std::set<std::string> known = fields;
      known.insert(sections.begin(), sections.end());
      throw ConfigError(where(path, mark) + ": unknown key '" + path + "'" + suggestion(path, known));
    }
    // yaml-cpp keeps both copies of a repeated key; which one wins would be an accident.
    if (const auto [it, fresh] = given_.try_emplace(path, Given{kv.second, mark}); !fresh)
      throw ConfigError(where(path, mark) + ": " + path + ": given twice (first at line " +
                        std::to_string(it->second.mark.line + 1) + ")");
    if (sections.contains(path)) {
      if (kv.second.IsMap())
        walk(kv.second, path, fields, sections);
      else if (!kv.second.IsNull())  // "train:" with nothing under it is an empty section
        fail(path, "expected a map, got " + describe(kv.second));
    }
  }
}

// Over 80 lines because it is one std::visit with a short case per kind of target (schema.h's
// Target): splitting it would put each case's checks away from the others'.
// NOLINTNEXTLINE(readability-function-size): the reason is above
void Reader::convert(const Field& f, const YAML::Node& v) const {
  auto expected = [&](const std::string& what) { fail(f.path, "expected " + what + ", got " + describe(v)); };
  auto check = [&](double x, const std::string& text) {
    if (!f.bound.contains(x)) fail(f.path, "must be " + f.bound.text() + ", got " + text);
  };
  std::visit(Overload{
                 [&](int64_t* dst) {
                   const auto x = number<int64_t>(v);
                   if (!x) expected("an integer");
                   check(double(*x), v.Scalar());
                   *dst = *x;
                 },
                 [&](uint64_t* dst) {
                   const auto x = number<uint64_t>(v);
                   if (!x) expected("a non-negative integer");
                   *dst = *x;
                 },
                 [&](double* dst) {
                   const auto x = number<double>(v);
                   if (!x) expected("a number");
                   check(*x, v.Scalar());
                   *dst = *x;
                 },
                 [&](bool* dst) {
                   const auto x = parse_bool(v);
                   if (!x) expected("true or false");
                   *dst = *x;
                 },
                 [&](std::string* dst) {
                   if (!v.IsScalar() && !v.IsNull()) expected("a string");
                   *dst = v.IsScalar() ? v.Scalar() : "";  // "dir:" means ""
                 },
                 [&](std::vector<std::string>* dst) {
                   if (!v.IsSequence() && !v.IsNull()) expected("a list of strings");
                   dst->clear();
                   for (const auto& item : v) {
                     if (!item.IsScalar()) expected("a list of strings");
                     dst->push_back(item.Scalar());
                   }
                 },
                 [&](Betas dst) {
                   if (!v.IsSequence() || v.size() != 2) expected("a list of two numbers");
                   double* out[] = {dst.b1, dst.b2};
                   for (size_t i = 0; i < 2; ++i) {
                     const auto x = number<double>(v[i]);
                     if (!x) expected("a list of two numbers");
                     check(*x, v[i].Scalar());
                     *out[i] = *x;
                   }
                 },
                 [&](const Choice& dst) {
                   if (!v.IsScalar() && !v.IsNull()) expected("a string");
                   const std::string text = v.IsScalar() ? v.Scalar() : "";
                   const auto it = std::ranges::find(dst.names, text);
                   if (it == dst.names.end()) {
                     const std::set<std::string> known(dst.names.begin(), dst.names.end());
                     std::string hint = suggestion(text, known);
                     fail(f.path, "expected one of [" + join(dst.names) + "], got " + describe(v) + hint);
                   }
                   dst.set(static_cast<size_t>(it - dst.names.begin()));
                 },
                 [&](StepWindow dst) {
                   const auto step = [&](size_t i) { return v.IsSequence() ? number<int64_t>(v[i]) : std::nullopt; };
                   if (!v.IsSequence() || v.size() != 2 || !step(0) || !step(1))
                     expected("a list of two step numbers [first, last]");
                   if (*step(0) < 1 || *step(1) < *step(0))
                     fail(f.path, "must be [first, last] with 1 <= first <= last, got [" + v[0].Scalar() + ", " +
                                      v[1].Scalar() + "]");
                   *dst.first = *step(0);
                   *dst.last = *step(1);
                 },
                 [&](const ArgSlot& dst) { dst.model->args.set(dst.key, convert_arg(f.path, dst, v)); },
                 [&](EvalEvery* dst) {
                   const std::string s = v.IsScalar() ? v.Scalar() : "";
                   if (s == "epoch" || s == "never") {
                     *dst = {s == "epoch" ? EvalEvery::When::epoch : EvalEvery::When::never, 0};
                   } else if (const auto n = number<int64_t>(v); n && *n >= 1) {
                     *dst = {EvalEvery::When::steps, *n};
                   } else {
                     expected("'epoch', 'never' or a step count >= 1");
                   }
                 },
             },
             f.target);
}

// A model family's key, by the ArgSpec of model.kind's family (schema.h: arg_spec).
ArgValue Reader::convert_arg(const std::string& path, const ArgSlot& slot, const YAML::Node& v) const {
  const ArgSpec& spec = *arg_spec(slot.model->kind, slot.key);  // the table has only keys some family has
  ArgValue out = spec.fallback;
  Field f = arg_field(spec, out);
  f.path = path;
  convert(f, v);
  return out;
}

void Reader::read(const YAML::Node& root, Config& c) {
  const std::vector<Field> table = schema(c);
  std::set<std::string> fields, sections;
  for (const Field& f : table) {
    fields.insert(f.path);
    for (size_t dot = f.path.find('.'); dot != std::string::npos; dot = f.path.find('.', dot + 1))
      sections.insert(f.path.substr(0, dot));
  }
  walk(root, "", fields, sections);
  // A family's keys wait for model.kind, which a model folder's config.json may still set: each
  // is converted by its own family's spec.
  auto is_arg = [](const Field& f) { return std::holds_alternative<ArgSlot>(f.target); };
  for (const Field& f : table)
    if (const auto it = given_.find(f.path); it != given_.end() && !is_arg(f)) convert(f, it->second.value);
  check_optimizer(c.train.optimizer);
  read_init_from_config(c, table);
  for (const Field& f : table)
    if (const auto it = given_.find(f.path); it != given_.end() && is_arg(f)) convert(f, it->second.value);
  check_model(c.model);
  check_rules(c);
}

std::string merged_text(const YAML::Node& root, const std::string& source, const std::vector<std::string>& overrides,
                        const std::string& keys_from) {
  std::string out = "# " + source + " with overrides merged:\n";
  for (std::string o : overrides) {
    std::ranges::replace(o, '\n', ' ');  // keep each one a comment line
    out += "#   --set " + o + "\n";
  }
  if (!keys_from.empty()) out += "#   model keys from " + keys_from + "\n";
  YAML::Emitter emitter;
  emitter << root;
  return out + emitter.c_str() + "\n";
}

}  // namespace fsdp::config_internal
