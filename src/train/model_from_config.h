#pragma once
// What an input file names for the layers below train/, which read no Config: the model of its
// `model:` section (mnist_cnn, transformer, t5) and the engine's options from its `fsdp:` section.
#include <memory>
#include <string>

namespace fsdp {

struct Config;
class Kernels;
struct ModelConfig;
struct FsdpConfig;
struct FsdpOptions;
class Model;
struct HfNames;

std::unique_ptr<Model> make_model(const ModelConfig& config);
// model.attention: auto resolved for this run on its kernels (fused where the run can use it and
// the kernels have it, else materialized): the key is set to the mode taken, and the banner's
// words returned ("" when there was nothing to resolve). The memory plan copies the resolved config.
std::string resolve_attention(Config& config, Kernels& kernels);
FsdpOptions fsdp_options(const FsdpConfig& config);
// How the model's parameter names meet a Hugging Face file's (T5's tied aliases).
HfNames hf_names(const ModelConfig& config);

}  // namespace fsdp
