#pragma once
// The seed models as a root Module (name "") with a list of top-level layers run in order and a
// loss. The top-level layers are what FSDP wraps into units and what hooks run around.
#include <memory>
#include <vector>

#include "models/generate.h"
#include "nn/layers.h"
#include "nn/loss.h"
#include "nn/module.h"

namespace fsdp {

// A model is a tree of modules (the root is this object, name ""); its forward and backward are
// ordinary code over the tree. The root is the outermost FSDP unit: forward() and backward()
// run its hooks around the subclass's run_forward/run_backward, and every module an FSDP unit is
// rooted at runs its own hooks when forward or backward reaches it.
class Model : public Module {
 public:
  Model(std::string type, std::unique_ptr<Loss> loss) : Module("", std::move(type)), loss_(std::move(loss)) {}

  // Returns this rank's share of the mean loss.
  double forward(RunCtx& ctx, const Tensor& inputs, const Tensor& targets);
  // Gradients accumulate (+=) into the params' grad pointers.
  void backward(RunCtx& ctx);
  const Tensor& output() const { return output_; }  // what the loss read (logits, log-probs)
  const Loss& loss() const { return *loss_; }
  // A sequential model's top-level layers in forward order; empty for the others.
  const std::vector<Layer*>& layers() const { return layers_; }
  // The class names the transformer_layer wrap policy wraps ("TransformerBlock", "T5Block").
  virtual std::vector<std::string> block_types() const { return {}; }
  // Sequence-to-sequence models (T5): the generated ids of each sample of inputs (B, S) i32,
  // greedy or beam search (models/generate.h), the encoder run once and the decoder's keys and
  // values cached. The parameters must be in place: an FSDP run gathers every unit first
  // (FsdpEngine::unshard_all) and runs this with ctx.hooks null. The others: an Error.
  virtual std::vector<std::vector<int32_t>> generate(RunCtx& ctx, const Tensor& inputs, const GenerateOptions& o);

 protected:
  // A sequential model: every layer in registration order, then the loss.
  virtual Tensor run_forward(RunCtx& ctx, const Tensor& inputs, const Tensor& targets);
  virtual Tensor run_backward(RunCtx& ctx, const Tensor& d_output);

  template <class L, class... Args>
  L& add_layer(Args&&... args) {
    L& l = add_child<L>(std::forward<Args>(args)...);
    layers_.push_back(&l);
    return l;
  }

 private:
  std::unique_ptr<Loss> loss_;
  std::vector<Layer*> layers_;
  Tensor output_;
};

}  // namespace fsdp
