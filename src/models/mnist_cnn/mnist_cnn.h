#pragma once
// PyTorch's MNIST example Net (examples/mnist/main.py).
#include <memory>

#include "models/model.h"

namespace fsdp {

// conv1 1->32 3x3, ReLU, conv2 32->64 3x3, ReLU, max_pool 2, dropout 0.25, flatten, fc1 9216->128,
// ReLU, dropout 0.5, fc2 128->10, log_softmax; NLL loss.
std::unique_ptr<Model> make_mnist_cnn();

}  // namespace fsdp
