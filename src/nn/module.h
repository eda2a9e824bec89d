#pragma once
// The module tree. Every parameter carries its PyTorch state_dict name and layout and an init
// rule; modules never own parameter storage — a flat buffer does (one for the whole model on a
// single rank, one per FSDP unit later) and binds each Param's data/grad pointers into it.
// Layers have explicit forward and backward (llm.c style): forward keeps what backward needs,
// and both return layer-owned buffers that stay valid until the layer's next call.
#include <cstdint>
#include <functional>
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
  // >= 0: this row of a 2-D parameter starts at zero whatever the kind (nn.Embedding's
  // padding_idx, which HF's _init_weights zeroes after drawing the rest).
  int64_t zero_row = -1;

  static ParamInit normal(double std) { return {Kind::normal, 0.0f, static_cast<float>(std)}; }  // N(0, std)
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
class ActivationStash;

// Called around the forward and backward of every module the engine marked (the root module of
// each FSDP unit: ctx.pre_forward(m) and friends below); FSDP gathers and frees there.
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
  // The dtype this pass computes in (fsdp.mixed_precision.compute: param_dtype): bf16/f16 rounds
  // every layer's output and input gradient to it (round below), f32 rounds nothing.
  DType compute_dtype = DType::f32;
  // Training with fsdp.mixed_precision.saved_activations: param_dtype (nn/activation_stash.h):
  // round records what it rounded, and each unit's activations wait for its backward packed.
  ActivationStash* stash = nullptr;

  Kernels& kernels() const { return runtime ? runtime->kernels() : cpu_kernels(); }
  // ensure() in this pass's memory: layers allocate activations through this.
  void ensure(Tensor& t, const Shape& shape, DType dtype, MemCategory category = MemCategory::activations) const {
    if (runtime)
      fsdp::ensure(t, shape, dtype, category, *runtime);
    else
      fsdp::ensure(t, shape, dtype, category, mem);
  }
  // An op's output rounded to compute_dtype in place (nothing in f32): where PyTorch's op in that
  // dtype would store its result. Layers call it after every kernel whose output leaves the op.
  // Recorded by the stash: a tensor rounded in pieces (round(ptr, n)) is recorded with rounded(t).
  void round(const Tensor& t) const {
    if (compute_dtype == DType::f32 || !t.defined()) return;
    kernels().round_to(t.f32(), compute_dtype, t.numel());
    rounded(t);
  }
  // t holds compute_dtype's values (rounded here in pieces, or by a kernel that rounds as it
  // writes): what the stash may pack.
  void rounded(const Tensor& t) const;
  void round(float* x, int64_t n) const {
    if (compute_dtype != DType::f32) kernels().round_to(x, compute_dtype, n);
  }
  // A tensor made on the host where this pass's kernels read it: a copy on a device runtime
  // (charged to activations), the tensor itself on the host (masks, ids, tables).
  Tensor to_run_device(const Tensor& host) const {
    return runtime && runtime->device() != Device::cpu ? to_device(*runtime, host, MemCategory::activations) : host;
  }
  // A tensor of this pass on the host: a copy from a device runtime, else the tensor itself.
  Tensor to_host_memory(const Tensor& t) const {
    return t.device() == Device::cpu ? t : to_host(*runtime, t, MemCategory::activations, mem);
  }
  // Every module's forward and backward call these around its own work (Layer does it for its
  // subclasses); they reach the hooks only for modules marked hooked, so they cost a branch.
  inline void pre_forward(Module& m) const;
  inline void post_forward(Module& m) const;
  inline void pre_backward(Module& m) const;
  inline void post_backward(Module& m) const;
};

