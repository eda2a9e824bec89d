#pragma once
// The model an input file's `model:` section names (mnist_cnn, transformer, t5).
#include <memory>

namespace fsdp {

struct ModelConfig;
class Model;

std::unique_ptr<Model> make_model(const ModelConfig& config);

}  // namespace fsdp
