#define BOOST_TEST_MODULE config
#include <unistd.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "config/backends.h"
#include "config/config.h"
#include "config/hf_config.h"
#include "models/model.h"
#include "tensor/device.h"

using namespace fsdp;

namespace {

// The message parse_config throws, or a marker that it did not throw.
std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(yaml, "in.yaml", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

// Every field but source_path/yaml_text, so that two configs compare with a readable diff.
std::string dump(const Config& c) {
  std::ostringstream s;
  const auto& m = c.model;
  const auto& t = c.train;
  const auto& o = t.optimizer;
  const auto& sc = t.scheduler;
  const auto& f = c.fsdp;
  s << m.kind << ' ' << m.preset << ' ' << m.init_from;
  for (const auto& [key, value] : m.args.values()) s << ' ' << key << '=' << fsdp::arg_text(value);
  s << '\n'
    << fsdp::enum_name(c.data.kind) << ' ' << c.data.path << ' ' << c.data.eval_fraction << ' '
    << c.data.synthetic_samples << ' ' << c.data.tokenizer << ' ' << c.data.eval_path << ' '
    << fsdp::enum_name(c.data.clean) << ' ' << c.data.loss_on_padding << '\n'
    << t.batch_size << ' ' << t.epochs << ' ' << t.steps << ' ' << t.seed << ' ' << t.grad_accum << ' '
    << t.clip_grad_norm << ' ' << t.eval_every.text() << ' ' << t.eval_batch_size << ' ' << t.dropout << ' '
    << t.shuffle << ' ' << t.threads << '\n'
    << fsdp::enum_name(o.kind) << ' ' << o.lr << ' ' << o.momentum << ' ' << o.dampening << ' ' << o.nesterov << ' '
    << o.weight_decay << ' ' << o.rho << ' ' << o.eps << ' ' << o.beta1 << ' ' << o.beta2 << '\n'
    << fsdp::enum_name(sc.kind) << ' ' << sc.step_size << ' ' << sc.gamma << ' ' << sc.warmup_steps << ' '
    << sc.total_steps << ' ' << sc.min_lr << '\n'
    << fsdp::enum_name(f.sharding_strategy) << ' ' << fsdp::enum_name(f.wrap_policy) << ' ' << f.min_num_params << ' '
    << f.wrap_modules.size() << ' ' << fsdp::dtype_name(f.mixed_precision.param_dtype) << ' '
    << fsdp::dtype_name(f.mixed_precision.reduce_dtype) << ' ' << fsdp::dtype_name(f.mixed_precision.buffer_dtype)
    << ' ' << fsdp::enum_name(f.backward_prefetch) << ' ' << f.forward_prefetch << ' ' << f.limit_all_gathers << ' '
    << f.activation_checkpointing << ' ' << f.cpu_offload << ' ' << f.shard_group_size << '\n'
    << c.comm.backend << ' ' << c.comm.timeout_s << '\n'
    << c.checkpoint.dir << ' ' << fsdp::enum_name(c.checkpoint.format) << ' ' << c.checkpoint.every_steps << ' '
    << c.checkpoint.keep << ' ' << c.checkpoint.save_best << ' ' << c.checkpoint.resume << '\n'
    << c.output.metrics << ' ' << c.output.log_every << ' ' << c.output.trace << ' ' << c.output.trace_first_step << ' '
    << c.output.trace_last_step << '\n';
  for (const auto& name : f.wrap_modules) s << name << ' ';
  return s.str();
}

// A real file under the temp dir, removed at scope exit.
struct TempFile {
  std::filesystem::path path;
  explicit TempFile(const std::string& text, const std::string& name = "cfg.yaml")
      : path(std::filesystem::temp_directory_path() / ("fsdp_test_config_" + std::to_string(getpid()) + "_" + name)) {
    std::ofstream(path) << text;
  }
  ~TempFile() { std::filesystem::remove(path); }
};

const char* kFull = R"(# every key, none at its default
model:
  kind: transformer
  vocab: 200
  d_model: 96
  n_layers: 3
  n_heads: 4
  d_ff: 384
  seq_len: 64
  init_from: init.h5
data:
  kind: text
  path: corpus.txt
  eval_fraction: 0.1
  synthetic_samples: 77
train:
  batch_size: 16
  epochs: 3
  steps: 500
  seed: 18446744073709551615
  grad_accum: 2
  clip_grad_norm: 1.5
  eval_every: 100
  eval_batch_size: 32
  dropout: false
  shuffle: false
  threads: 4
  device: cuda
  optimizer: {kind: sgd, lr: 0.05, momentum: 0.9, dampening: 0, nesterov: true, weight_decay: 1e-4}
  scheduler:
    kind: cosine
    step_size: 2
    gamma: 0.5
    warmup_steps: 10
    total_steps: 400
    min_lr: 1e-5
fsdp:
  sharding_strategy: HYBRID_SHARD
  auto_wrap: {policy: manual, min_num_params: 0, modules: [layers.0, layers.1]}
  mixed_precision: {param_dtype: bf16, reduce_dtype: f16, buffer_dtype: bf16, compute: f32}
  backward_prefetch: BACKWARD_POST
  forward_prefetch: true
  limit_all_gathers: false
  activation_checkpointing: true
  cpu_offload: true
  hybrid: {shard_group_size: 4}
comm: {backend: ucx, timeout_s: 12.5}
checkpoint: {dir: ckpt, format: sharded, every_steps: 50, keep: 3, save_best: true, resume: auto}
output: {metrics: m.jsonl, log_every: 5}
)";

}  // namespace

BOOST_AUTO_TEST_CASE(empty_input_gives_the_defaults) {
  for (const char* text : {"", "# only a comment\n", "~\n", "train:\n"}) {
    const Config c = parse_config(text, "in.yaml");
    BOOST_TEST(dump(c) == dump(Config{}));
    BOOST_TEST(c.yaml_text == text);
    BOOST_TEST(c.source_path == "in.yaml");
  }
  const Config c = parse_config("", "in.yaml");
  BOOST_TEST(c.model.kind == "mnist_cnn");
  BOOST_TEST(fsdp::enum_name(c.train.optimizer.kind) == "adadelta");
  BOOST_TEST(c.train.optimizer.lr == 1.0);
  BOOST_TEST(c.train.eval_every.text() == "epoch");
  BOOST_TEST(fsdp::enum_name(c.fsdp.sharding_strategy) == "FULL_SHARD");
}

BOOST_AUTO_TEST_CASE(full_file_sets_every_field) {
  const Config c = parse_config(kFull, "full.yaml");
  BOOST_TEST(c.model.kind == "transformer");
  BOOST_TEST(c.model.args.i64("vocab") == 200);
  BOOST_TEST(c.model.args.i64("d_model") == 96);
  BOOST_TEST(c.model.args.i64("n_layers") == 3);
  BOOST_TEST(c.model.args.i64("n_heads") == 4);
  BOOST_TEST(c.model.args.i64("d_ff") == 384);
  BOOST_TEST(c.model.args.i64("seq_len") == 64);
  BOOST_TEST(c.model.init_from == "init.h5");
  BOOST_TEST(fsdp::enum_name(c.data.kind) == "text");
  BOOST_TEST(c.data.path == "corpus.txt");
  BOOST_TEST(c.data.eval_fraction == 0.1);
  BOOST_TEST(c.data.synthetic_samples == 77);
  const TrainConfig& t = c.train;
  BOOST_TEST(t.batch_size == 16);
  BOOST_TEST(t.epochs == 3);
  BOOST_TEST(t.steps == 500);
  BOOST_TEST(t.seed == 18446744073709551615ull);
  BOOST_TEST(t.grad_accum == 2);
  BOOST_TEST(t.clip_grad_norm == 1.5);
  BOOST_TEST(t.eval_every.text() == "100");
  BOOST_TEST(t.eval_batch_size == 32);
  BOOST_TEST(!t.dropout);
  BOOST_TEST(!t.shuffle);
  BOOST_TEST(t.threads == 4);
  BOOST_TEST(fsdp::device_name(t.device) == "cuda");
  BOOST_TEST(fsdp::enum_name(t.optimizer.kind) == "sgd");
  BOOST_TEST(t.optimizer.lr == 0.05);
  BOOST_TEST(t.optimizer.momentum == 0.9);
  BOOST_TEST(t.optimizer.dampening == 0.0);
  BOOST_TEST(t.optimizer.nesterov);
  BOOST_TEST(t.optimizer.weight_decay == 1e-4);
  BOOST_TEST(fsdp::enum_name(t.scheduler.kind) == "cosine");
  BOOST_TEST(t.scheduler.step_size == 2);
  BOOST_TEST(t.scheduler.gamma == 0.5);
  BOOST_TEST(t.scheduler.warmup_steps == 10);
  BOOST_TEST(t.scheduler.total_steps == 400);
  BOOST_TEST(t.scheduler.min_lr == 1e-5);
  const FsdpConfig& f = c.fsdp;
  BOOST_TEST(fsdp::enum_name(f.sharding_strategy) == "HYBRID_SHARD");
  BOOST_TEST(fsdp::enum_name(f.wrap_policy) == "manual");
  BOOST_TEST(f.min_num_params == 0);
  BOOST_TEST((f.wrap_modules == std::vector<std::string>{"layers.0", "layers.1"}));
  BOOST_TEST(fsdp::dtype_name(f.mixed_precision.param_dtype) == "bf16");
  BOOST_TEST(fsdp::dtype_name(f.mixed_precision.reduce_dtype) == "f16");
  BOOST_TEST(fsdp::dtype_name(f.mixed_precision.buffer_dtype) == "bf16");
  BOOST_TEST(fsdp::enum_name(f.mixed_precision.compute) == "f32");
  BOOST_TEST(fsdp::enum_name(f.backward_prefetch) == "BACKWARD_POST");
  BOOST_TEST(f.forward_prefetch);
  BOOST_TEST(!f.limit_all_gathers);
  BOOST_TEST(f.activation_checkpointing);
  BOOST_TEST(f.cpu_offload);
  BOOST_TEST(f.shard_group_size == 4);
  BOOST_TEST(c.comm.backend == "ucx");
  BOOST_TEST(c.comm.timeout_s == 12.5);
  BOOST_TEST(c.checkpoint.dir == "ckpt");
  BOOST_TEST(fsdp::enum_name(c.checkpoint.format) == "sharded");
  BOOST_TEST(c.checkpoint.every_steps == 50);
  BOOST_TEST(c.checkpoint.keep == 3);
  BOOST_TEST(c.checkpoint.save_best);
  BOOST_TEST(c.checkpoint.resume == "auto");
  BOOST_TEST(c.output.metrics == "m.jsonl");
  BOOST_TEST(c.output.log_every == 5);
  BOOST_TEST(c.yaml_text == kFull);
}

