#include "models/transformer/transformer.h"

#include "tensor/error.h"

namespace fsdp {

namespace {

class Transformer : public Model {
 public:
  Transformer(int64_t vocab, int64_t d_model, int64_t n_layers, int64_t n_heads, int64_t d_ff, int64_t seq_len,
              AttentionMode attention)
      // -100: the labels causal_lm data leaves out (a block's last position, prompts), as for Llama.
      : Model("Transformer", std::make_unique<CrossEntropyLoss>(-100)) {
    add_layer<Embeddings>(vocab, seq_len, d_model).need_input_grad = false;
    for (int64_t i = 0; i < n_layers; ++i)
      add_layer<TransformerBlock>("blocks." + std::to_string(i), d_model, n_heads, d_ff, attention);
    add_layer<LayerNorm>("ln_f", d_model);
    add_layer<Linear>("head", d_model, vocab);
  }
  std::vector<std::string> block_types() const override { return {"TransformerBlock"}; }
};

}  // namespace

std::unique_ptr<Model> make_transformer(int64_t vocab, int64_t d_model, int64_t n_layers, int64_t n_heads, int64_t d_ff,
                                        int64_t seq_len, AttentionMode attention) {
  if (d_model % n_heads != 0)
    throw Error("model.d_model " + std::to_string(d_model) + " is not divisible by model.n_heads " +
                std::to_string(n_heads));
  return std::make_unique<Transformer>(vocab, d_model, n_layers, n_heads, d_ff, seq_len, attention);
}

}  // namespace fsdp
