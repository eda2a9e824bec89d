// release_activations() of every layer: reset each buffer the layer's forward and backward
// allocate, so a checkpointed layer holds nothing between its forward and its recompute.
#include "nn/layers.h"

namespace fsdp {

void Linear::release_activations() { x_ = y_ = dx_ = Tensor(); }
void Conv2d::release_activations() { x_ = col_ = ybuf_ = y_ = dyt_ = dcol_ = dx_ = Tensor(); }
void ReLU::release_activations() { y_ = dx_ = Tensor(); }
void GELU::release_activations() { x_ = y_ = dx_ = Tensor(); }
void Dropout::release_activations() { x_ = mask_ = y_ = dx_ = Tensor(); }
void MaxPool2d::release_activations() { argmax_ = y_ = dx_ = Tensor(); }
void Flatten::release_activations() { y_ = dx_ = Tensor(); }
void LogSoftmax::release_activations() { y_ = dx_ = Tensor(); }
void LayerNorm::release_activations() { x_ = y_ = mean_ = rstd_ = dx_ = Tensor(); }
void Embeddings::release_activations() { tokens_ = y_ = Tensor(); }

void MultiheadAttention::release_activations() {
  x_ = qkv_ = att_ = y_ = dy_att_ = dqkv_ = dx_ = dp_ = out_ = Tensor();
  out_proj.release_activations();
}

void TransformerBlock::release_activations() {
  a_ = y_ = da_ = dx_ = Tensor();
  for (Layer* l : std::initializer_list<Layer*>{&ln1, &attn, &ln2, &fc1, &act, &fc2}) l->release_activations();
}

}  // namespace fsdp
