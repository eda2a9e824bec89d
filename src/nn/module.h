#pragma once
// The module tree. Every parameter carries its PyTorch state_dict name and layout and an init
// rule; modules never own parameter storage — a flat buffer does (one for the whole model on a
// single rank, one per FSDP unit later) and binds each Param's data/grad pointers into it.
// Layers have explicit forward and backward (llm.c style): forward keeps what backward needs,
// and both return layer-owned buffers that stay valid until the layer's next call.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tensor/device.h"
#include "tensor/kernels.h"
#include "tensor/memory.h"
#include "tensor/tensor.h"

namespace fsdp {

// How a parameter's initial values are drawn (PyTorch's defaults for each layer type).
struct ParamInit {
  enum class Kind { uniform, normal, constant } kind = Kind::constant;
  float a = 0.0f;  // uniform: low;  normal: mean; constant: value
  float b = 0.0f;  // uniform: high; normal: std
};

struct Param {
  std::string name;  // full state_dict name, e.g. "blocks.0.attn.in_proj_weight"
  Shape shape;       // PyTorch layout, e.g. Linear weight (out, in)
  ParamInit init;
  float* data = nullptr;  // bound by the owner of the flat buffer
  float* grad = nullptr;  // gradients accumulate here (+=), zeroed by the owner

  int64_t numel() const { return shape_numel(shape); }
  // Elements [offset, offset + count) of the initial value: a rank can init just its shard.
  void init_values(float* out, int64_t offset, int64_t count, uint64_t seed) const;
};

class Module;

// Called around each top-level module's forward and backward; FSDP gathers and frees there.
class ModuleHooks {
 public:
  virtual ~ModuleHooks() = default;
  virtual void pre_forward(Module&) {}
  virtual void post_forward(Module&) {}
  virtual void pre_backward(Module&) {}
  virtual void post_backward(Module&) {}
};

// What one forward/backward pass needs to know besides its inputs.
struct RunCtx {
  MemoryTracker* mem = nullptr;  // activations are charged here
  bool training = true;
  bool dropout = true;  // train.dropout; dropout acts only when training too
  uint64_t seed = 1;
  int64_t step = 0;              // global optimizer step: dropout masks change per step
  int64_t sample_offset = 0;     // global index of this rank's first sample in the step
  double loss_normalizer = 1.0;  // samples (or tokens) in the global batch: loss = sum / this
  double loss_scale = 1.0;       // f16 dynamic loss scaling: gradients come out multiplied by this
  ModuleHooks* hooks = nullptr;
  // Where activations live and kernels run. Null: host memory charged to `mem`, host kernels
  // (the tests' and tools' default); the trainer always sets it.
  DeviceRuntime* runtime = nullptr;

  Kernels& kernels() const { return runtime ? runtime->kernels() : cpu_kernels(); }
  // ensure() in this pass's memory: layers allocate activations through this.
  void ensure(Tensor& t, const Shape& shape, DType dtype, MemCategory category = MemCategory::activations) const {
    if (runtime)
      fsdp::ensure(t, shape, dtype, category, *runtime);
    else
      fsdp::ensure(t, shape, dtype, category, mem);
  }
};

class Module {
 public:
  Module(std::string name, std::string type) : name_(std::move(name)), type_(std::move(type)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& name() const { return name_; }  // dotted prefix in the state_dict
  const std::string& type() const { return type_; }  // "Linear", "TransformerBlock", ...
  const std::vector<Module*>& children() const { return children_; }
  // PyTorch's named_parameters() order: own params first, then children in registration order.
  void collect_params(std::vector<Param*>& out);
  std::vector<Param*> params();
  int64_t num_params();

 protected:
  Param& add_param(const std::string& local_name, Shape shape, ParamInit init);
  template <class M, class... Args>
  M& add_child(Args&&... args) {
    owned_.push_back(std::make_unique<M>(std::forward<Args>(args)...));
    children_.push_back(owned_.back().get());
    return static_cast<M&>(*owned_.back());
  }
  std::string child_name(const std::string& local) const { return name_.empty() ? local : name_ + "." + local; }

 private:
  std::string name_;
  std::string type_;
  std::vector<std::unique_ptr<Param>> params_;
  std::vector<std::unique_ptr<Module>> owned_;
  std::vector<Module*> children_;
};

// A module on the activation path: (x) -> y, and (dy) -> dx.
class Layer : public Module {
 public:
  using Module::Module;
  virtual const Tensor& forward(RunCtx& ctx, const Tensor& x) = 0;
  // dx is skipped (an undefined Tensor returned) when need_input_grad is false: the first
  // layer's input gradient is never used, and for conv1 it is the costliest part of backward.
  virtual const Tensor& backward(RunCtx& ctx, const Tensor& dy) = 0;
  // Drops every buffer the layer holds (activation checkpointing frees a layer between its
  // forward and a recomputing forward in backward). The next forward reallocates.
  virtual void release_activations() = 0;
  bool need_input_grad = true;
};

}  // namespace fsdp
