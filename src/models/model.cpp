#include "models/model.h"

#include "config/config.h"
#include "tensor/error.h"

namespace fsdp {

double Model::forward(RunCtx& ctx, const Tensor& inputs, const Tensor& targets) {
  // Tensor handles, not pointers: a checkpointed layer releases its buffers, and its output
  // must outlive that for the next layer.
  Tensor x = inputs;
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer* layer = layers_[i];
    if (ctx.hooks) ctx.hooks->pre_forward(*layer);
    const bool ckpt = checkpointed_[i] && ctx.training;
    if (ckpt) saved_inputs_[i] = x;
    x = layer->forward(ctx, x);
    if (ckpt) layer->release_activations();
    if (ctx.hooks) ctx.hooks->post_forward(*layer);
  }
  output_ = x;
  return loss_->forward(ctx, x, targets);
}

void Model::backward(RunCtx& ctx) {
  Tensor dy = loss_->backward(ctx);
  for (size_t i = layers_.size(); i-- > 0;) {
    Layer* layer = layers_[i];
    if (ctx.hooks) ctx.hooks->pre_backward(*layer);  // FSDP gathers the unit here: recompute after
    if (checkpointed_[i]) {
      layer->forward(ctx, saved_inputs_[i]);
      saved_inputs_[i] = Tensor();
    }
    dy = layer->backward(ctx, dy);
    if (checkpointed_[i]) layer->release_activations();  // dy keeps its own handle on dx
    if (ctx.hooks) ctx.hooks->post_backward(*layer);
  }
}

void Model::set_checkpointed(const Layer& layer, bool on) {
  for (size_t i = 0; i < layers_.size(); ++i)
    if (layers_[i] == &layer) checkpointed_[i] = on;
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
  Transformer(int64_t vocab, int64_t d_model, int64_t n_layers, int64_t n_heads, int64_t d_ff, int64_t seq_len)
      : Model("Transformer", std::make_unique<CrossEntropyLoss>()), seq_len_(seq_len) {
    add_layer<Embeddings>(vocab, seq_len, d_model).need_input_grad = false;
    for (int64_t i = 0; i < n_layers; ++i)
      add_layer<TransformerBlock>("blocks." + std::to_string(i), d_model, n_heads, d_ff);
    add_layer<LayerNorm>("ln_f", d_model);
    add_layer<Linear>("head", d_model, vocab);
  }
  int64_t loss_elements_per_sample() const override { return seq_len_; }

 private:
  int64_t seq_len_;
};

}  // namespace

std::unique_ptr<Model> make_mnist_cnn() { return std::make_unique<MnistCnn>(); }

std::unique_ptr<Model> make_transformer(int64_t vocab, int64_t d_model, int64_t n_layers, int64_t n_heads, int64_t d_ff,
                                        int64_t seq_len) {
  if (d_model % n_heads != 0)
    throw Error("model.d_model " + std::to_string(d_model) + " is not divisible by model.n_heads " +
                std::to_string(n_heads));
  return std::make_unique<Transformer>(vocab, d_model, n_layers, n_heads, d_ff, seq_len);
}

std::unique_ptr<Model> make_model(const ModelConfig& config) {
  if (config.kind == ModelKind::mnist_cnn) return make_mnist_cnn();
  if (config.kind == ModelKind::transformer)
    return make_transformer(config.vocab, config.d_model, config.n_layers, config.n_heads, config.d_ff, config.seq_len);
  throw Error("model.kind: not " + names_of(kModelKinds));
}

}  // namespace fsdp