class Module {
 public:
  Module(std::string name, std::string type) : name_(std::move(name)), type_(std::move(type)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& name() const { return name_; }  // dotted path in the state_dict, "" at the root
  const std::string& type() const { return type_; }  // "Linear", "TransformerBlock", "T5Block", ...
  const std::vector<Module*>& children() const { return children_; }
  // Parameters registered here (this module owns them: their names carry its path).
  const std::vector<std::unique_ptr<Param>>& own_params() const { return params_; }
  // Parameters this module's forward reads but another module owns: a tied weight (T5's
  // lm_head reading shared.weight) or a module called from several places (T5's `shared`
  // embedding, called by the encoder and the decoder). FSDP puts such a parameter in the
  // innermost unit that holds every module using it.
  const std::vector<Param*>& used_params() const { return used_; }
  // PyTorch's named_parameters() order: own params first, then children in registration order.
  std::vector<Param*> params();
  int64_t num_params();
  // Pre-order over the subtree (this module first).
  void visit(const std::function<void(Module&)>& fn);

  // A grouping that is never an FSDP unit of its own (PyTorch's ModuleList is one; so is the
  // nameless Embeddings holder of the transformer): wrap policies look through it.
  bool is_container() const { return container_; }
  // When an FSDP unit is rooted here, ctx.pre_forward(*this) and friends call the hooks.
  bool hooked() const { return hooked_; }
  void set_hooked(bool on) { hooked_ = on; }
  // Activation checkpointing of this module's subtree: what forward keeps is dropped after it
  // and rebuilt by a recomputing forward (same ctx: same dropout masks) just before backward.
  bool checkpointed() const { return checkpointed_; }
  void set_checkpointed(bool on) { checkpointed_ = on; }

 protected:
  Param& add_param(const std::string& local_name, Shape shape, ParamInit init);
  void use_param(Param& p) { used_.push_back(&p); }
  void set_container() { container_ = true; }
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
  std::vector<Param*> used_;
  std::vector<std::unique_ptr<Module>> owned_;
  std::vector<Module*> children_;
  bool container_ = false;
  bool hooked_ = false;
  bool checkpointed_ = false;
};

void RunCtx::pre_forward(Module& m) const {
  if (hooks && m.hooked()) hooks->pre_forward(m);
}
void RunCtx::post_forward(Module& m) const {
  if (hooks && m.hooked()) hooks->post_forward(m);
}
void RunCtx::pre_backward(Module& m) const {
  if (hooks && m.hooked()) hooks->pre_backward(m);
}
void RunCtx::post_backward(Module& m) const {
  if (hooks && m.hooked()) hooks->post_backward(m);
}

// A module on the activation path: (x) -> y, and (dy) -> dx. forward/backward run the hooks
// and activation checkpointing around the subclass's do_forward/do_backward, and return
// handles: a checkpointed layer drops its own buffers, and its output must outlive that.
class Layer : public Module {
 public:
  using Module::Module;
  Tensor forward(RunCtx& ctx, const Tensor& x);
  // dx is skipped (an undefined Tensor returned) when need_input_grad is false: the first
  // layer's input gradient is never used, and for conv1 it is the costliest part of backward.
  Tensor backward(RunCtx& ctx, const Tensor& dy);
  // Drops every buffer the layer holds: after its backward, and between the forward and the
  // recomputing forward of a checkpointed layer. The next forward reallocates.
  virtual void release_activations() = 0;
  // Training, once forward has handed its output over: a layer whose backward does not read its
  // own output drops its handle, so the buffer lives as long as its readers do (PyTorch frees an
  // output no backward saved after its last use): a block's out_proj and fc2 outputs die at the
  // residual add instead of waiting for the block's backward.
  virtual void drop_output() {}
  bool need_input_grad = true;

 protected:
  // Return layer-owned buffers that stay valid until the layer's next call.
  virtual const Tensor& do_forward(RunCtx& ctx, const Tensor& x) = 0;
  virtual const Tensor& do_backward(RunCtx& ctx, const Tensor& dy) = 0;

 private:
  Tensor saved_input_;  // checkpointed: forward's input, kept for the recompute
};

}  // namespace fsdp
