// model.kind mnist_cnn (models/family.h).
#include "models/family.h"
#include "models/mnist_cnn/mnist_cnn.h"

namespace fsdp {

ModelFamily mnist_cnn_family() {
  ModelFamily f;
  f.name = "mnist_cnn";
  f.summary = "PyTorch's MNIST example Net (28x28 images, 10 classes)";
  f.task = ModelTask::image_classification;
  f.classes = 10;
  // The transformer's sizes: one input file switches between the two kinds by model.kind alone.
  f.ignores = {"vocab", "d_model", "n_layers", "n_heads", "d_ff", "seq_len"};
  f.make = [](const ModelArgs&) { return make_mnist_cnn(); };
  return f;
}

}  // namespace fsdp
