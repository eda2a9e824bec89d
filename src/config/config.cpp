// Input file -> Config in three passes over one YAML tree:
//  1. the file is parsed and the --set overrides are merged into the tree, so a value from the
//     command line goes through exactly the same checks as one from the file;
//  2. the tree is walked against a table of known keys (unknown keys, sections that are not
//     maps, keys given twice);
//  3. each given value is converted and range-checked from the same table, then the rules that
//     involve several keys run.
// Only keys the user gave are checked one by one: the defaults in config.h are valid by
// construction, and a missing key has no line to point at.
//
// yaml_text: without overrides it is the file text verbatim (comments kept); with overrides it is
// the merged tree emitted by YAML::Emitter under a comment naming the overrides, so that parsing
// yaml_text alone reproduces the run exactly (a list of "--set" lines in a comment would not).
#include "config/config.h"

#include "config/backends.h"
#include "config/hf_config.h"
#include "tensor/device.h"  // device_name

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <variant>

namespace fsdp {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Bound {
  double lo = -kInf, hi = kInf;
  bool lo_open = false, hi_open = false;

  bool contains(double v) const { return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi); }
  std::string text() const {
    std::ostringstream s;
    if (hi == kInf)
      s << (lo_open ? "> " : ">= ") << lo;
    else
      s << "in " << (lo_open ? '(' : '[') << lo << ", " << hi << (hi_open ? ')' : ']');
    return s.str();
  }
};
Bound at_least(double lo) { return {lo}; }
Bound above(double lo) { return {lo, kInf, true}; }

// Targets that need more than one scalar conversion.
struct Betas {
  double* b1;
  double* b2;
};
struct StepWindow {  // [first, last]
  int64_t* first;
  int64_t* last;
};
// An enumerated key: the value must be one of `names`; set(i) stores the i-th value.
struct Choice {
  std::vector<std::string> names;
  std::function<void(size_t)> set;
};
using Target = std::variant<int64_t*, uint64_t*, double*, bool*, std::string*, std::vector<std::string>*, Betas,
                            EvalEvery*, StepWindow, Choice>;

// The choice of one enum's name table (config/enums.h).
template <class E, size_t N>
Choice choice(E* dst, const NameTable<E, N>& table) {
  Choice c;
  for (const auto& [value, name] : table) c.names.emplace_back(name);
  c.set = [dst, &table](size_t i) { *dst = table[i].first; };
  return c;
}

// A choice among values that name themselves (a subset of DType, Device).
template <class E, class NameFn>
Choice choice(E* dst, std::vector<E> values, NameFn name) {
  Choice c;
  for (E v : values) c.names.emplace_back(name(v));
  c.set = [dst, values = std::move(values)](size_t i) { *dst = values[i]; };
  return c;
}

// A string that must be one of `names` (comm.backend: the backends this build has; model.preset).
Choice choice(std::string* dst, std::vector<std::string> names) {
  Choice c;
  c.names = std::move(names);
  c.set = [dst, names = c.names](size_t i) { *dst = names[i]; };
  return c;
}

// HF hub presets for model.kind t5 (each config.json: vocab_size 32128, 32 buckets, max
// distance 128): t5-small 60,506,624 parameters, t5-base 222,903,552, t5-large 737,668,096.
struct T5Preset {
  const char* name;
  int64_t d_model, d_kv, d_ff, layers, heads;
  bool v1_1;  // gated-gelu, untied lm_head
};
constexpr T5Preset kT5Presets[] = {
    {"t5-small", 512, 64, 2048, 6, 8, false},
    {"t5-base", 768, 64, 3072, 12, 12, false},
    {"t5-large", 1024, 64, 4096, 24, 16, false},
    {"t5-3b", 1024, 128, 16384, 24, 32, false},
    {"t5-11b", 1024, 128, 65536, 24, 128, false},
    {"google/t5-v1_1-small", 512, 64, 1024, 8, 6, true},
    {"google/t5-v1_1-base", 768, 64, 2048, 12, 12, true},
    {"google/t5-v1_1-large", 1024, 64, 2816, 24, 16, true},
    {"google/t5-v1_1-xl", 2048, 64, 5120, 24, 32, true},
    {"google/t5-v1_1-xxl", 4096, 64, 10240, 24, 64, true},
};

