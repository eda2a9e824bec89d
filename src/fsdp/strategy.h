#pragma once
// fsdp.sharding_strategy, fsdp.auto_wrap.policy and fsdp.backward_prefetch: the engine's choices
// by PyTorch's names.
#include "tensor/name_table.h"

namespace fsdp {

// FSDP's sharding strategies by the names PyTorch gives them.
enum class Strategy { full_shard, shard_grad_op, no_shard, hybrid_shard, hybrid_shard_zero2 };
inline constexpr NameTable<Strategy, 5> kStrategies{{{Strategy::full_shard, "FULL_SHARD"},
                                                     {Strategy::shard_grad_op, "SHARD_GRAD_OP"},
                                                     {Strategy::no_shard, "NO_SHARD"},
                                                     {Strategy::hybrid_shard, "HYBRID_SHARD"},
                                                     {Strategy::hybrid_shard_zero2, "HYBRID_SHARD_ZERO2"}}};

enum class WrapPolicy { size_based, transformer_layer, manual };
inline constexpr NameTable<WrapPolicy, 3> kWrapPolicies{{{WrapPolicy::size_based, "size_based"},
                                                         {WrapPolicy::transformer_layer, "transformer_layer"},
                                                         {WrapPolicy::manual, "manual"}}};

enum class BackwardPrefetch { pre, post, none };
inline constexpr NameTable<BackwardPrefetch, 3> kBackwardPrefetches{{{BackwardPrefetch::pre, "BACKWARD_PRE"},
                                                                     {BackwardPrefetch::post, "BACKWARD_POST"},
                                                                     {BackwardPrefetch::none, "none"}}};

// fsdp.mixed_precision.compute: what param_dtype (bf16/f16) means for a unit's forward and backward.
//   param_dtype  PyTorch's meaning (FSDP, FSDP2): the unit computes in param_dtype. Every op's
//                output is rounded to it (activations, input gradients, parameter gradients), the
//                op's own math (GEMM accumulation, norm and softmax statistics, GELU) is f32; the
//                loss is computed in f32 from the rounded logits, as torchtitan's .float() does.
//   f32          parameters rounded to param_dtype, activations and arithmetic f32 throughout.
enum class ComputePrecision { param_dtype, f32 };
inline constexpr NameTable<ComputePrecision, 2> kComputePrecisions{
    {{ComputePrecision::param_dtype, "param_dtype"}, {ComputePrecision::f32, "f32"}}};

// HYBRID_SHARD and HYBRID_SHARD_ZERO2: shard groups within a node (or fsdp.hybrid.shard_group_size
// ranks), replicas across them.
constexpr bool is_hybrid(Strategy s) { return s == Strategy::hybrid_shard || s == Strategy::hybrid_shard_zero2; }
// PyTorch's reshard_after_forward: FULL_SHARD and HYBRID_SHARD free a unit's gathered parameters
// after its forward and gather them again for its backward; the ZeRO-2 strategies keep them.
constexpr bool reshards_after_forward(Strategy s) {
  return s != Strategy::shard_grad_op && s != Strategy::hybrid_shard_zero2;
}

constexpr const auto& name_table(Strategy) { return kStrategies; }
constexpr const auto& name_table(WrapPolicy) { return kWrapPolicies; }
constexpr const auto& name_table(BackwardPrefetch) { return kBackwardPrefetches; }
constexpr const auto& name_table(ComputePrecision) { return kComputePrecisions; }

}  // namespace fsdp
