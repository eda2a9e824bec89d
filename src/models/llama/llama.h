#pragma once
// Hugging Face's LlamaForCausalLM (transformers 4.36), module for module: the same state_dict
// names, shapes and registration order, HF's initialisation (every Linear and the embedding
// N(0, initializer_range), biases zero, the padding row zero, norms one), LlamaRMSNorm, rotary
// position embeddings (rope_theta; linear rope_scaling), grouped-query attention
// (num_key_value_heads), the SwiGLU MLP (silu), a causal mask, an optionally tied lm_head. The
// architecture of Llama 2 and 3, TinyLlama, and Mistral without its sliding window.
//
// Inputs (B, T) i32 token ids at positions 0..T-1; targets (B, T) i32 the next token of each
// position (-100 = ignored): the loss is the cross-entropy over the targets that are not ignored,
// HF's loss when its labels are the inputs (HF shifts them by one inside the model; our data
// gives the shifted targets). generate(): prompts (B, P) of equal length, read in one forward,
// then one token per sequence per step against the cached keys and values (greedy or sampling).
#include <cstdint>
#include <memory>

#include "models/model.h"

namespace fsdp {

// Sizes and switches by HF's config.json key names.
struct LlamaConfig {
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;  // < num_attention_heads: grouped-query attention
  double initializer_range = 0.02;
  float rms_norm_eps = 1e-6f;
  double rope_theta = 10000.0;
  double rope_scaling_factor = 1.0;  // rope_scaling {"type": "linear", "factor": F}: positions / F
  bool attention_bias = false;
  float attention_dropout = 0.0f;
  bool tie_word_embeddings = false;
  int64_t pad_token_id = -1;  // >= 0: nn.Embedding's padding_idx (zero row, no gradient)
  int64_t eos_token_id = 2;   // generation stops a sequence at it
};

std::unique_ptr<Model> make_llama(const LlamaConfig& config);

// The rotary tables of positions [0, positions): cos and sin (positions, head_dim / 2) of
// position p / scaling_factor times inv_freq[i] = 1 / theta^(2i / head_dim), each step rounded
// to f32 as HF's LlamaRotaryEmbedding computes them (what tests check the kernels against).
void llama_rope_tables(float* cos, float* sin, int64_t positions, int64_t head_dim, double theta,
                       double scaling_factor);

}  // namespace fsdp