BOOST_AUTO_TEST_CASE(load_config_reads_real_files) {
  const TempFile full(kFull);
  const Config c = load_config(full.path.string());
  BOOST_TEST(dump(c) == dump(parse_config(kFull, "x")));
  BOOST_TEST(c.source_path == full.path.string());
  BOOST_TEST(c.yaml_text == kFull);

  // An input file with no settings is refused, naming it (it would train the defaults without a
  // word); with --set overrides every key can come from the command line.
  for (const char* text : {"", "# only a comment\n", "{}\n"}) {
    const TempFile empty(text, "empty.yaml");
    BOOST_CHECK_EXCEPTION(load_config(empty.path.string()), ConfigError, [&](const ConfigError& e) {
      return std::string(e.what()) == empty.path.string() + ": empty input file: no settings (see input/ for examples)";
    });
    BOOST_TEST(dump(load_config(empty.path.string(), {"train.epochs=1"})) == dump(Config{}));
  }

  const TempFile bad("train:\n  epochs: 2\n  batch_size: -1\n", "bad.yaml");
  BOOST_CHECK_EXCEPTION(load_config(bad.path.string()), ConfigError, [&](const ConfigError& e) {
    return std::string(e.what()) == bad.path.string() + ":3: train.batch_size: must be >= 1, got -1";
  });
}

BOOST_AUTO_TEST_CASE(unreadable_file) {
  BOOST_CHECK_EXCEPTION(load_config("no/such/file.yaml"), ConfigError, [](const ConfigError& e) {
    return std::string(e.what()) == "no/such/file.yaml: cannot read input file (No such file or directory)";
  });
  const std::string dir = std::filesystem::temp_directory_path().string();
  BOOST_CHECK_EXCEPTION(load_config(dir), ConfigError, [&](const ConfigError& e) {
    return std::string(e.what()) == dir + ": cannot read input file (Is a directory)";
  });
}

BOOST_AUTO_TEST_CASE(unknown_keys) {
  BOOST_TEST(error_of("model: {kind: mnist_cnn}\ntrain:\n  batchsize: 5\n") ==
             "in.yaml:3: unknown key 'train.batchsize' (did you mean 'train.batch_size'?)");
  BOOST_TEST(error_of("trian: {epochs: 1}\n") == "in.yaml:1: unknown key 'trian' (did you mean 'train'?)");
  BOOST_TEST(error_of("train:\n  optimizer:\n    kind: adamw\n    beta: [0.9, 0.99]\n") ==
             "in.yaml:4: unknown key 'train.optimizer.beta' (did you mean 'train.optimizer.betas'?)");
  // The right name in the wrong section.
  BOOST_TEST(error_of("train: {lr: 0.1}\n") ==
             "in.yaml:1: unknown key 'train.lr' (did you mean 'train.optimizer.lr'?)");
  BOOST_TEST(error_of("fsdp:\n  shard_group_size: 2\n") ==
             "in.yaml:2: unknown key 'fsdp.shard_group_size' "
             "(did you mean 'fsdp.hybrid.shard_group_size'?)");
  // Nothing close: no suggestion. Ambiguous leaf (optimizer.kind / scheduler.kind): none either.
  BOOST_TEST(error_of("network: {}\n") == "in.yaml:1: unknown key 'network'");
  BOOST_TEST(error_of("train: {kind: sgd}\n") == "in.yaml:1: unknown key 'train.kind'");
  // A map under a leaf key is a type error of that key, not an unknown key below it.
  BOOST_TEST(error_of("train:\n  epochs:\n    n: 1\n") == "in.yaml:2: train.epochs: expected an integer, got a map");
  BOOST_TEST(error_of("train:\n  epochs: 1\n  epochs: 2\n") ==
             "in.yaml:3: train.epochs: given twice (first at line 2)");
}

BOOST_AUTO_TEST_CASE(wrong_types) {
  struct Case {
    const char* yaml;
    const char* message;
  };
  const Case cases[] = {
      {"train: {batch_size: abc}", "in.yaml:1: train.batch_size: expected an integer, got 'abc'"},
      {"train: {batch_size: 1.5}", "in.yaml:1: train.batch_size: expected an integer, got '1.5'"},
      {"train: {batch_size: 1e3}", "in.yaml:1: train.batch_size: expected an integer, got '1e3'"},
      {"train: {batch_size: [1]}", "in.yaml:1: train.batch_size: expected an integer, got a list"},
      {"train: {batch_size: }", "in.yaml:1: train.batch_size: expected an integer, got nothing"},
      {"train: {seed: -1}", "in.yaml:1: train.seed: expected a non-negative integer, got '-1'"},
      {"train: {clip_grad_norm: x}", "in.yaml:1: train.clip_grad_norm: expected a number, got 'x'"},
      {"train: {clip_grad_norm: .inf}", "in.yaml:1: train.clip_grad_norm: expected a number, got '.inf'"},
      {"train: {shuffle: yes}", "in.yaml:1: train.shuffle: expected true or false, got 'yes'"},
      {"train: {shuffle: 1}", "in.yaml:1: train.shuffle: expected true or false, got '1'"},
      {"model: {kind: [transformer]}", "in.yaml:1: model.kind: expected a string, got a list"},
      {"data: {path: {a: 1}}", "in.yaml:1: data.path: expected a string, got a map"},
      {"fsdp: {auto_wrap: {modules: layer}}",
       "in.yaml:1: fsdp.auto_wrap.modules: expected a list of strings, got 'layer'"},
      {"fsdp: {auto_wrap: {modules: [[a]]}}",
       "in.yaml:1: fsdp.auto_wrap.modules: expected a list of strings, got a list"},
      {"train: {optimizer: {kind: adamw, betas: [0.9]}}",
       "in.yaml:1: train.optimizer.betas: expected a list of two numbers, got a list"},
      {"train: {optimizer: {kind: adamw, betas: [0.9, b]}}",
       "in.yaml:1: train.optimizer.betas: expected a list of two numbers, got a list"},
      {"train: 5", "in.yaml:1: train: expected a map, got '5'"},
      {"fsdp:\n  hybrid: [4]\n", "in.yaml:2: fsdp.hybrid: expected a map, got a list"},
      {"- train",
       "in.yaml:1: the top level must be a map of sections (model, data, train, ...), "
       "got a list"},
      {"just text",
       "in.yaml:1: the top level must be a map of sections (model, data, train, ...), "
       "got 'just text'"},
      {"train: {eval_every: weekly}",
       "in.yaml:1: train.eval_every: expected 'epoch', 'never' or a step count >= 1, got 'weekly'"},
      {"train: {eval_every: 0}",
       "in.yaml:1: train.eval_every: expected 'epoch', 'never' or a step count >= 1, got '0'"},
  };
  for (const Case& c : cases) BOOST_TEST_CONTEXT(c.yaml) {
      BOOST_TEST(error_of(c.yaml) == c.message);
    }
  // Quoted numbers and YAML's other spellings still read as the number they say.
  const Config c = parse_config(
      "train: {batch_size: '32', epochs: +2, seed: 010, eval_every: never, dropout: False}\n"
      "data: {path: 2024}\nfsdp: {auto_wrap: {modules: []}}\ncheckpoint: {dir: }",
      "in.yaml");
  BOOST_TEST(c.train.batch_size == 32);
  BOOST_TEST(c.train.epochs == 2);
  BOOST_TEST(c.train.seed == 10u);  // decimal, not yaml-cpp's octal
  BOOST_TEST(c.train.eval_every.text() == "never");
  BOOST_TEST(!c.train.dropout);
  BOOST_TEST(c.data.path == "2024");
  BOOST_TEST(c.fsdp.wrap_modules.empty());
  BOOST_TEST(c.checkpoint.dir == "");
}