// The model keys each kind reads (model.kind and model.init_from: every kind): those its
// config.json sets, and t5's preset.
std::vector<std::string> model_keys(ModelKind kind) {
  std::vector<std::string> keys = hf_config_keys(kind);
  if (kind == ModelKind::t5) keys.insert(keys.begin(), "preset");
  if (kind == ModelKind::transformer) keys.emplace_back("attention");
  return keys;
}

struct Field {
  std::string path;  // dotted, as written in the YAML
  Target target;
  Bound bound = {};
};

// The one list of known keys; sections are the prefixes of these paths. Long because it is a
// table, one line per key (the t5 keys added 15): splitting it would scatter the schema.
std::vector<Field> schema(Config& c) {
  ModelConfig& m = c.model;
  TrainConfig& t = c.train;
  OptimizerConfig& o = t.optimizer;
  SchedulerConfig& s = t.scheduler;
  FsdpConfig& f = c.fsdp;
  MixedPrecisionConfig& mp = f.mixed_precision;
  const std::vector<DType> precisions = {DType::f32, DType::bf16, DType::f16};
  std::vector<std::string> preset_names;
  for (const T5Preset& p : kT5Presets) preset_names.emplace_back(p.name);
  return {
      {"model.kind", choice(&m.kind, kModelKinds)},
      {"model.vocab", &m.vocab, at_least(1)},
      {"model.d_model", &m.d_model, at_least(1)},
      {"model.n_layers", &m.n_layers, at_least(1)},
      {"model.n_heads", &m.n_heads, at_least(1)},
      {"model.d_ff", &m.d_ff, at_least(1)},
      {"model.seq_len", &m.seq_len, at_least(1)},
      {"model.attention", choice(&m.attention, kAttentionModes)},
      {"model.init_from", &m.init_from},
      {"model.preset", choice(&m.preset, preset_names)},
      {"model.vocab_size", &m.vocab_size, at_least(1)},
      {"model.d_kv", &m.d_kv, at_least(1)},
      {"model.num_layers", &m.num_layers, at_least(1)},
      {"model.num_decoder_layers", &m.num_decoder_layers, at_least(1)},
      {"model.num_heads", &m.num_heads, at_least(1)},
      {"model.relative_attention_num_buckets", &m.relative_attention_num_buckets, at_least(2)},
      {"model.relative_attention_max_distance", &m.relative_attention_max_distance, at_least(1)},
      {"model.feed_forward_proj", choice(&m.feed_forward_proj, kFeedForwardProjs)},
      {"model.tie_word_embeddings", &m.tie_word_embeddings},
      {"model.dropout_rate", &m.dropout_rate, {0, 1, false, true}},
      {"model.layer_norm_epsilon", &m.layer_norm_epsilon, above(0)},
      {"model.initializer_factor", &m.initializer_factor, above(0)},
      {"data.kind", choice(&c.data.kind, kDataKinds)},
      {"data.source", &c.data.source},
      {"data.target", &c.data.target},
      {"data.source_len", &c.data.source_len, at_least(2)},
      {"data.target_len", &c.data.target_len, at_least(2)},
      {"data.path", &c.data.path},
      {"data.tokenizer", &c.data.tokenizer},
      {"data.eval_path", &c.data.eval_path},
      {"data.clean", choice(&c.data.clean, kTextCleans)},
      {"data.loss_on_padding", &c.data.loss_on_padding},
      {"data.eval_fraction", &c.data.eval_fraction, {0, 1, true, true}},
      {"data.synthetic_samples", &c.data.synthetic_samples, at_least(1)},
      {"train.batch_size", &t.batch_size, at_least(1)},
      {"train.global_batch_size", &t.global_batch_size, at_least(0)},
      {"train.epochs", &t.epochs, at_least(0)},
      {"train.steps", &t.steps, at_least(0)},
      {"train.stop_after_steps", &t.stop_after_steps, at_least(0)},
      {"train.seed", &t.seed},
      {"train.grad_accum", &t.grad_accum, at_least(1)},
      {"train.clip_grad_norm", &t.clip_grad_norm, at_least(0)},
      {"train.eval_every", &t.eval_every},
      {"train.eval_batch_size", &t.eval_batch_size, at_least(1)},
      {"train.dropout", &t.dropout},
      {"train.shuffle", &t.shuffle},
      {"train.threads", &t.threads, at_least(0)},
      {"train.device", choice(&t.device, {Device::cpu, Device::cuda}, device_name)},
      {"train.matmul_precision",
       choice(&t.matmul_precision, {MatmulPrecision::highest, MatmulPrecision::high, MatmulPrecision::medium},
              matmul_precision_name)},
      {"train.optimizer.kind", choice(&o.kind, kOptimizerKinds)},
      {"train.optimizer.lr", &o.lr, above(0)},
      {"train.optimizer.momentum", &o.momentum, at_least(0)},
      {"train.optimizer.dampening", &o.dampening},
      {"train.optimizer.nesterov", &o.nesterov},
      {"train.optimizer.weight_decay", &o.weight_decay, at_least(0)},
      {"train.optimizer.rho", &o.rho, {0, 1}},
      {"train.optimizer.eps", &o.eps, above(0)},
      {"train.optimizer.betas", Betas{&o.beta1, &o.beta2}, {0, 1, false, true}},
      {"train.scheduler.kind", choice(&s.kind, kSchedulerKinds)},
      {"train.scheduler.step_size", &s.step_size, at_least(1)},
      {"train.scheduler.gamma", &s.gamma, above(0)},
      {"train.scheduler.warmup_steps", &s.warmup_steps, at_least(0)},
      {"train.scheduler.total_steps", &s.total_steps, at_least(0)},
      {"train.scheduler.min_lr", &s.min_lr, at_least(0)},
      {"fsdp.sharding_strategy", choice(&f.sharding_strategy, kStrategies)},
      {"fsdp.auto_wrap.policy", choice(&f.wrap_policy, kWrapPolicies)},
      {"fsdp.auto_wrap.min_num_params", &f.min_num_params, at_least(0)},
      {"fsdp.auto_wrap.modules", &f.wrap_modules},
      {"fsdp.mixed_precision.param_dtype", choice(&mp.param_dtype, precisions, dtype_name)},
      {"fsdp.mixed_precision.reduce_dtype", choice(&mp.reduce_dtype, precisions, dtype_name)},
      {"fsdp.mixed_precision.buffer_dtype", choice(&mp.buffer_dtype, precisions, dtype_name)},
      {"fsdp.mixed_precision.init_loss_scale", &mp.init_loss_scale, above(0)},
      {"fsdp.backward_prefetch", choice(&f.backward_prefetch, kBackwardPrefetches)},
      {"fsdp.forward_prefetch", &f.forward_prefetch},
      {"fsdp.limit_all_gathers", &f.limit_all_gathers},
      {"fsdp.node_shared_params", &f.node_shared_params},
      {"fsdp.activation_checkpointing", &f.activation_checkpointing},
      {"fsdp.cpu_offload", &f.cpu_offload},
      {"fsdp.hybrid.shard_group_size", &f.shard_group_size, at_least(0)},
      {"comm.backend", choice(&c.comm.backend, built_backend_names())},
      {"comm.timeout_s", &c.comm.timeout_s, above(0)},
      {"checkpoint.dir", &c.checkpoint.dir},
      {"checkpoint.format", choice(&c.checkpoint.format, kCheckpointFormats)},
      {"checkpoint.every_steps", &c.checkpoint.every_steps, at_least(0)},
      {"checkpoint.keep", &c.checkpoint.keep, at_least(1)},
      {"checkpoint.save_best", &c.checkpoint.save_best},
      {"checkpoint.resume", &c.checkpoint.resume},
      {"checkpoint.io", choice(&c.checkpoint.io, kCheckpointIos)},
      {"output.metrics", &c.output.metrics},
      {"output.log_every", &c.output.log_every, at_least(1)},
      {"output.save_weights", &c.output.save_weights},
      {"output.trace", &c.output.trace},
      {"output.trace_steps", StepWindow{&c.output.trace_first_step, &c.output.trace_last_step}},
      {"generate.num_beams", &c.generate.num_beams, at_least(1)},
      {"generate.max_new_tokens", &c.generate.max_new_tokens, at_least(0)},
      {"generate.length_penalty", &c.generate.length_penalty},
      {"generate.batch_size", &c.generate.batch_size, at_least(0)},
      {"generate.rouge_samples", &c.generate.rouge_samples, at_least(-1)},
  };
}

