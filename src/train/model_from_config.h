#pragma once
// What an input file names for the layers below train/, which read no Config: the model of its
// `model:` section (mnist_cnn, transformer, t5) and the engine's options from its `fsdp:` section.
#include <memory>

namespace fsdp {

struct ModelConfig;
struct FsdpConfig;
struct FsdpOptions;
class Model;

std::unique_ptr<Model> make_model(const ModelConfig& config);
FsdpOptions fsdp_options(const FsdpConfig& config);

}  // namespace fsdp
