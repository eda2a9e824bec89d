// Fuzz target: the YAML input reader and validator (parse_config / load_config, --set overrides,
// for_world_size). Input: the file's text, then up to four overrides, separated by NUL bytes.
// Promises checked: bad input is a ConfigError with a message; a config that loads with
// overrides has a yaml_text that loads alone to the same config (it is what checkpoints store).
#include <cstdio>
#include <sstream>

#include "config/config.h"
#include "fuzz_util.h"

namespace {

std::string num(double v) {
  char text[64];
  std::snprintf(text, sizeof text, "%a", v);
  return text;
}

// Every field, so a round trip through yaml_text is compared exactly.
std::string summary(const fsdp::Config& c) {
  std::ostringstream s;
  const auto& m = c.model;
  s << m.kind << ' ' << m.preset << ' ' << m.init_from;
  for (const auto& [key, value] : m.args.values()) s << ' ' << key << '=' << fsdp::arg_text(value);
  s << '|';
  s << fsdp::enum_name(c.data.kind) << ' ' << c.data.path << ' ' << num(c.data.eval_fraction) << ' '
    << c.data.synthetic_samples << '|';
  const auto& t = c.train;
  s << t.batch_size << ' ' << t.global_batch_size << ' ' << t.epochs << ' ' << t.steps << ' ' << t.stop_after_steps
    << ' ' << t.seed << ' ' << t.grad_accum << ' ' << num(t.clip_grad_norm) << ' ' << t.eval_every.text() << ' '
    << t.eval_batch_size << ' ' << t.dropout << t.shuffle << ' ' << t.threads << '|';
  const auto& o = t.optimizer;
  s << fsdp::enum_name(o.kind) << ' ' << num(o.lr) << ' ' << num(o.momentum) << ' ' << num(o.dampening) << ' '
    << o.nesterov << ' ' << num(o.weight_decay) << ' ' << num(o.rho) << ' ' << num(o.eps) << ' ' << num(o.beta1) << ' '
    << num(o.beta2) << '|';
  const auto& sc = t.scheduler;
  s << fsdp::enum_name(sc.kind) << ' ' << sc.step_size << ' ' << num(sc.gamma) << ' ' << sc.warmup_steps << ' '
    << sc.total_steps << ' ' << num(sc.min_lr) << '|';
  const auto& f = c.fsdp;
  s << fsdp::enum_name(f.sharding_strategy) << ' ' << fsdp::enum_name(f.wrap_policy) << ' ' << f.min_num_params << ' ';
  for (const auto& w : f.wrap_modules) s << w << ',';
  s << ' ' << fsdp::dtype_name(f.mixed_precision.param_dtype) << ' ' << fsdp::dtype_name(f.mixed_precision.reduce_dtype)
    << ' ' << fsdp::dtype_name(f.mixed_precision.buffer_dtype) << ' ' << num(f.mixed_precision.init_loss_scale) << ' '
    << fsdp::enum_name(f.backward_prefetch) << ' ' << f.forward_prefetch << f.limit_all_gathers
    << f.activation_checkpointing << f.cpu_offload << ' ' << f.shard_group_size << '|';
  s << c.comm.backend << ' ' << num(c.comm.timeout_s) << '|';
  const auto& k = c.checkpoint;
  s << k.dir << ' ' << fsdp::enum_name(k.format) << ' ' << k.every_steps << ' ' << k.keep << ' ' << k.save_best << ' '
    << k.resume << ' ' << fsdp::enum_name(k.io) << '|';
  s << c.output.metrics << ' ' << c.output.log_every << ' ' << c.output.save_weights;
  return s.str();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> parts =
      fuzz::split(std::string_view(reinterpret_cast<const char*>(data), size), '\0', 5);
  const std::string& text = parts[0];
  const std::vector<std::string> overrides(parts.begin() + 1, parts.end());

  fsdp::Config c;
  try {
    if (size % 4 == 3) {  // now and then through a file, as the app reads it
      const std::string path = fuzz::scratch_dir() + "/input.yaml";
      fuzz::write_file(path, text);
      c = fsdp::load_config(path, overrides);
    } else {
      c = fsdp::parse_config(text, "fuzz.yaml", overrides);
    }
  } catch (const fsdp::ConfigError& e) {
    fuzz::expect_message(e);
    return 0;
  }
  for (int world : {1, 2, 3, 8}) {
    try {
      fsdp::for_world_size(c, world);
    } catch (const fsdp::ConfigError& e) {
      fuzz::expect_message(e);
    }
  }
  // yaml_text alone reproduces the run exactly (config.cpp's promise; checkpoints store it).
  fsdp::Config again;
  try {
    again = fsdp::parse_config(c.yaml_text, "fuzz.yaml");
  } catch (const fsdp::ConfigError& e) {
    fuzz::broken(std::string("yaml_text of a valid config does not load: ") + e.what() + "\n--- yaml_text:\n" +
                 c.yaml_text);
  }
  if (summary(again) != summary(c))
    fuzz::broken("yaml_text loads to another config:\n" + summary(c) + "\n" + summary(again) + "\n--- yaml_text:\n" +
                 c.yaml_text);
  return 0;
}