BOOST_AUTO_TEST_CASE(ranges) {
  struct Case {
    const char* yaml;
    const char* message;
  };
  const Case cases[] = {
      {"train: {batch_size: 0}", "in.yaml:1: train.batch_size: must be >= 1, got 0"},
      {"train: {epochs: -1}", "in.yaml:1: train.epochs: must be >= 0, got -1"},
      {"train: {steps: -5}", "in.yaml:1: train.steps: must be >= 0, got -5"},
      {"train:\n  epochs: 0\n",
       "in.yaml:2: train.epochs: train.epochs and train.steps are both 0; "
       "one of them must bound the run"},
      {"train:\n  epochs: 0\n  steps: 0\n",
       "in.yaml:3: train.steps: train.epochs and train.steps are both 0; one of them must bound "
       "the "
       "run"},
      {"train: {grad_accum: 0}", "in.yaml:1: train.grad_accum: must be >= 1, got 0"},
      {"train: {clip_grad_norm: -0.5}", "in.yaml:1: train.clip_grad_norm: must be >= 0, got -0.5"},
      {"train: {eval_batch_size: 0}", "in.yaml:1: train.eval_batch_size: must be >= 1, got 0"},
      {"train: {threads: -1}", "in.yaml:1: train.threads: must be >= 0, got -1"},
      {"train: {optimizer: {lr: 0}}", "in.yaml:1: train.optimizer.lr: must be > 0, got 0"},
      {"train: {optimizer: {kind: sgd, lr: 1, momentum: -0.1}}",
       "in.yaml:1: train.optimizer.momentum: must be >= 0, got -0.1"},
      {"train: {optimizer: {weight_decay: -1}}", "in.yaml:1: train.optimizer.weight_decay: must be >= 0, got -1"},
      {"train: {optimizer: {rho: 1.5}}", "in.yaml:1: train.optimizer.rho: must be in [0, 1], got 1.5"},
      {"train: {optimizer: {eps: 0}}", "in.yaml:1: train.optimizer.eps: must be > 0, got 0"},
      {"train: {optimizer: {kind: adamw, betas: [0.9, 1.0]}}",
       "in.yaml:1: train.optimizer.betas: must be in [0, 1), got 1.0"},
      {"train: {optimizer: {kind: adamw, betas: [-0.1, 0.9]}}",
       "in.yaml:1: train.optimizer.betas: must be in [0, 1), got -0.1"},
      {"train: {scheduler: {step_size: 0}}", "in.yaml:1: train.scheduler.step_size: must be >= 1, got 0"},
      {"train: {scheduler: {gamma: 0}}", "in.yaml:1: train.scheduler.gamma: must be > 0, got 0"},
      {"model: {d_ff: 0}", "in.yaml:1: model.d_ff: must be >= 1, got 0"},
      {"model: {n_layers: 0}", "in.yaml:1: model.n_layers: must be >= 1, got 0"},
      {"model:\n  kind: transformer\n  d_model: 100\n  n_heads: 6\n",
       "in.yaml:4: model.n_heads: model.d_model (100) must be divisible by model.n_heads (6)"},
      {"model:\n  kind: transformer\n  d_model: 100\n",
       "in.yaml:3: model.d_model: model.d_model (100) must be divisible by model.n_heads (8)"},
      {"model:\n  kind: transformer\n  vocab: 300\ndata:\n  kind: text\n",
       "in.yaml:3: model.vocab: must be <= 256 when data.kind is text (tokens are bytes), got 300"},
      // mnist_cnn ignores the transformer's sizes once they are values of their type and range.
      {"model:\n  d_model: 100\n", "(no error)"},
      {"data: {eval_fraction: 0}", "in.yaml:1: data.eval_fraction: must be in (0, 1), got 0"},
      {"data: {eval_fraction: 1}", "in.yaml:1: data.eval_fraction: must be in (0, 1), got 1"},
      {"comm: {timeout_s: 0}", "in.yaml:1: comm.timeout_s: must be > 0, got 0"},
      {"checkpoint: {keep: 0}", "in.yaml:1: checkpoint.keep: must be >= 1, got 0"},
      {"checkpoint: {every_steps: -1}", "in.yaml:1: checkpoint.every_steps: must be >= 0, got -1"},
      {"output: {log_every: 0}", "in.yaml:1: output.log_every: must be >= 1, got 0"},
      {"fsdp: {hybrid: {shard_group_size: -2}}", "in.yaml:1: fsdp.hybrid.shard_group_size: must be >= 0, got -2"},
      {"fsdp: {auto_wrap: {min_num_params: -1}}", "in.yaml:1: fsdp.auto_wrap.min_num_params: must be >= 0, got -1"},
  };
  for (const Case& c : cases) BOOST_TEST_CONTEXT(c.yaml) {
      BOOST_TEST(error_of(c.yaml) == c.message);
    }
  // A large vocab is fine for other data.
  BOOST_TEST(parse_config("model: {kind: transformer, vocab: 50000}", "in.yaml").model.args.i64("vocab") == 50000);
  BOOST_TEST(parse_config("train: {epochs: 0, steps: 10}", "in.yaml").train.steps == 10);
}

// model.kind t5: HF's key names, a preset that fills them (keys given beside it win), and the
// other LM's keys refused by name.
BOOST_AUTO_TEST_CASE(t5_keys_and_presets) {
  const std::string t5 = "model: {kind: t5, preset: t5-base}\ndata: {kind: seq2seq, path: x.jsonl}\n";
  const Config base = parse_config(t5, "in.yaml");
  BOOST_TEST(base.model.args.i64("d_model") == 768);
  BOOST_TEST(base.model.args.i64("d_ff") == 3072);
  BOOST_TEST(base.model.args.i64("num_layers") == 12);
  BOOST_TEST(base.model.args.i64("num_decoder_layers") == 12);
  BOOST_TEST(base.model.args.i64("num_heads") == 12);
  BOOST_TEST(base.model.args.i64("d_kv") == 64);
  BOOST_TEST(base.model.args.flag("tie_word_embeddings"));
  BOOST_TEST((base.model.args.text("feed_forward_proj") == "relu"));
  const Config xl = parse_config(t5, "in.yaml", {"model.preset=google/t5-v1_1-xl", "model.num_decoder_layers=4"});
  BOOST_TEST(xl.model.args.i64("d_model") == 2048);
  BOOST_TEST(xl.model.args.i64("num_layers") == 24);
  BOOST_TEST(xl.model.args.i64("num_decoder_layers") == 4);
  BOOST_TEST(!xl.model.args.flag("tie_word_embeddings"));
  BOOST_TEST((xl.model.args.text("feed_forward_proj") == "gated-gelu"));
  const Config own = parse_config(t5, "in.yaml", {"model.d_model=96", "model.feed_forward_proj=gated-gelu"});
  BOOST_TEST(own.model.args.i64("d_model") == 96);
  BOOST_TEST(own.model.args.i64("d_ff") == 3072);
  BOOST_TEST((own.model.args.text("feed_forward_proj") == "gated-gelu"));
  BOOST_TEST(
      error_of(t5, {"model.n_heads=4"}) ==
      "--set model.n_heads: model.n_heads: not a setting of model t5 (it takes preset, vocab_size, d_model, d_kv, "
      "d_ff, num_layers, num_decoder_layers, num_heads, relative_attention_num_buckets, "
      "relative_attention_max_distance, feed_forward_proj, tie_word_embeddings, dropout_rate, "
      "layer_norm_epsilon, initializer_factor)");
  BOOST_TEST(error_of("model: {kind: transformer, num_heads: 4}\ndata: {kind: text}\n") ==
             "in.yaml:1: model.num_heads: not a setting of model transformer (it takes vocab, d_model, n_layers, "
             "n_heads, d_ff, seq_len, attention)");
  BOOST_TEST(error_of("model: {kind: t5}\n") ==
             "in.yaml:1: model.kind: model.kind t5 reads data.kind seq2seq (or synthetic); got model.kind t5 with "
             "data.kind fashion_mnist");
  BOOST_TEST(error_of(t5, {"model.vocab_size=200"}) ==
             "--set model.vocab_size: model.vocab_size: must be >= 259 for t5's byte tokens (ids 3..258), got 200");
  BOOST_TEST(error_of("model: {kind: t5}\ndata: {kind: seq2seq}\n") ==
             "in.yaml:1: data.path: data.kind seq2seq needs data.path (a CSV or JSON-lines file)");
  // generate.*: defaults, and only for a sequence-to-sequence model.
  BOOST_TEST(base.generate.num_beams == 1);
  BOOST_TEST(base.generate.rouge_samples == -1);
  const Config beams = parse_config(t5, "in.yaml", {"generate.num_beams=4", "generate.length_penalty=0.6"});
  BOOST_TEST(beams.generate.num_beams == 4);
  BOOST_TEST(beams.generate.length_penalty == 0.6);
  BOOST_TEST(error_of(t5, {"generate.num_beams=0"}) ==
             "--set generate.num_beams: generate.num_beams: must be >= 1, got 0");
  BOOST_TEST(error_of("model: {kind: mnist_cnn}\ngenerate: {num_beams: 2}\n") ==
             "in.yaml:2: generate.num_beams: text generation needs a model that generates (model.kind t5 or llama); "
             "model.kind is mnist_cnn");
  BOOST_TEST(error_of("model: {kind: transformer}\ngenerate: {do_sample: true}\n") ==
             "in.yaml:2: generate.do_sample: text generation needs a model that generates (model.kind t5 or llama); "
             "model.kind is transformer");
  // A causal LM's prompt comes from its samples; beams and ROUGE are T5's.
  const std::string llama = "model: {kind: llama, seq_len: 64}\ndata: {kind: synthetic}\n";
  const Config sampled = parse_config(llama, "in.yaml",
                                      {"generate.do_sample=true", "generate.top_k=0", "generate.top_p=0.9",
                                       "generate.temperature=0.7", "generate.prompt_len=16"});
  BOOST_TEST(sampled.generate.do_sample);
  BOOST_TEST(sampled.generate.top_k == 0);
  BOOST_TEST(sampled.generate.top_p == 0.9);
  BOOST_TEST(sampled.generate.temperature == 0.7);
  BOOST_TEST(sampled.generate.prompt_len == 16);
  BOOST_TEST(error_of(llama, {"generate.num_beams=4"}) ==
             "--set generate.num_beams: generate.num_beams: is for model.kind t5 (beam search, ROUGE); model.kind "
             "llama decodes greedily or samples");
  BOOST_TEST(error_of(llama, {"generate.prompt_len=64"}) ==
             "--set generate.prompt_len: generate.prompt_len: generate.prompt_len (64) must be below model.seq_len "
             "(64): a validation sample is the prompt and its reference");
  BOOST_TEST(error_of(llama, {"generate.top_p=0"}) == "--set generate.top_p: generate.top_p: must be in (0, 1], got 0");
  BOOST_TEST(error_of(t5, {"generate.prompt_len=3"}) ==
             "--set generate.prompt_len: generate.prompt_len: is for causal LMs (model.kind transformer or llama); "
             "model.kind t5 decodes from its source");
  BOOST_TEST(error_of(t5, {"generate.do_sample=true", "generate.num_beams=2"}) ==
             "--set generate.num_beams: generate.num_beams: sampling with beams (HF's beam sampling) is not "
             "implemented: generate.num_beams must be 1");
}