// The settings each optimizer takes, as in PyTorch's constructors (which reject the others).
std::vector<std::string> optimizer_keys(OptimizerKind kind) {
  if (kind == OptimizerKind::sgd) return {"lr", "momentum", "dampening", "nesterov", "weight_decay"};
  if (kind == OptimizerKind::adadelta) return {"lr", "rho", "eps", "weight_decay"};
  return {"lr", "betas", "eps", "weight_decay"};
}

template <class... F>
struct Overload : F... {
  using F::operator()...;
};
template <class... F>
Overload(F...) -> Overload<F...>;  // clang 14 has no CTAD for aggregates (the fuzz build uses it)

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

// YAML 1.2 core booleans only: yaml-cpp would also take yes/no/on/off, which read as strings
// to most people.
std::optional<bool> parse_bool(const YAML::Node& n) {
  if (!n.IsScalar()) return std::nullopt;
  const std::string& s = n.Scalar();
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  return std::nullopt;
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
  void check_optimizer(OptimizerConfig& o) const;
  void read_init_from_config(Config& c, const std::vector<Field>& table);
  void check_model(ModelConfig& m) const;
  void check_rules(const Config& c) const;

  std::string source_;
  std::vector<std::string> set_keys_;  // overrides applied so far, in order
  std::map<std::string, Given> given_;
  std::vector<std::pair<std::string, std::string>> from_init_from_;
};

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

