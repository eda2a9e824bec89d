#pragma once
// Hugging Face's T5ForConditionalGeneration (transformers 4.36), module for module: the same
// state_dict names and shapes, T5LayerNorm (RMS, no bias), unscaled q.k, relative position
// buckets (bidirectional in the encoder, causal in the decoder) computed in block 0 of each
// stack and shared by its other blocks, padding masks, dropout where HF has it, the tied
// lm_head's d_model^-0.5 rescale, HF's initialisation, labels shifted right into the decoder.
//
// Inputs (B, S) i32 source ids (pad 0); targets (B, L) i32 labels (-100 = ignored). The loss is
// the cross-entropy over the labels that are not ignored (HF's CrossEntropyLoss(ignore_index=-100)).
#include <cstdint>
#include <memory>

#include "models/model.h"

namespace fsdp {

// Sizes and switches by HF's config.json key names.
struct T5Config {
  int64_t vocab_size = 32128;
  int64_t d_model = 512;
  int64_t d_kv = 64;  // per head; inner attention width = num_heads * d_kv
  int64_t d_ff = 2048;
  int64_t num_layers = 6;
  int64_t num_decoder_layers = 6;
  int64_t num_heads = 8;
  int64_t relative_attention_num_buckets = 32;
  int64_t relative_attention_max_distance = 128;
  bool gated_gelu = false;  // feed_forward_proj: relu (T5 v1.0) | gated-gelu (v1.1)
  bool tie_word_embeddings = true;
  float dropout_rate = 0.1f;
  float layer_norm_epsilon = 1e-6f;
  float initializer_factor = 1.0f;
  int64_t decoder_start_token_id = 0;
};

std::unique_ptr<Model> make_t5(const T5Config& config);

}  // namespace fsdp
