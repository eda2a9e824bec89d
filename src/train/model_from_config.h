#pragma once
// What an input file names for the layers below train/, which read no Config: the model of its
// `model:` section (mnist_cnn, transformer, t5) and the engine's options from its `fsdp:` section.
#include <memory>

namespace fsdp {

struct ModelConfig;
struct FsdpConfig;
struct FsdpOptions;
class Model;
struct HfNames;

std::unique_ptr<Model> make_model(const ModelConfig& config);
FsdpOptions fsdp_options(const FsdpConfig& config);
// How the model's parameter names meet a Hugging Face file's (T5's tied aliases).
HfNames hf_names(const ModelConfig& config);

}  // namespace fsdp
