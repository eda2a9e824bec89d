// model.kind transformer (models/family.h).
#include <nlohmann/json.hpp>

#include "models/family.h"
#include "models/transformer/transformer.h"

namespace fsdp {

namespace {

std::optional<ArgProblem> transformer_check(const ModelArgs& a, const ModelRunFacts& run) {
  const int64_t d_model = a.i64("d_model"), n_heads = a.i64("n_heads");
  if (d_model % n_heads != 0)
    return ArgProblem{"model.d_model", "model.n_heads",
                      "model.d_model (" + std::to_string(d_model) + ") must be divisible by model.n_heads (" +
                          std::to_string(n_heads) + ")"};
  if (run.data_kind == DataKind::text && a.i64("vocab") > 256)
    return ArgProblem{
        "model.vocab", "",
        "must be <= 256 when data.kind is text (tokens are bytes), got " + std::to_string(a.i64("vocab"))};
  // Fused attention is cuDNN's flash attention: a GPU's, with bf16 operands (what medium already
  // does to every GEMM operand), head dims in multiples of 8.
  if (a.text("attention") != "fused") return std::nullopt;
  if (run.device != Device::cuda)
    return ArgProblem{"model.attention", "train.device",
                      "model.attention: fused needs train.device: cuda (cuDNN's flash attention); on the CPU, "
                      "recompute keeps the same memory"};
  if (run.matmul_precision != MatmulPrecision::medium)
    return ArgProblem{"model.attention", "train.matmul_precision",
                      "model.attention: fused multiplies bf16 operands; it needs train.matmul_precision: medium (is " +
                          std::string(matmul_precision_name(run.matmul_precision)) + ")"};
  if ((d_model / n_heads) % 8 != 0)
    return ArgProblem{"model.attention", "model.n_heads",
                      "model.attention: fused needs a head dim (d_model / n_heads) that is a multiple of 8, got " +
                          std::to_string(d_model / n_heads)};
  return std::nullopt;
}

std::string transformer_hf_extra_json(const ModelArgs&) {
  nlohmann::ordered_json j;
  j["description"] =
      "fsdp-hpc's decoder-only transformer: tok_emb + pos_emb (learned), n_layers pre-norm blocks (LayerNorm eps "
      "1e-5, causal torch.nn.MultiheadAttention with in_proj, exact GELU MLP), ln_f, head (Linear with bias, "
      "untied); state_dict names as tests/reference/torch_models.py's LM. No transformers class computes this.";
  j["layer_norm_eps"] = 1e-5;
  j["activation_function"] = "gelu";
  j["tie_word_embeddings"] = false;
  return j.dump();
}

}  // namespace

ModelFamily transformer_family() {
  ModelFamily f;
  f.name = "transformer";
  f.summary = "A decoder-only LM (embeddings, model.n_layers blocks, a final LayerNorm, a head)";
  f.task = ModelTask::causal_lm;
  std::vector<std::string> attention_modes;
  for (const auto& [mode, name] : kAttentionModes) attention_modes.emplace_back(name);
  f.args = {
      {"vocab",
       int64_t{256},
       at_least(1),
       {},
       true,
       "",
       "the token vocabulary (embedding rows, head outputs); at most 256 with `data.kind: text` (bytes)"},
      {"d_model",
       int64_t{512},
       at_least(1),
       {},
       true,
       "",
       "the hidden width, that of the residual stream (`embed_dim`)"},
      {"n_layers", int64_t{8}, at_least(1), {}, true, "", "the number of blocks"},
      {"n_heads",
       int64_t{8},
       at_least(1),
       {},
       true,
       "",
       "attention heads per block (`nn.MultiheadAttention`'s num_heads); must divide model.d_model"},
      {"d_ff",
       int64_t{2048},
       at_least(1),
       {},
       true,
       "",
       "the inner width of each feed-forward layer (`dim_feedforward`)"},
      {"seq_len",
       int64_t{256},
       at_least(1),
       {},
       true,
       "",
       "tokens per sample, the context length (learned positions); a text sample is this many bytes"},
      {"attention", std::string("materialized"), unbounded(), attention_modes, false, "",
       "what attention keeps for the backward: `materialized` the (B, H, T, T) probabilities (as "
       "`nn.MultiheadAttention`), `recompute` each row's max and 1/sum (the backward recomputes the scores), "
       "`fused` cuDNN's flash attention (needs `train.device: cuda`, `train.matmul_precision: medium` and a head "
       "dim that is a multiple of 8)"},
  };
  f.vocab_key = "vocab";
  f.seq_len_key = "seq_len";
  f.hf_model_type = "fsdp_transformer";
  f.hf_keys_required = true;  // no transformers class reads it: no defaults to fall back on
  f.make = [](const ModelArgs& a) {
    return make_transformer(a.i64("vocab"), a.i64("d_model"), a.i64("n_layers"), a.i64("n_heads"), a.i64("d_ff"),
                            a.i64("seq_len"), *parse_name(kAttentionModes, a.text("attention")));
  };
  f.hf_extra_json = transformer_hf_extra_json;
  f.check = transformer_check;
  return f;
}

}  // namespace fsdp
