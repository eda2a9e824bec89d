#include <algorithm>
#include <set>

#include "config/config.h"
#include "fsdp/fsdp.h"
#include "tensor/error.h"

namespace fsdp {

Strategy parse_strategy(const std::string& name) {
  if (name == "FULL_SHARD") return Strategy::full_shard;
  if (name == "SHARD_GRAD_OP") return Strategy::shard_grad_op;
  if (name == "NO_SHARD") return Strategy::no_shard;
  if (name == "HYBRID_SHARD") return Strategy::hybrid_shard;
  if (name == "HYBRID_SHARD_ZERO2") return Strategy::hybrid_shard_zero2;
  throw Error("fsdp.sharding_strategy '" + name +
              "' is not FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or HYBRID_SHARD_ZERO2");
}

std::string_view strategy_name(Strategy s) {
  switch (s) {
    case Strategy::full_shard: return "FULL_SHARD";
    case Strategy::shard_grad_op: return "SHARD_GRAD_OP";
    case Strategy::no_shard: return "NO_SHARD";
    case Strategy::hybrid_shard: return "HYBRID_SHARD";
    case Strategy::hybrid_shard_zero2: return "HYBRID_SHARD_ZERO2";
  }
  return "?";
}

FsdpOptions fsdp_options(const FsdpConfig& c) {
  FsdpOptions o;
  o.strategy = parse_strategy(c.sharding_strategy);
  o.wrap_policy = c.wrap_policy;
  o.min_num_params = c.min_num_params;
  o.wrap_modules = c.wrap_modules;
  o.param_dtype = parse_dtype(c.mixed_precision.param_dtype);
  o.reduce_dtype = parse_dtype(c.mixed_precision.reduce_dtype);
  o.backward_prefetch = c.backward_prefetch == "BACKWARD_PRE"    ? BackwardPrefetch::pre
                        : c.backward_prefetch == "BACKWARD_POST" ? BackwardPrefetch::post
                                                                 : BackwardPrefetch::none;
  o.forward_prefetch = c.forward_prefetch;
  o.limit_all_gathers = c.limit_all_gathers;
  o.activation_checkpointing = c.activation_checkpointing;
  o.cpu_offload = c.cpu_offload;
  o.shard_group_size = static_cast<int>(c.shard_group_size);
  o.skip_replicate_reduce = c.debug_skip_replicate_reduce;
  return o;
}

std::vector<UnitSpec> apply_wrap_policy(Model& model, const FsdpOptions& options) {
  std::vector<UnitSpec> units(1);
  units[0].name = "root";
  std::set<std::string> wanted(options.wrap_modules.begin(), options.wrap_modules.end());
  for (Layer* layer : model.layers()) {
    bool wrap = false;
    if (options.wrap_policy == "size_based") {
      // PyTorch's size_based_auto_wrap_policy applied to the top-level layers: a layer with at
      // least min_num_params parameters becomes its own unit.
      wrap = layer->num_params() > 0 && layer->num_params() >= options.min_num_params;
    } else if (options.wrap_policy == "transformer_layer") {
      wrap = layer->type() == "TransformerBlock";
    } else if (options.wrap_policy == "manual") {
      wrap = wanted.erase(layer->name()) > 0;
    } else {
      throw Error("fsdp.auto_wrap.policy '" + options.wrap_policy + "' is not size_based, transformer_layer or manual");
    }
    if (wrap) {
      units.push_back({layer->name(), {layer}});
    } else {
      units[0].layers.push_back(layer);
    }
  }
  if (!wanted.empty()) {
    std::string names;
    for (Layer* layer : model.layers())
      if (layer->num_params() > 0) names += (names.empty() ? "" : ", ") + layer->name();
    throw Error("fsdp.auto_wrap.modules: no top-level module '" + *wanted.begin() +
                "' in this model (modules with parameters: " + names + ")");
  }
  return units;
}

ProcessMesh make_mesh(Communicator& world, Strategy strategy, int shard_group_size, int node_color, int local_rank) {
  const int n = world.size(), rank = world.rank();
  ProcessMesh mesh;
  switch (strategy) {
    case Strategy::full_shard:
    case Strategy::shard_grad_op:
      mesh.shard = world.split(0, rank);
      mesh.replicate = world.split(rank, 0);
      return mesh;
    case Strategy::no_shard:
      mesh.shard = world.split(rank, 0);
      mesh.replicate = world.split(0, rank);
      return mesh;
    case Strategy::hybrid_shard:
    case Strategy::hybrid_shard_zero2: break;
  }
  if (shard_group_size > 0) {
    if (n % shard_group_size != 0)
      throw Error("fsdp.hybrid.shard_group_size " + std::to_string(shard_group_size) + " does not divide the " +
                  std::to_string(n) + " ranks");
    node_color = rank / shard_group_size;
    local_rank = rank % shard_group_size;
  }
  mesh.shard = world.split(node_color, rank);
  mesh.replicate = world.split(local_rank, rank);
  // Every node must hold the same number of ranks, or shards would not line up across replicas.
  if (mesh.shard->size() * mesh.replicate->size() != n)
    throw Error("HYBRID sharding needs the same number of ranks on every node (got a shard group of " +
                std::to_string(mesh.shard->size()) + " and " + std::to_string(mesh.replicate->size()) +
                " replicas for " + std::to_string(n) + " ranks)");
  return mesh;
}

}  // namespace fsdp
