#include "models/mnist_cnn/mnist_cnn.h"

namespace fsdp {

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

}  // namespace

std::unique_ptr<Model> make_mnist_cnn() { return std::make_unique<MnistCnn>(); }

}  // namespace fsdp
