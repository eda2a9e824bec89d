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

}  // namespace fsdp