// model.init_from as a Hugging Face folder: config.json fills the model keys (T5Config's
// defaults where it is silent), model.kind too; a key the YAML also gives must agree, except
// dropout_rate; a preset beside a folder is refused; the keys end up in yaml_text.
BOOST_AUTO_TEST_CASE(hf_folder_config_json_sets_the_model_keys) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fsdp_config_hf_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string json = (dir / "config.json").string();
  auto write = [&](const std::string& text) { std::ofstream(json) << text; };
  write(R"({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "d_model": 96, "d_ff": 256,
            "num_layers": 3, "num_heads": 6, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": false,
            "dropout_rate": 0.0, "layer_norm_epsilon": 1e-05, "n_positions": 512, "num_decoder_layers": null})");
  const std::string yaml = "model: {init_from: " + dir.string() + "}\ndata: {kind: seq2seq, path: x.jsonl}\n";
  const Config c = parse_config(yaml, "in.yaml");
  BOOST_TEST((c.model.kind == "t5"));
  BOOST_TEST(c.model.args.i64("d_model") == 96);
  BOOST_TEST(c.model.args.i64("d_ff") == 256);
  BOOST_TEST(c.model.args.i64("num_layers") == 3);
  BOOST_TEST(c.model.args.i64("num_decoder_layers") == 3);  // null: num_layers, as T5Config does
  BOOST_TEST(c.model.args.i64("num_heads") == 6);
  BOOST_TEST(c.model.args.i64("d_kv") == 64);  // T5Config's default
  BOOST_TEST(c.model.args.i64("vocab_size") == 32128);
  BOOST_TEST((c.model.args.text("feed_forward_proj") == "gated-gelu"));
  BOOST_TEST(!c.model.args.flag("tie_word_embeddings"));
  BOOST_TEST(c.model.args.f64("dropout_rate") == 0.0);
  BOOST_TEST(c.model.args.f64("layer_norm_epsilon") == 1e-5);
  // yaml_text holds the keys: parsed without the folder it gives the same model.
  BOOST_TEST(c.yaml_text.find("#   model keys from " + json + "\n") != std::string::npos);
  const Config again = parse_config(c.yaml_text, "stored", {"model.init_from="});
  BOOST_TEST((again.model.kind == "t5"));
  Config a = again;
  a.model.init_from = c.model.init_from;
  BOOST_TEST((a.model == c.model));
  // The YAML may repeat a key with the same value, and change dropout_rate; nothing else.
  BOOST_TEST(parse_config(yaml, "in.yaml", {"model.d_model=96", "model.kind=t5"}).model.args.i64("d_model") == 96);
  BOOST_TEST(parse_config(yaml, "in.yaml", {"model.dropout_rate=0.2"}).model.args.f64("dropout_rate") == 0.2);
  BOOST_TEST(error_of(yaml, {"model.d_model=64"}) ==
             "--set model.d_model: model.d_model: '64' disagrees with 96 in " + json +
                 " (the folder's weights were made with that; remove the key or make it agree)");
  BOOST_TEST(error_of(yaml, {"model.layer_norm_epsilon=1e-6"}) ==
             "--set model.layer_norm_epsilon: model.layer_norm_epsilon: '1e-6' disagrees with 1e-05 in " + json +
                 " (the folder's weights were made with that; remove the key or make it agree)");
  BOOST_TEST(error_of(yaml, {"model.kind=transformer"}) ==
             "--set model.kind: model.kind: is transformer, but " + json + " describes a t5 model");
  BOOST_TEST(error_of(yaml, {"model.preset=t5-base"}) ==
             "--set model.preset: model.preset: a preset and a model folder (model.init_from) both set the model "
             "keys; give one (" +
                 json + " has them)");
  write(R"({"model_type": "t5", "d_model": -3})");
  BOOST_TEST(error_of(yaml) == json + ": model.d_model: must be >= 1, got -3");
  write(R"({"model_type": "t5", "feed_forward_proj": "gated-silu"})");
  BOOST_TEST(error_of(yaml) ==
             json +
                 ": model.feed_forward_proj: expected one of [relu, gated-gelu], got 'gated-silu' (did you "
                 "mean 'gated-gelu'?)");
  write(R"({"model_type": "t5", "d_model": [1]})");
  BOOST_TEST(error_of(yaml) == "in.yaml:1: model.init_from: " + json +
                                   ": d_model is array, not a number, string or "
                                   "boolean");
  write(R"({"model_type": "bert"})");
  BOOST_TEST(error_of(yaml) == "in.yaml:1: model.init_from: " + json +
                                   ": model_type 'bert'; fsdp_app reads fsdp_transformer (model.kind transformer), t5 "
                                   "(model.kind t5), llama (model.kind llama)");
  write("{\"model_type\": ");
  BOOST_TEST(error_of(yaml).starts_with("in.yaml:1: model.init_from: " + json + ": bad JSON ([json.exception."));
  // Our transformer's export: every key required.
  write(R"({"model_type": "fsdp_transformer", "vocab": 256, "d_model": 32, "n_layers": 2, "n_heads": 4,
            "d_ff": 64, "seq_len": 16})");
  const Config lm = parse_config("model: {init_from: " + dir.string() + "}\ndata: {kind: text}\n", "in.yaml");
  BOOST_TEST((lm.model.kind == "transformer"));
  BOOST_TEST(lm.model.args.i64("n_layers") == 2);
  BOOST_TEST(lm.model.args.i64("seq_len") == 16);
  write(R"({"model_type": "fsdp_transformer", "vocab": 256})");
  BOOST_TEST(error_of("model: {init_from: " + dir.string() + "}\n") ==
             "in.yaml:1: model.init_from: " + json + ": no d_model (model_type fsdp_transformer)");
  fs::remove(json);
  BOOST_TEST(error_of(yaml) ==
             "in.yaml:1: model.init_from: " + json + ": cannot open (a Hugging Face model folder has a config.json)");
  fs::remove_all(dir);
}

// The seq2seq data keys: a SentencePiece model (t5 only; its own size is checked when it is
// read), a validation file instead of the held-out tail, the clean-up, the tutorial's loss.
BOOST_AUTO_TEST_CASE(seq2seq_data_keys) {
  const std::string t5 =
      "model: {kind: t5, vocab_size: 200}\n"
      "data: {kind: seq2seq, path: train.csv, eval_path: val.csv, tokenizer: spiece.model, clean: wikihow,\n"
      "       loss_on_padding: true}\n";
  const Config c = parse_config(t5, "in.yaml");
  BOOST_TEST(c.data.tokenizer == "spiece.model");
  BOOST_TEST(c.data.eval_path == "val.csv");
  BOOST_TEST((c.data.clean == TextClean::wikihow));
  BOOST_TEST(c.data.loss_on_padding);
  const Config plain = parse_config("model: {kind: t5}\ndata: {kind: seq2seq, path: x.jsonl}\n", "in.yaml");
  BOOST_TEST(plain.data.tokenizer.empty());
  BOOST_TEST(plain.data.eval_path.empty());
  BOOST_TEST((plain.data.clean == TextClean::none));
  BOOST_TEST(!plain.data.loss_on_padding);
  BOOST_TEST(error_of(t5, {"data.eval_fraction=0.1"}) ==
             "--set data.eval_fraction: data.eval_fraction: data.eval_path and data.eval_fraction both given: the "
             "validation rows come from one of them");
  BOOST_TEST(error_of("model: {kind: transformer}\ndata: {kind: text, tokenizer: spiece.model}\n") ==
             "in.yaml:2: data.tokenizer: is for data.kind seq2seq or causal_lm (SentencePiece ids); data.kind text "
             "reads bytes");
  BOOST_TEST(error_of("data: {kind: fashion_mnist, eval_path: val.csv}\n") ==
             "in.yaml:1: data.eval_path: is for data.kind seq2seq or causal_lm (a validation file beside data.path)");
  BOOST_TEST(error_of("model: {kind: t5}\ndata: {kind: seq2seq, path: x.csv, clean: tutorial}\n") ==
             "in.yaml:2: data.clean: expected one of [none, wikihow], got 'tutorial'");
}

// The causal_lm data keys: a causal LM's text, pretraining (data.field) or fine-tuning (data.sft
// with its fields and packing), each key refused where it means nothing.
BOOST_AUTO_TEST_CASE(causal_lm_data_keys) {
  const Config sft = parse_config(
      "model: {kind: llama, vocab_size: 300}\n"
      "data: {kind: causal_lm, path: t.jsonl, eval_path: v.jsonl, sft: true, pack: true, prompt: q, response: a,\n"
      "       tokenizer: tokenizer.model}\n",
      "in.yaml");
  BOOST_TEST((sft.data.kind == DataKind::causal_lm));
  BOOST_TEST(sft.data.sft);
  BOOST_TEST(sft.data.pack);
  BOOST_TEST(sft.data.prompt == "q");
  BOOST_TEST(sft.data.response == "a");
  const Config pre = parse_config(
      "model: {kind: transformer, vocab: 259}\ndata: {kind: causal_lm, path: d, field: body}\n", "in.yaml");
  BOOST_TEST(pre.data.field == "body");
  BOOST_TEST(!pre.data.sft);
  BOOST_TEST(error_of("model: {kind: mnist_cnn}\ndata: {kind: causal_lm, path: d}\n") ==
             "in.yaml:2: data.kind: data.kind causal_lm is text for a causal LM (model.kind transformer or llama); "
             "model.kind is mnist_cnn");
  BOOST_TEST(error_of("model: {kind: llama}\ndata: {kind: causal_lm}\n") ==
             "in.yaml:1: data.path: data.kind causal_lm needs data.path (a text or JSON-lines file, or a folder)");
  BOOST_TEST(error_of("model: {kind: llama, vocab_size: 256}\ndata: {kind: causal_lm, path: d}\n") ==
             "in.yaml:1: model.vocab_size: must be >= 259 for llama's byte tokens (ids 3..258), got 256");
  BOOST_TEST(error_of("model: {kind: llama, vocab_size: 259}\ndata: {kind: text, field: body}\n") ==
             "in.yaml:2: data.field: is for data.kind causal_lm; data.kind is text");
  BOOST_TEST(error_of("model: {kind: llama, vocab_size: 259}\ndata: {kind: causal_lm, path: d, pack: true}\n") ==
             "in.yaml:2: data.pack: is for data.sft: true (prompt/response pairs)");
  BOOST_TEST(
      error_of("model: {kind: llama, vocab_size: 259}\ndata: {kind: causal_lm, path: d, sft: true, field: x}\n") ==
      "in.yaml:2: data.field: is for pretraining rows; with data.sft the rows are data.prompt and data.response");
}

