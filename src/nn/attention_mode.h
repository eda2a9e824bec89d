#pragma once
// model.attention: what attention keeps for its backward (nn/layers.h, MultiheadAttention).
#include "tensor/name_table.h"

namespace fsdp {

// The transformer's attention (nn/layers.h, MultiheadAttention): keep the (B, H, T, T)
// probabilities for the backward, or only each row's max and 1/sum and recompute the scores, or
// (a GPU's) cuDNN's fused flash attention in bf16, which keeps each row's log-sum-exp.
enum class AttentionMode { materialized, recompute, fused };
inline constexpr NameTable<AttentionMode, 3> kAttentionModes{{{AttentionMode::materialized, "materialized"},
                                                              {AttentionMode::recompute, "recompute"},
                                                              {AttentionMode::fused, "fused"}}};

constexpr const auto& name_table(AttentionMode) { return kAttentionModes; }

}  // namespace fsdp
