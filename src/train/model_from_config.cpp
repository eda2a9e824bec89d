// The model an input file names and the FSDP options of its fsdp section: the config is read
// here, in train/, so that models/ (which takes sizes) depends on nn/ and tensor/ only, and
// fsdp/ reads no Config.
#include "train/model_from_config.h"
#include "ckpt/hf_weights.h"
#include "config/config.h"
#include "fsdp/fsdp.h"
#include "models/model.h"
#include "tensor/error.h"

namespace fsdp {

std::unique_ptr<Model> make_model(const ModelConfig& config) { return config.family().make(config.args); }

std::string resolve_attention(Config& c, Kernels& kernels) {
  const ModelFamily& family = c.model.family();
  if (!family.resolve_attention) return "";
  const ModelRunFacts run = model_run_facts(c);
  // Ask the kernels (cuDNN's load) only where the run's facts could use fused attention at all.
  const std::string kernels_refusal = run.device == Device::cuda ? kernels.fused_attention_unavailable() : "";
  return family.resolve_attention(c.model.args, run, kernels_refusal);
}

FsdpOptions fsdp_options(const FsdpConfig& c) {
  FsdpOptions o;
  o.strategy = c.sharding_strategy;
  o.wrap_policy = c.wrap_policy;
  o.min_num_params = c.min_num_params;
  o.wrap_modules = c.wrap_modules;
  o.param_dtype = c.mixed_precision.param_dtype;
  o.reduce_dtype = c.mixed_precision.reduce_dtype;
  o.compute = c.mixed_precision.compute;
  o.backward_prefetch = c.backward_prefetch;
  o.forward_prefetch = c.forward_prefetch;
  o.limit_all_gathers = c.limit_all_gathers;
  o.node_shared_params = c.node_shared_params;
  o.activation_checkpointing = c.activation_checkpointing;
  o.cpu_offload = c.cpu_offload;
  o.shard_group_size = static_cast<int>(c.shard_group_size);
  return o;
}

HfNames hf_names(const ModelConfig& config) {
  const ModelFamily& family = config.family();
  return family.hf_names ? family.hf_names(config.args) : HfNames{};
}

}  // namespace fsdp
