#include "models/model.h"

#include "tensor/error.h"

namespace fsdp {

std::vector<std::vector<int32_t>> Model::generate(RunCtx&, const Tensor&, const GenerateOptions&) {
  throw Error("model " + type() + " does not generate text (only sequence-to-sequence models do: model.kind t5)");
}

double Model::forward(RunCtx& ctx, const Tensor& inputs, const Tensor& targets) {
  ctx.pre_forward(*this);
  output_ = run_forward(ctx, inputs, targets);
  const double loss = loss_->forward(ctx, output_, targets);
  ctx.post_forward(*this);
  return loss;
}

void Model::backward(RunCtx& ctx) {
  ctx.pre_backward(*this);
  run_backward(ctx, loss_->backward(ctx));
  ctx.post_backward(*this);
}

Tensor Model::run_forward(RunCtx& ctx, const Tensor& inputs, const Tensor& /*targets*/) {
  // Tensor handles, not references: a checkpointed layer releases its buffers, and its output
  // must outlive that for the next layer.
  Tensor x = inputs;
  for (Layer* layer : layers_) x = layer->forward(ctx, x);
  return x;
}

Tensor Model::run_backward(RunCtx& ctx, const Tensor& d_output) {
  Tensor dy = d_output;
  for (size_t i = layers_.size(); i-- > 0;) dy = layers_[i]->backward(ctx, dy);
  return dy;
}

namespace {

class MnistCnn : public Model {
 public:
  MnistCnn() : Model("MnistCnn", std::make_unique<NLLLoss>()) {
    // Registration order = PyTorch's: conv1, conv2, dropout1, dropout2, fc1, fc2.
    add_layer<Conv2d>("conv1", 1, 32, 3).need_input_grad = false;
    add_layer<ReLU>("relu1");
    add_layer<Conv2d>("conv2", 32, 64, 3);
    add_layer<ReLU>("relu2");
    add_layer<MaxPool2d>("max_pool");
    add_layer<Dropout>("dropout1", 0.25f);
    add_layer<Flatten>("flatten");
    add_layer<Linear>("fc1", 9216, 128);
    add_layer<ReLU>("relu3");
    add_layer<Dropout>("dropout2", 0.5f);
    add_layer<Linear>("fc2", 128, 10);
    add_layer<LogSoftmax>("log_softmax");
  }
};

class Transformer : public Model {
 public:
  Transformer(int64_t vocab, int64_t d_model, int64_t n_layers, int64_t n_heads, int64_t d_ff, int64_t seq_len,
              AttentionMode attention)
      : Model("Transformer", std::make_unique<CrossEntropyLoss>()) {
    add_layer<Embeddings>(vocab, seq_len, d_model).need_input_grad = false;
    for (int64_t i = 0; i < n_layers; ++i)
      add_layer<TransformerBlock>("blocks." + std::to_string(i), d_model, n_heads, d_ff, attention);
    add_layer<LayerNorm>("ln_f", d_model);
    add_layer<Linear>("head", d_model, vocab);
  }
  std::vector<std::string> block_types() const override { return {"TransformerBlock"}; }
};

}  // namespace

std::unique_ptr<Model> make_mnist_cnn() { return std::make_unique<MnistCnn>(); }

std::unique_ptr<Model> make_transformer(int64_t vocab, int64_t d_model, int64_t n_layers, int64_t n_heads, int64_t d_ff,
                                        int64_t seq_len, AttentionMode attention) {
  if (d_model % n_heads != 0)
    throw Error("model.d_model " + std::to_string(d_model) + " is not divisible by model.n_heads " +
                std::to_string(n_heads));
  return std::make_unique<Transformer>(vocab, d_model, n_layers, n_heads, d_ff, seq_len, attention);
}

}  // namespace fsdp