void Reader::check_optimizer(OptimizerConfig& o) const {
  const std::string p = "train.optimizer.";
  const std::vector<std::string> own = optimizer_keys(o.kind);
  for (const auto& [path, g] : given_)
    if (path.starts_with(p) && path != p + "kind" && std::ranges::find(own, path.substr(p.size())) == own.end())
      fail(path, "not a setting of optimizer " + std::string(enum_name(o.kind)) + " (it takes " + join(own) + ")");
  // PyTorch's defaults where they differ from the struct's (which are adadelta's).
  if (o.kind == OptimizerKind::sgd && !given(p + "lr"))
    throw ConfigError(at(p + "kind") + ": " + p + "lr: required for sgd (PyTorch has no default)");
  if (o.kind == OptimizerKind::adamw) {
    if (!given(p + "lr")) o.lr = 1e-3;
    if (!given(p + "eps")) o.eps = 1e-8;
    if (!given(p + "weight_decay")) o.weight_decay = 0.01;
  }
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

void Reader::read(const YAML::Node& root, Config& c) {
  const std::vector<Field> table = schema(c);
  std::set<std::string> fields, sections;
  for (const Field& f : table) {
    fields.insert(f.path);
    for (size_t dot = f.path.find('.'); dot != std::string::npos; dot = f.path.find('.', dot + 1))
      sections.insert(f.path.substr(0, dot));
  }
  walk(root, "", fields, sections);
  for (const Field& f : table)
    if (const auto it = given_.find(f.path); it != given_.end()) convert(f, it->second.value);
  check_optimizer(c.train.optimizer);
  read_init_from_config(c, table);
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

}  // namespace

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
