// FsdpOptions from the input file's fsdp section (here, in train/, so that fsdp/ reads no Config).
#include "config/config.h"
#include "fsdp/fsdp.h"
#include "train/model_from_config.h"

namespace fsdp {

FsdpOptions fsdp_options(const FsdpConfig& c) {
  FsdpOptions o;
  o.strategy = c.sharding_strategy;
  o.wrap_policy = c.wrap_policy;
  o.min_num_params = c.min_num_params;
  o.wrap_modules = c.wrap_modules;
  o.param_dtype = c.mixed_precision.param_dtype;
  o.reduce_dtype = c.mixed_precision.reduce_dtype;
  o.backward_prefetch = c.backward_prefetch;
  o.forward_prefetch = c.forward_prefetch;
  o.limit_all_gathers = c.limit_all_gathers;
  o.activation_checkpointing = c.activation_checkpointing;
  o.cpu_offload = c.cpu_offload;
  o.shard_group_size = static_cast<int>(c.shard_group_size);
  return o;
}

}  // namespace fsdp