BOOST_AUTO_TEST_CASE(enumerations_list_the_allowed_values) {
  struct Case {
    const char* yaml;
    const char* message;
  };
  const Case cases[] = {
      {"model: {kind: resnet}",
       "in.yaml:1: model.kind: expected one of [mnist_cnn, transformer, t5, llama], got 'resnet'"},
      {"data: {kind: cifar}",
       "in.yaml:1: data.kind: expected one of [fashion_mnist, text, synthetic, seq2seq, causal_lm], got 'cifar'"},
      {"fsdp: {sharding_strategy: full_shard}",
       "in.yaml:1: fsdp.sharding_strategy: expected one of [FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, "
       "HYBRID_SHARD, HYBRID_SHARD_ZERO2], got 'full_shard'"},
      {"fsdp: {mixed_precision: {reduce_dtype: f64}}",
       "in.yaml:1: fsdp.mixed_precision.reduce_dtype: expected one of [f32, bf16, f16], got 'f64' "
       "(did you mean 'f16'?)"},
      {"fsdp: {mixed_precision: {compute: bf16}}",
       "in.yaml:1: fsdp.mixed_precision.compute: expected one of [param_dtype, f32], got 'bf16'"},
      {"fsdp: {backward_prefetch: BACKWARD}",
       "in.yaml:1: fsdp.backward_prefetch: expected one of [BACKWARD_PRE, BACKWARD_POST, none], "
       "got 'BACKWARD'"},
      {"fsdp: {auto_wrap: {policy: always}}",
       "in.yaml:1: fsdp.auto_wrap.policy: expected one of [size_based, transformer_layer, manual], "
       "got 'always'"},
      {"checkpoint: {format: zip}", "in.yaml:1: checkpoint.format: expected one of [consolidated, sharded], got 'zip'"},
      {"train: {optimizer: {kind: adam}}",
       "in.yaml:1: train.optimizer.kind: expected one of [sgd, adadelta, adamw], got 'adam' (did you mean 'adamw'?)"},
      {"train: {scheduler: {kind: linear}}",
       "in.yaml:1: train.scheduler.kind: expected one of [none, step, cosine], got 'linear'"},
  };
  for (const Case& c : cases) BOOST_TEST_CONTEXT(c.yaml) {
      BOOST_TEST(error_of(c.yaml) == c.message);
    }
  // comm.backend: the backends this build has, not a fixed list.
  std::string built;
  for (const std::string& b : fsdp::built_backend_names()) built += (built.empty() ? "" : ", ") + b;
  BOOST_TEST(built.find("mpi") == 0u);
  BOOST_TEST(error_of("comm: {backend: gloo}") ==
             "in.yaml:1: comm.backend: expected one of [" + built + "], got 'gloo'");
}

BOOST_AUTO_TEST_CASE(manual_wrap_policy_needs_modules) {
  BOOST_TEST(error_of("fsdp:\n  auto_wrap:\n    policy: manual\n") ==
             "in.yaml:3: fsdp.auto_wrap.policy: manual requires a non-empty fsdp.auto_wrap.modules "
             "list");
  BOOST_TEST(error_of("fsdp:\n  auto_wrap:\n    policy: manual\n    modules: []\n") ==
             "in.yaml:3: fsdp.auto_wrap.policy: manual requires a non-empty fsdp.auto_wrap.modules "
             "list");
  const Config c = parse_config("fsdp: {auto_wrap: {policy: manual, modules: [conv1]}}", "in.yaml");
  BOOST_TEST((c.fsdp.wrap_modules == std::vector<std::string>{"conv1"}));
}

