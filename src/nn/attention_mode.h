#pragma once
// model.attention: what attention keeps for its backward (nn/layers.h, MultiheadAttention).
#include "tensor/name_table.h"

namespace fsdp {

// The transformer's attention (nn/layers.h, MultiheadAttention): keep the (B, H, T, T)
// probabilities for the backward, or only each row's max and 1/sum and recompute the scores, or
// (a GPU's) cuDNN's fused flash attention in bf16, which keeps each row's log-sum-exp. automatic
// ("auto", the input file's default) is fused where a run can use it, else materialized: the
// trainer resolves it on its kernels before the model is built (train/model_from_config.h); a
// model built from it unresolved (names and shapes only) is materialized.
enum class AttentionMode { materialized, recompute, fused, automatic };
inline constexpr NameTable<AttentionMode, 4> kAttentionModes{{{AttentionMode::materialized, "materialized"},
                                                              {AttentionMode::recompute, "recompute"},
                                                              {AttentionMode::fused, "fused"},
                                                              {AttentionMode::automatic, "auto"}}};

constexpr const auto& name_table(AttentionMode) { return kAttentionModes; }

}  // namespace fsdp
