// model.kind transformer (models/family.h).
#include <nlohmann/json.hpp>

#include "models/family.h"
#include "models/transformer/transformer.h"

namespace fsdp {

namespace {

// Fused attention is cuDNN's flash attention: a GPU's, on bf16 operands (the values compute:
// param_dtype bf16 holds, or what medium does to every GEMM operand), head dims in multiples of 8.
// "" when the run's facts allow it (whether cuDNN loads is the kernels' to say).
std::string fused_attention_refusal(const ModelArgs& a, const ModelRunFacts& run) {
  const int64_t hd = a.i64("d_model") / a.i64("n_heads");
  if (run.device != Device::cuda)
    return "needs train.device: cuda (cuDNN's flash attention); on the CPU, recompute keeps the same memory";
  if (run.compute_dtype != DType::bf16 && run.matmul_precision != MatmulPrecision::medium)
    return "multiplies bf16 operands; it needs bf16 compute (fsdp.mixed_precision.param_dtype: bf16) or "
           "train.matmul_precision: medium (is " +
           std::string(matmul_precision_name(run.matmul_precision)) + ")";
  if (hd % 8 != 0) return "needs a head dim (d_model / n_heads) that is a multiple of 8, got " + std::to_string(hd);
  return "";
}

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
  if (a.text("attention") != "fused") return std::nullopt;
  if (const std::string why = fused_attention_refusal(a, run); !why.empty())
    return ArgProblem{"model.attention",
                      why.find("train.device") != std::string::npos ? "train.device"
                      : why.find("head dim") != std::string::npos   ? "model.n_heads"
                                                                    : "train.matmul_precision",
                      "model.attention: fused " + why};
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
      {"attention", std::string("auto"), unbounded(), attention_modes, false, "",
       "what attention keeps for the backward: `materialized` the (B, H, T, T) probabilities (as "
       "`nn.MultiheadAttention`), `recompute` each row's max and 1/sum (the backward recomputes the scores), "
       "`fused` cuDNN's flash attention (needs `train.device: cuda`, bf16 compute or `train.matmul_precision: "
       "medium`, and a head dim that is a multiple of 8), `auto` fused where the run can use it and cuDNN loads, "
       "else materialized (the banner says which and why)"},
  };
  f.vocab_key = "vocab";
  f.seq_len_key = "seq_len";
  f.hf_model_type = "fsdp_transformer";
  f.hf_keys_required = true;  // no transformers class reads it: no defaults to fall back on
  f.make = [](const ModelArgs& a) {
    AttentionMode mode = *parse_name(kAttentionModes, a.text("attention"));
    if (mode == AttentionMode::automatic) mode = AttentionMode::materialized;  // unresolved: names and shapes
    return make_transformer(a.i64("vocab"), a.i64("d_model"), a.i64("n_layers"), a.i64("n_heads"), a.i64("d_ff"),
                            a.i64("seq_len"), mode);
  };
  f.resolve_attention = [](ModelArgs& a, const ModelRunFacts& run, const std::string& kernels_refusal) {
    if (a.text("attention") != "auto") return std::string();
    std::string why = fused_attention_refusal(a, run);
    if (why.empty()) why = kernels_refusal;
    a.set("attention", std::string(why.empty() ? "fused" : "materialized"));
    return why.empty() ? std::string("fused (cuDNN's flash attention)") : "materialized: fused " + why;
  };
  f.hf_extra_json = transformer_hf_extra_json;
  f.check = transformer_check;
  return f;
}

}  // namespace fsdp