BOOST_AUTO_TEST_CASE(checkpoint_keys_that_need_a_folder_or_evaluations) {
  BOOST_TEST(error_of("checkpoint: {every_steps: 10}\n") == "in.yaml:1: checkpoint.every_steps: needs checkpoint.dir");
  BOOST_TEST(error_of("checkpoint: {save_best: true}\n") == "in.yaml:1: checkpoint.save_best: needs checkpoint.dir");
  BOOST_TEST(error_of("checkpoint: {resume: auto}\n") ==
             "in.yaml:1: checkpoint.resume: auto needs checkpoint.dir (it resumes from the newest file there)");
  BOOST_TEST(error_of("checkpoint: {dir: ck, save_best: true}\ntrain: {eval_every: never}\n") ==
             "in.yaml:2: train.eval_every: checkpoint.save_best needs evaluations (train.eval_every is never)");
  BOOST_TEST(error_of("checkpoint: {dir: ck, io: posix}\n") ==
             "in.yaml:1: checkpoint.io: expected one of [independent, collective], got 'posix'");
  const Config c = parse_config(
      "checkpoint: {dir: ck, resume: /x/ckpt_00000010.h5, every_steps: 5}\n"
      "train: {stop_after_steps: 7}\n",
      "in.yaml");
  BOOST_TEST(fsdp::enum_name(c.checkpoint.io) == "independent");
  BOOST_TEST(c.checkpoint.resume == "/x/ckpt_00000010.h5");
  BOOST_TEST(c.train.stop_after_steps == 7);
  BOOST_TEST(error_of("train: {stop_after_steps: -1}\n").find("train.stop_after_steps") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(comm_device_buffers) {
  BOOST_TEST((parse_config("comm: {backend: mpi}\n", "in.yaml").comm.device_buffers == fsdp::DeviceBuffers::automatic));
  BOOST_TEST(
      (parse_config("comm: {device_buffers: staged}\n", "in.yaml").comm.device_buffers == fsdp::DeviceBuffers::staged));
  BOOST_TEST(
      (parse_config("comm: {device_buffers: direct}\n", "in.yaml").comm.device_buffers == fsdp::DeviceBuffers::direct));
  BOOST_TEST(error_of("comm: {device_buffers: device}\n") ==
             "in.yaml:1: comm.device_buffers: expected one of [auto, staged, direct], got 'device'");
}

BOOST_AUTO_TEST_CASE(trace_keys) {
  const Config off = parse_config("", "in.yaml");
  BOOST_TEST(off.output.trace.empty());
  BOOST_TEST(off.output.trace_first_step == 1);
  BOOST_TEST(off.output.trace_last_step == std::numeric_limits<int64_t>::max());
  const Config c = parse_config("output: {trace: out/t.json, trace_steps: [3, 5]}\n", "in.yaml");
  BOOST_TEST(c.output.trace == "out/t.json");
  BOOST_TEST(c.output.trace_first_step == 3);
  BOOST_TEST(c.output.trace_last_step == 5);
  const Config one = parse_config("output: {trace: t.json}\n", "in.yaml", {"output.trace_steps=[2, 2]"});
  BOOST_TEST(one.output.trace_first_step == 2);
  BOOST_TEST(one.output.trace_last_step == 2);
  BOOST_TEST(error_of("output: {trace_steps: [1, 2]}\n") ==
             "in.yaml:1: output.trace_steps: needs output.trace (the file the steps are traced to)");
  BOOST_TEST(error_of("output: {trace: t.json, trace_steps: [5, 2]}\n") ==
             "in.yaml:1: output.trace_steps: must be [first, last] with 1 <= first <= last, got [5, 2]");
  BOOST_TEST(error_of("output: {trace: t.json, trace_steps: [0, 2]}\n") ==
             "in.yaml:1: output.trace_steps: must be [first, last] with 1 <= first <= last, got [0, 2]");
  for (const char* bad : {"3", "[1]", "[1, 2, 3]", "[a, 2]", "[1.5, 2]", "{first: 1}"})
    BOOST_TEST(error_of(std::string("output: {trace: t.json, trace_steps: ") + bad + "}\n")
                       .find("output.trace_steps: expected a list of two step numbers [first, last], got ") !=
                   std::string::npos,
               bad);
  BOOST_TEST(error_of("output: {trace: [a]}\n") == "in.yaml:1: output.trace: expected a string, got a list");
}

BOOST_AUTO_TEST_CASE(matmul_precision_key) {
  BOOST_TEST(fsdp::matmul_precision_name(parse_config("", "in.yaml").train.matmul_precision) == "highest");
  BOOST_TEST(fsdp::matmul_precision_name(
                 parse_config("train: {matmul_precision: medium}\n", "in.yaml").train.matmul_precision) == "medium");
  BOOST_TEST(error_of("train: {matmul_precision: low}\n") ==
             "in.yaml:1: train.matmul_precision: expected one of [highest, high, medium], got 'low'");
}

BOOST_AUTO_TEST_CASE(attention_key) {
  BOOST_TEST(parse_config("model: {kind: transformer}", "in.yaml").model.args.text("attention") == "auto");
  BOOST_TEST(
      parse_config("model: {kind: transformer, attention: recompute}\n", "in.yaml").model.args.text("attention") ==
      "recompute");
  BOOST_TEST(error_of("model: {kind: transformer, attention: flash}\n") ==
             "in.yaml:1: model.attention: expected one of [materialized, recompute, fused, auto], got 'flash'");
  // mnist_cnn ignores the transformer's sizes, not its attention: a mode it cannot apply is a mistake.
  BOOST_TEST(error_of("model: {kind: mnist_cnn, attention: recompute}\n") ==
             "in.yaml:1: model.attention: not a setting of model mnist_cnn (it takes none)");
  const std::string t5 =
      error_of("model: {kind: t5}\ndata: {kind: seq2seq, path: x.jsonl}\n", {"model.attention=recompute"});
  BOOST_TEST(t5.starts_with("--set model.attention: model.attention: not a setting of model t5 (it takes preset, "),
             t5);
}

// fused is cuDNN's flash attention: a GPU's, bf16 operands (matmul_precision medium), head dims in
// multiples of 8. The blame goes to the key given last of each pair.
BOOST_AUTO_TEST_CASE(attention_fused_key) {
  const std::string gpu =
      "model: {kind: transformer, d_model: 64, n_heads: 4}\ntrain: {device: cuda, matmul_precision: "
      "medium}\n";
  BOOST_TEST(parse_config(gpu, "in.yaml", {"model.attention=fused"}).model.args.text("attention") == "fused");
  BOOST_TEST(error_of("model: {kind: transformer, attention: fused}\n") ==
             "in.yaml:1: model.attention: model.attention: fused needs train.device: cuda (cuDNN's flash attention); "
             "on the CPU, recompute keeps the same memory");
  BOOST_TEST(error_of("model: {kind: transformer, attention: fused}\ntrain: {device: cuda}\n") ==
             "in.yaml:1: model.attention: model.attention: fused multiplies bf16 operands; it needs bf16 compute "
             "(fsdp.mixed_precision.param_dtype: bf16) or train.matmul_precision: medium (is highest)");
  // Computing in bf16 (param_dtype bf16, compute: param_dtype) gives it bf16 operands at highest too.
  const std::string bf16 =
      "model: {kind: transformer, d_model: 64, n_heads: 4}\ntrain: {device: cuda}\n"
      "fsdp: {mixed_precision: {param_dtype: bf16}}\n";
  BOOST_TEST(parse_config(bf16, "in.yaml", {"model.attention=fused"}).model.args.text("attention") == "fused");
  BOOST_TEST(error_of(bf16, {"model.attention=fused", "fsdp.mixed_precision.compute=f32"}) ==
             "--set model.attention: model.attention: model.attention: fused multiplies bf16 operands; it needs bf16 "
             "compute (fsdp.mixed_precision.param_dtype: bf16) or train.matmul_precision: medium (is highest)");
  BOOST_TEST(error_of(gpu, {"model.attention=fused", "model.n_heads=16"}) ==
             "--set model.n_heads: model.n_heads: model.attention: fused needs a head dim (d_model / n_heads) that is "
             "a multiple of "
             "8, got 4");
}

// model.attention: auto (the default): fused where the run's facts allow it and the kernels have it
// (cuDNN loads), else materialized; the key is set to the mode taken, the banner's words returned.
BOOST_AUTO_TEST_CASE(attention_auto_resolves) {
  auto resolve = [](const std::string& yaml, const std::string& kernels_refusal, std::string* mode) {
    fsdp::Config c = parse_config(yaml, "in.yaml");
    const std::string note =
        c.model.family().resolve_attention(c.model.args, fsdp::model_run_facts(c), kernels_refusal);
    *mode = c.model.args.text("attention");
    return note;
  };
  std::string mode;
  BOOST_TEST(resolve("model: {kind: transformer, d_model: 64, n_heads: 4}\n", "", &mode) ==
             "materialized: fused needs train.device: cuda (cuDNN's flash attention); on the CPU, recompute keeps "
             "the same memory");
  BOOST_TEST(mode == "materialized");
  const std::string gpu =
      "model: {kind: transformer, d_model: 64, n_heads: 4}\ntrain: {device: cuda}\n"
      "fsdp: {mixed_precision: {param_dtype: bf16}}\n";
  BOOST_TEST(resolve(gpu, "", &mode) == "fused (cuDNN's flash attention)");
  BOOST_TEST(mode == "fused");
  BOOST_TEST(resolve(gpu, "cuDNN: libcudnn.so.9 not found", &mode) ==
             "materialized: fused cuDNN: libcudnn.so.9 not found");
  BOOST_TEST(mode == "materialized");
  BOOST_TEST(resolve("model: {kind: transformer, attention: recompute}\n", "", &mode).empty());
  BOOST_TEST(mode == "recompute");
}

BOOST_AUTO_TEST_CASE(device_keys) {
  BOOST_TEST(fsdp::device_name(parse_config("", "in.yaml").train.device) == "cpu");
  BOOST_TEST(error_of("train: {device: gpu}\n") ==
             "in.yaml:1: train.device: expected one of [cpu, cuda], got 'gpu' (did you mean 'cpu'?)");
  BOOST_TEST(error_of("fsdp: {cpu_offload: true}\n") ==
             "in.yaml:1: fsdp.cpu_offload: fsdp.cpu_offload needs train.device: cuda (on cpu the shards already live "
             "in host memory)");
  const std::vector<std::string> built = fsdp::built_backend_names();
  if (std::find(built.begin(), built.end(), "nccl") == built.end()) {  // a build without CUDA/NCCL
    BOOST_TEST(error_of("comm: {backend: nccl}\n").find("comm.backend: expected one of [") != std::string::npos);
  } else {
    BOOST_TEST(error_of("comm: {backend: nccl}\n") ==
               "in.yaml:1: comm.backend: comm.backend nccl needs train.device: cuda (NCCL moves device memory)");
    // The later key of the pair is blamed: here the device line.
    BOOST_TEST(error_of("comm: {backend: nccl}\ntrain: {device: cpu}\n") ==
               "in.yaml:2: train.device: comm.backend nccl needs train.device: cuda (NCCL moves device memory)");
  }
  // Device shards and gathered units are staged through host memory: checkpoints and
  // save_weights need no cpu_offload.
  const Config ck = parse_config("train: {device: cuda}\ncheckpoint: {dir: ck, resume: auto}\n", "in.yaml");
  BOOST_TEST(ck.checkpoint.dir == "ck");
  BOOST_TEST(!ck.fsdp.cpu_offload);
  const Config sw = parse_config("train: {device: cuda}\noutput: {save_weights: w.h5}\n", "in.yaml");
  BOOST_TEST(sw.output.save_weights == "w.h5");
  const Config c = parse_config("train: {device: cuda}\nfsdp: {cpu_offload: true}\ncheckpoint: {dir: ck}\n", "in.yaml");
  BOOST_TEST(c.fsdp.cpu_offload);
}

BOOST_AUTO_TEST_CASE(malformed_yaml_names_the_line) {
  BOOST_TEST(error_of("train:\n  epochs: 1\n  batch_size: [1, 2\nfsdp: {}\n") ==
             "in.yaml:4: malformed YAML: end of sequence flow not found");  // where yaml-cpp notices
  BOOST_TEST(error_of("train:\n  epochs: 1\n   batch_size: 3\n") == "in.yaml:3: malformed YAML: illegal map value");
  BOOST_TEST(error_of("train: {epochs: 1}\n---\ntrain: {epochs: 2}\n") ==
             "in.yaml:3: only one YAML document is allowed");
  // yaml-cpp 0.7's LoadAll never returned on these (found by tests/fuzz/fuzz_config).
  BOOST_TEST(error_of(",") == "in.yaml:1: malformed YAML: unexpected ','");
  BOOST_TEST(error_of("- a\n,\n") == "in.yaml:2: malformed YAML: unexpected ','");
  BOOST_TEST(error_of("---\n---\n") == "in.yaml:3: only one YAML document is allowed");
}

// yaml-cpp passes bad bytes through on the first read but turns them into U+FFFD on a read of
// its own emitter's text, so a checkpoint's stored config would name another folder (found by
// tests/fuzz/fuzz_config).
BOOST_AUTO_TEST_CASE(input_must_be_utf8) {
  BOOST_TEST(error_of("train:\n  epochs: 1\ncheckpoint: {dir: \"ck\xff\"}\n") ==
             "in.yaml:3: not UTF-8 text (byte 0xff at column 22); YAML input must be UTF-8");
  BOOST_TEST(error_of("\xc3(") == "in.yaml:1: not UTF-8 text (byte 0xc3 at column 1); YAML input must be UTF-8");
  // overlong '/', a surrogate, above U+10FFFF, a cut sequence at the end
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"\xc0\xaf", "0xc0"}, {"\xed\xa0\x80", "0xed"}, {"\xf4\x90\x80\x80", "0xf4"}, {"\xe2\x82", "0xe2"}};
  for (const auto& [bytes, hex] : bad)
    BOOST_TEST(error_of("# " + bytes) ==
               "in.yaml:1: not UTF-8 text (byte " + hex + " at column 3); YAML input must be UTF-8");
  BOOST_TEST(error_of("", {"checkpoint.dir=ck\xff\x01"}) ==
             "--set checkpoint.dir: not UTF-8 text (byte 0xff at offset 17); YAML input must be UTF-8");
  // Well-formed multi-byte text loads and round-trips through yaml_text.
  const Config c = parse_config("# caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\n", "in.yaml",
                                {"checkpoint.dir=ck_\xc3\xa9\xf4\x8f\xbf\xbf"});
  BOOST_TEST(c.checkpoint.dir == "ck_\xc3\xa9\xf4\x8f\xbf\xbf");
  BOOST_TEST(parse_config(c.yaml_text, "checkpoint").checkpoint.dir == c.checkpoint.dir);
}

BOOST_AUTO_TEST_CASE(line_numbers_of_nested_keys) {
  const std::string text =
      "# comment\n"
      "model:\n"
      "  kind: mnist_cnn\n"
      "train:\n"
      "  epochs: 2\n"
      "  optimizer:\n"
      "    kind: adadelta\n"
      "\n"
      "    lr: -1\n";
  BOOST_TEST(error_of(text) == "in.yaml:9: train.optimizer.lr: must be > 0, got -1");
  // A value on the line after its key: the key's line is reported.
  BOOST_TEST(error_of("fsdp:\n  auto_wrap:\n    modules:\n      x: 1\n") ==
             "in.yaml:3: fsdp.auto_wrap.modules: expected a list of strings, got a map");
  BOOST_TEST(error_of("fsdp:\n  mixed_precision:\n    param_dtype: f32\n    buffer_dtpye: f32\n") ==
             "in.yaml:4: unknown key 'fsdp.mixed_precision.buffer_dtpye' "
             "(did you mean 'fsdp.mixed_precision.buffer_dtype'?)");
}

