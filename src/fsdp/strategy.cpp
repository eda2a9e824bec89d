// FSDP's sharding strategies by the names PyTorch gives them.
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

}  // namespace fsdp
