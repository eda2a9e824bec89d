#pragma once
// The seed decoder-only language model (tests/reference/torch_models.py's LM): tok_emb + pos_emb
// (learned), n_layers pre-norm TransformerBlock ("blocks.i"), ln_f, head; cross-entropy over
// every position.
#include <memory>

#include "models/model.h"

namespace fsdp {

// attention: MultiheadAttention's mode (model.attention).
std::unique_ptr<Model> make_transformer(int64_t vocab, int64_t d_model, int64_t n_layers, int64_t n_heads, int64_t d_ff,
                                        int64_t seq_len, AttentionMode attention = AttentionMode::materialized);

}  // namespace fsdp
