#pragma once
// The seed models as a root Module (name "") with a list of top-level layers run in order and a
// loss. The top-level layers are what FSDP wraps into units and what hooks run around.
#include <memory>
#include <vector>

#include "nn/layers.h"
#include "nn/loss.h"
#include "nn/module.h"

namespace fsdp {

struct ModelConfig;

class Model : public Module {
 public:
  Model(std::string type, std::unique_ptr<Loss> loss) : Module("", std::move(type)), loss_(std::move(loss)) {}

  // Runs every layer and the loss; returns this rank's share of the mean loss.
  double forward(RunCtx& ctx, const Tensor& inputs, const Tensor& targets);
  // Gradients accumulate (+=) into the params' grad pointers.
  void backward(RunCtx& ctx);
  const Tensor& output() const { return output_; }
  const Loss& loss() const { return *loss_; }
  const std::vector<Layer*>& layers() const { return layers_; }
  // Activation checkpointing of one top-level layer: its buffers are dropped after forward and
  // rebuilt by a recomputing forward (same ctx: same dropout masks) just before its backward.
  void set_checkpointed(const Layer& layer, bool on);
  // Per-sample count the loss averages over: 1 for a classifier, T tokens for an LM.
  virtual int64_t loss_elements_per_sample() const { return 1; }

 protected:
  template <class L, class... Args>
  L& add_layer(Args&&... args) {
    L& l = add_child<L>(std::forward<Args>(args)...);
    layers_.push_back(&l);
    checkpointed_.push_back(false);
    saved_inputs_.emplace_back();
    return l;
  }

 private:
  std::unique_ptr<Loss> loss_;
  std::vector<Layer*> layers_;
  std::vector<bool> checkpointed_;    // by layer position
  std::vector<Tensor> saved_inputs_;  // checkpointed layers' inputs, forward to backward
  Tensor output_;
};

// The PyTorch MNIST example's Net: conv1 1->32 3x3, ReLU, conv2 32->64 3x3, ReLU, max_pool 2,
// dropout 0.25, flatten, fc1 9216->128, ReLU, dropout 0.5, fc2 128->10, log_softmax; NLL loss.
std::unique_ptr<Model> make_mnist_cnn();

// Decoder-only LM: tok_emb + pos_emb, n_layers TransformerBlock ("blocks.i"), ln_f, head;
// cross-entropy over every position.
std::unique_ptr<Model> make_transformer(int64_t vocab, int64_t d_model, int64_t n_layers, int64_t n_heads, int64_t d_ff,
                                        int64_t seq_len);

std::unique_ptr<Model> make_model(const ModelConfig& config);

}  // namespace fsdp