BOOST_AUTO_TEST_CASE(optimizer_defaults_follow_pytorch) {
  const OptimizerConfig adadelta = parse_config("", "in.yaml").train.optimizer;
  BOOST_TEST(adadelta.lr == 1.0);
  BOOST_TEST(adadelta.rho == 0.9);
  BOOST_TEST(adadelta.eps == 1e-6);
  BOOST_TEST(adadelta.weight_decay == 0.0);

  const OptimizerConfig adamw = parse_config("train: {optimizer: {kind: adamw}}", "in.yaml").train.optimizer;
  BOOST_TEST(adamw.lr == 1e-3);
  BOOST_TEST(adamw.beta1 == 0.9);
  BOOST_TEST(adamw.beta2 == 0.999);
  BOOST_TEST(adamw.eps == 1e-8);
  BOOST_TEST(adamw.weight_decay == 0.01);

  const OptimizerConfig given = parse_config(
                                    "train: {optimizer: {kind: adamw, lr: 3e-4, betas: [0.8, "
                                    "0.95], eps: 1e-6, weight_decay: 0}}",
                                    "in.yaml")
                                    .train.optimizer;
  BOOST_TEST(given.lr == 3e-4);
  BOOST_TEST(given.beta1 == 0.8);
  BOOST_TEST(given.beta2 == 0.95);
  BOOST_TEST(given.eps == 1e-6);
  BOOST_TEST(given.weight_decay == 0.0);

  const OptimizerConfig sgd = parse_config("train: {optimizer: {kind: sgd, lr: 0.1}}", "in.yaml").train.optimizer;
  BOOST_TEST(sgd.lr == 0.1);
  BOOST_TEST(sgd.momentum == 0.0);
  BOOST_TEST(sgd.dampening == 0.0);
  BOOST_TEST(!sgd.nesterov);
  BOOST_TEST(sgd.weight_decay == 0.0);

  BOOST_TEST(error_of("train:\n  optimizer:\n    kind: sgd\n") ==
             "in.yaml:3: train.optimizer.lr: required for sgd (PyTorch has no default)");
}

BOOST_AUTO_TEST_CASE(optimizer_rejects_other_optimizers_keys) {
  BOOST_TEST(error_of("train:\n  optimizer:\n    kind: sgd\n    lr: 0.1\n    rho: 0.9\n") ==
             "in.yaml:5: train.optimizer.rho: not a setting of optimizer sgd "
             "(it takes lr, momentum, dampening, nesterov, weight_decay)");
  BOOST_TEST(error_of("train: {optimizer: {betas: [0.9, 0.99]}}") ==
             "in.yaml:1: train.optimizer.betas: not a setting of optimizer adadelta "
             "(it takes lr, rho, eps, weight_decay)");
  BOOST_TEST(error_of("train: {optimizer: {kind: adamw, momentum: 0.9}}") ==
             "in.yaml:1: train.optimizer.momentum: not a setting of optimizer adamw "
             "(it takes lr, betas, eps, weight_decay)");
  const std::string nesterov_error = "in.yaml:1: train.optimizer.nesterov: requires momentum > 0 and dampening 0";
  BOOST_TEST(error_of("train: {optimizer: {kind: sgd, lr: 0.1, nesterov: true}}") == nesterov_error);
  BOOST_TEST(error_of("train: {optimizer: {kind: sgd, lr: 0.1, nesterov: true, momentum: 0.9, "
                      "dampening: 0.1}}") == nesterov_error);
}

BOOST_AUTO_TEST_CASE(overrides) {
  // Create sections that the file lacks, replace values it has, apply in order.
  const Config c =
      parse_config("train:\n  batch_size: 8\n", "in.yaml",
                   {"train.batch_size=32", "train.optimizer.kind=adamw", "fsdp.auto_wrap.modules=[a, b]",
                    "fsdp.auto_wrap.policy=manual", "train.epochs=5", "train.epochs=6", "checkpoint.dir="});
  BOOST_TEST(c.train.batch_size == 32);
  BOOST_TEST(fsdp::enum_name(c.train.optimizer.kind) == "adamw");
  BOOST_TEST(c.train.optimizer.lr == 1e-3);
  BOOST_TEST((c.fsdp.wrap_modules == std::vector<std::string>{"a", "b"}));
  BOOST_TEST(c.train.epochs == 6);
  BOOST_TEST(c.checkpoint.dir == "");
  // A whole section as one value, and values in an empty file.
  const Config s =
      parse_config("", "in.yaml", {"comm={backend: mpi, timeout_s: 5}", "train.dropout=false", "train.device=cuda"});
  BOOST_TEST(s.comm.backend == "mpi");
  BOOST_TEST(s.comm.timeout_s == 5.0);
  BOOST_TEST(!s.train.dropout);

  BOOST_TEST(error_of("", {"train.batch_size"}) == "--set 'train.batch_size': expected dotted.key=value");
  BOOST_TEST(error_of("", {"=5"}) == "--set '=5': expected dotted.key=value");
  BOOST_TEST(error_of("", {"train..epochs=5"}) == "--set 'train..epochs=5': expected dotted.key=value");
  BOOST_TEST(error_of("", {"train.batchsize=5"}) ==
             "--set train.batchsize: unknown key 'train.batchsize' (did you mean 'train.batch_size'?)");
  BOOST_TEST(error_of("", {"network.depth=5"}) == "--set network.depth: unknown key 'network'");
  BOOST_TEST(error_of("train: {epochs: 2}", {"train.batch_size=abc"}) ==
             "--set train.batch_size: train.batch_size: expected an integer, got 'abc'");
  BOOST_TEST(error_of("", {"train={batch_size: 0}"}) == "--set train: train.batch_size: must be >= 1, got 0");
  BOOST_TEST(error_of("", {"train.batch_size=[1"}).starts_with("--set train.batch_size: malformed YAML value: "));
  BOOST_TEST(error_of("", {"train.optimizer.kind=sgd"}) ==
             "--set train.optimizer.kind: train.optimizer.lr: required for sgd (PyTorch has no default)");
  // A file value is still blamed on the file when an override touched a neighbour.
  BOOST_TEST(error_of("train:\n  optimizer:\n    rho: 2\n", {"train.optimizer.lr=0.5"}) ==
             "in.yaml:3: train.optimizer.rho: must be in [0, 1], got 2");
  BOOST_TEST(error_of("train: 5\n", {"train.epochs=1"}) == "in.yaml:1: train: expected a map, got '5'");
  // A later override wins over an earlier bad one.
  BOOST_TEST(error_of("", {"train.batch_size=abc", "train.batch_size=4"}) == "(no error)");
}

BOOST_AUTO_TEST_CASE(yaml_text_reproduces_the_run) {
  const std::vector<std::string> overrides = {"train.batch_size=7", "train.optimizer={kind: adamw}",
                                              "model.kind=transformer", "checkpoint.dir=\"~\""};
  const Config c = parse_config(kFull, "full.yaml", overrides);
  BOOST_TEST(c.yaml_text.starts_with("# full.yaml with overrides merged:\n#   --set train.batch_size=7\n"));
  const Config again = parse_config(c.yaml_text, "checkpoint");
  BOOST_TEST(dump(again) == dump(c));
  BOOST_TEST(again.train.batch_size == 7);
  BOOST_TEST(again.train.optimizer.lr == 1e-3);
  BOOST_TEST(again.checkpoint.dir == "~");
  BOOST_TEST(again.model.args.i64("seq_len") == 64);
}

BOOST_AUTO_TEST_CASE(global_batch_size_splits_over_the_ranks) {
  fsdp::Config c = fsdp::parse_config("train: {global_batch_size: 64}\n", "g.yaml");
  BOOST_TEST(fsdp::for_world_size(c, 1).train.batch_size == 64);
  BOOST_TEST(fsdp::for_world_size(c, 4).train.batch_size == 16);
  BOOST_TEST(fsdp::for_world_size(c, 8).train.batch_size == 8);
  BOOST_CHECK_EXCEPTION(fsdp::for_world_size(c, 3), fsdp::ConfigError, [](const fsdp::ConfigError& e) {
    return std::string(e.what()).find("train.global_batch_size 64 is not divisible by the 3 ranks") !=
           std::string::npos;
  });
  // Without it, batch_size stays per rank.
  fsdp::Config d = fsdp::parse_config("train: {batch_size: 32}\n", "b.yaml");
  BOOST_TEST(fsdp::for_world_size(d, 4).train.batch_size == 32);
}

// The key reference (fsdp_app --keys, docs/input-file.md) has one row per key of the reader's
// table and no other (a model family's key one in the table of each family that takes it), with
// the default Config's values as defaults.
BOOST_AUTO_TEST_CASE(key_reference_has_one_row_per_key) {
  const std::string doc = fsdp::input_file_reference();
  const std::vector<std::string> keys = fsdp::input_file_keys();
  BOOST_TEST(std::count(keys.begin(), keys.end(), "train.optimizer.lr") == 1);
  size_t expected_rows = 0;
  for (const std::string& key : keys) {
    const std::string row = "\n| `" + key + "` | ";
    size_t families = 0;
    for (const fsdp::ModelFamily* f : fsdp::model_families())
      families += key.starts_with("model.") && f->spec(key.substr(6)) ? 1 : 0;
    const size_t want = std::max<size_t>(families, 1);
    size_t found = 0;
    for (size_t at = doc.find(row); at != std::string::npos; at = doc.find(row, at + 1)) ++found;
    BOOST_TEST(found == want, key << ": " << found << " rows, not " << want);
    expected_rows += want;
  }
  size_t rows = 0;  // key rows: a dotted name in the first column
  std::istringstream lines(doc);
  for (std::string line; std::getline(lines, line);)
    if (const std::string name = line.substr(0, line.find("` |"));
        line.rfind("| `", 0) == 0 && name.find('.') != std::string::npos && name.find('/') == std::string::npos)
      ++rows;  // a preset's row names a hub model ("TinyLlama/TinyLlama-1.1B-...")
  BOOST_TEST(rows == expected_rows);
  BOOST_TEST(expected_rows > keys.size());  // d_model, d_ff: the transformer's and t5's
  const fsdp::Config c;
  BOOST_TEST(doc.find("| `train.batch_size` | integer >= 1 | `" + std::to_string(c.train.batch_size) + "` |") !=
             std::string::npos);
  BOOST_TEST(doc.find("| `data.eval_fraction` | number in (0, 1) | `0.05` |") != std::string::npos);
  BOOST_TEST(doc.find("| `train.optimizer.betas` | two numbers, each in [0, 1) | `[0.9, 0.999]` |") !=
             std::string::npos);
  BOOST_TEST(doc.find("| `fsdp.sharding_strategy` | `FULL_SHARD`, `SHARD_GRAD_OP`, `NO_SHARD`, `HYBRID_SHARD`, "
                      "`HYBRID_SHARD_ZERO2` | `FULL_SHARD` |") != std::string::npos);
  // The same text for every build: comm.backend's values are described, not listed.
  BOOST_TEST(doc.find("| `comm.backend` | a backend this build has | `mpi` |") != std::string::npos);
}

// ---- The model families' tables (models/family.h) ---------------------------------------------
// What every registered family must satisfy, so that a new family's folder is checked by this
// test as it is written: its keys and presets are consistent, an input naming only model.kind
// reads as its defaults, its config.json (when it has an HF model_type) round-trips through a
// model folder, and make() builds a model from the defaults.

namespace {

// The data kind a family's task reads without a file (synthetic), for a minimal input.
std::string minimal_yaml(const fsdp::ModelFamily& f) {
  return "model: {kind: " + f.name + "}\ndata: {kind: synthetic}\n";
}

void check_value(const fsdp::ArgSpec& spec, const fsdp::ArgValue& v, const std::string& where) {
  BOOST_TEST(v.index() == spec.fallback.index(), where << ": " << spec.key << " is a " << fsdp::arg_type_name(v)
                                                       << ", its key a " << fsdp::arg_type_name(spec.fallback));
  if (const auto* i = std::get_if<int64_t>(&v)) BOOST_TEST(spec.bound.contains(double(*i)), where << ": " << spec.key);
  if (const auto* d = std::get_if<double>(&v)) BOOST_TEST(spec.bound.contains(*d), where << ": " << spec.key);
  if (const auto* s = std::get_if<std::string>(&v); s && !spec.choices.empty())
    BOOST_TEST((std::ranges::find(spec.choices, *s) != spec.choices.end()), where << ": " << spec.key << " " << *s);
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_family_table_is_consistent) {
  std::set<std::string> names, presets;
  BOOST_TEST(fsdp::model_families().size() >= 3u);
  for (const fsdp::ModelFamily* f : fsdp::model_families()) BOOST_TEST_CONTEXT(f->name) {
      BOOST_TEST(names.insert(f->name).second);
      BOOST_TEST(!f->summary.empty());
      BOOST_TEST(static_cast<bool>(f->make));
      std::set<std::string> keys;
      for (const fsdp::ArgSpec& spec : f->args) {
        BOOST_TEST(keys.insert(spec.key).second, spec.key << " twice");
        BOOST_TEST(!spec.doc.empty(), spec.key << ": no doc");
        check_value(spec, spec.fallback, "default");
        if (!spec.default_from.empty()) {  // an earlier key of the same type
          const fsdp::ArgSpec* from = f->spec(spec.default_from);
          BOOST_TEST((from && keys.contains(from->key) && from->fallback.index() == spec.fallback.index()), spec.key);
        }
      }
      for (const std::string& k : f->ignores) BOOST_TEST(!f->spec(k), k << " both taken and ignored");
      for (const fsdp::ModelPreset& p : f->presets) {
        BOOST_TEST(presets.insert(p.name).second, p.name << ": a preset name twice");
        for (const auto& [key, value] : p.values) {
          const fsdp::ArgSpec* spec = f->spec(key);
          BOOST_TEST(spec, p.name << ": " << key << " is no key of " << f->name);
          if (spec) check_value(*spec, value, p.name);
        }
      }
      const bool tokens = f->task != fsdp::ModelTask::image_classification;
      if (tokens) BOOST_TEST((f->spec(f->vocab_key) && f->spec(f->vocab_key)->fallback.index() == 0), "vocab_key");
      if (f->task == fsdp::ModelTask::causal_lm) BOOST_TEST(f->spec(f->seq_len_key), "seq_len_key");
      if (!tokens) BOOST_TEST(f->classes > 0);
      // An input that names only the kind reads as the defaults; make() builds from them.
      const fsdp::Config c = parse_config(minimal_yaml(*f), "in.yaml");
      BOOST_TEST((c.model.args == f->defaults()));
      const auto model = f->make(c.model.args);
      BOOST_TEST(model->num_params() > 0);
      if (tokens) BOOST_TEST(!model->block_types().empty(), "transformer_layer wraps nothing");
    }
}

// A family with an HF model_type: its config.json, as fsdp_ckpt export-hf writes it, read back as
// a model folder (model.init_from) gives the same keys, for the defaults and for every preset.
// A Llama folder's config.json: rope_scaling's object becomes two keys (and comes back as the
// object), null keys take LlamaConfig's defaults, and a scaling not implemented is one line.
BOOST_AUTO_TEST_CASE(llama_config_json_rope_scaling_and_nulls) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fsdp_llama_hf_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string json = (dir / "config.json").string();
  auto write = [&](const std::string& text) { std::ofstream(json) << text; };
  const std::string yaml = "model: {init_from: " + dir.string() + "}\ndata: {kind: synthetic}\n";
  write(R"({"model_type": "llama", "hidden_size": 128, "num_attention_heads": 8, "num_key_value_heads": null,
            "pad_token_id": null, "rope_scaling": {"type": "linear", "factor": 4.0}, "rope_theta": 500000.0})");
  const Config c = parse_config(yaml, "in.yaml");
  BOOST_TEST((c.model.kind == "llama"));
  BOOST_TEST(c.model.args.i64("num_key_value_heads") == 8);  // null: num_attention_heads, as LlamaConfig
  BOOST_TEST(c.model.args.i64("pad_token_id") == -1);
  BOOST_TEST((c.model.args.text("rope_scaling_type") == "linear"));
  BOOST_TEST(c.model.args.f64("rope_scaling_factor") == 4.0);
  BOOST_TEST(c.model.args.f64("rope_theta") == 500000.0);
  BOOST_TEST(c.model.args.i64("intermediate_size") == 11008);  // LlamaConfig's default
  const std::string out = fsdp::hf_config_json(c.model, "float32");
  BOOST_TEST(out.find("\"rope_scaling\": {\n    \"type\": \"linear\",\n    \"factor\": 4.0\n  }") != std::string::npos,
             out);
  BOOST_TEST(out.find("\"pad_token_id\": null") != std::string::npos);
  write(R"({"model_type": "llama", "rope_scaling": null})");
  BOOST_TEST((parse_config(yaml, "in.yaml").model.args.text("rope_scaling_type") == "none"));
  write(R"({"model_type": "llama", "rope_scaling": {"type": "dynamic", "factor": 2.0}})");
  BOOST_TEST(error_of(yaml) == "in.yaml:1: model.init_from: " + json +
                                   ": rope_scaling type 'dynamic' is not implemented (model.kind llama has none and "
                                   "linear)");
  write(R"({"model_type": "llama", "rope_scaling": 2})");
  BOOST_TEST(error_of(yaml) == "in.yaml:1: model.init_from: " + json +
                                   ": rope_scaling is 2, not null or {\"type\": \"linear\", \"factor\": F}");
  fs::remove_all(dir);
}

// Each Llama preset builds the hub model's parameter count (module tree only: nothing allocated).
BOOST_AUTO_TEST_CASE(llama_presets_have_the_hub_parameter_counts) {
  const fsdp::ModelFamily& f = fsdp::family_of("llama");
  const std::map<std::string, int64_t> hub = {
      {"TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T", 1'100'048'384},
      {"meta-llama/Llama-2-7b-hf", 6'738'415'616},
      {"meta-llama/Llama-2-13b-hf", 13'015'864'320},
      {"meta-llama/Llama-2-70b-hf", 68'976'648'192},
      {"meta-llama/Meta-Llama-3-8B", 8'030'261'248},
      {"meta-llama/Meta-Llama-3-70B", 70'553'706'496},
      {"mistralai/Mistral-7B-v0.1", 7'241'732'096},
  };
  BOOST_TEST(f.presets.size() == hub.size());
  for (const fsdp::ModelPreset& p : f.presets) {
    const fsdp::Config c =
        parse_config("model: {kind: llama, preset: " + p.name + "}\ndata: {kind: synthetic}\n", "in.yaml");
    const std::unique_ptr<fsdp::Model> model = f.make(c.model.args);
    int64_t n = 0;
    for (const fsdp::Param* q : model->params()) n += q->numel();
    BOOST_TEST(n == hub.at(p.name), p.name);
  }
}

BOOST_AUTO_TEST_CASE(every_family_config_json_round_trips) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fsdp_family_hf_" + std::to_string(getpid()));
  fs::create_directories(dir);
  for (const fsdp::ModelFamily* f : fsdp::model_families()) {
    if (f->hf_model_type.empty()) {
      const fsdp::Config c = parse_config(minimal_yaml(*f), "in.yaml");
      BOOST_CHECK_THROW(fsdp::hf_config_json(c.model, "float32"), fsdp::Error);
      continue;
    }
    std::vector<std::string> sources = {""};
    for (const fsdp::ModelPreset& p : f->presets) sources.push_back(p.name);
    for (const std::string& preset : sources) BOOST_TEST_CONTEXT(f->name << " " << preset) {
        const std::string yaml =
            "model: {kind: " + f->name + (preset.empty() ? "" : ", preset: " + preset) + "}\ndata: {kind: synthetic}\n";
        const fsdp::Config written = parse_config(yaml, "in.yaml");
        std::ofstream(dir / "config.json") << fsdp::hf_config_json(written.model, "float32");
        const fsdp::Config read =
            parse_config("model: {init_from: " + dir.string() + "}\ndata: {kind: synthetic}\n", "in.yaml");
        BOOST_TEST(read.model.kind == f->name);
        for (const fsdp::ArgSpec& spec : f->args)
          if (spec.in_hf_config)
            BOOST_TEST(
                fsdp::arg_text(*read.model.args.find(spec.key)) == fsdp::arg_text(*written.model.args.find(spec.key)),
                spec.key);
      }
  }
  fs::remove_all(dir);
}
