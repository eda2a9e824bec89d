#include "nn/module.h"

#include <algorithm>

#include "tensor/rng.h"

namespace fsdp {

void Param::init_values(float* out, int64_t offset, int64_t count, uint64_t seed) const {
  switch (init.kind) {
    case ParamInit::Kind::uniform: init_uniform(out, count, offset, seed, name, init.a, init.b); return;
    case ParamInit::Kind::normal: init_normal(out, count, offset, seed, name, init.a, init.b); return;
    case ParamInit::Kind::constant: std::fill(out, out + count, init.a); return;
  }
}

Param& Module::add_param(const std::string& local_name, Shape shape, ParamInit init) {
  auto p = std::make_unique<Param>();
  p->name = child_name(local_name);
  p->shape = std::move(shape);
  p->init = init;
  params_.push_back(std::move(p));
  return *params_.back();
}

void Module::collect_params(std::vector<Param*>& out) {
  for (auto& p : params_) out.push_back(p.get());
  for (Module* c : children_) c->collect_params(out);
}

std::vector<Param*> Module::params() {
  std::vector<Param*> out;
  collect_params(out);
  return out;
}

int64_t Module::num_params() {
  int64_t n = 0;
  for (Param* p : params()) n += p->numel();
  return n;
}

}  // namespace fsdp

// ---- Memory plan ----

namespace fsdp {

PlanBuffer::PlanBuffer(size_t bytes_in, MemCategory category_in, MemoryTracker& tracker_in)
    : bytes(bytes_in), category(category_in), tracker(tracker_in) {
  tracker.on_alloc(category, bytes);
}

PlanBuffer::~PlanBuffer() { tracker.on_free(category, bytes); }

PlanTensor ActivationPlan::make(const Shape& shape, DType dtype, MemCategory category) {
  size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_bytes(dtype);
  return {std::make_shared<PlanBuffer>(bytes, category, tracker_), shape, dtype};
}

const PlanTensor& ActivationPlan::ensure(const void* owner, const void* slot, const Shape& shape, DType dtype,
                                         MemCategory category) {
  Slot& s = slots_[slot];
  s.owner = owner;
  if (!(s.t.defined() && s.t.shape == shape && s.t.dtype == dtype)) {
    PlanTensor fresh = make(shape, dtype, category);  // charged before the old one goes, as in ensure()
    s.t = std::move(fresh);
  }
  return s.t;
}

const PlanTensor& ActivationPlan::hold(const void* owner, const void* slot, const PlanTensor& t) {
  Slot& s = slots_[slot];
  s.owner = owner;
  s.t = t;
  return s.t;
}

const PlanTensor& ActivationPlan::get(const void* slot) const {
  auto it = slots_.find(slot);
  return it == slots_.end() ? none_ : it->second.t;
}

void ActivationPlan::drop(const void* slot) {
  auto it = slots_.find(slot);
  if (it != slots_.end()) it->second.t = PlanTensor();
}

void ActivationPlan::release(const Module& module) {
  std::vector<const Module*> stack{&module};
  std::vector<const void*> owners;
  while (!stack.empty()) {
    const Module* m = stack.back();
    stack.pop_back();
    owners.push_back(m);
    for (const Module* c : m->children()) stack.push_back(c);
  }
  for (auto& [key, s] : slots_)
    if (std::find(owners.begin(), owners.end(), s.owner) != owners.end()) s.t = PlanTensor();
}

Shape Layer::output_shape(const Shape& input, DType input_dtype) const {
  MemoryTracker tracker;
  ActivationPlan plan(tracker);
  RunCtx ctx;
  ctx.training = false;
  return plan_forward(plan, ctx, plan.make(input, input_dtype, MemCategory::other)).shape;
}

int64_t Layer::activation_bytes(const Shape& input, bool training, DType input_dtype) const {
  MemoryTracker tracker;
  ActivationPlan plan(tracker);
  RunCtx ctx;
  ctx.training = training;
  // Input and incoming gradient are someone else's buffers: charged to `other`, not counted.
  PlanTensor y = plan_forward(plan, ctx, plan.make(input, input_dtype, MemCategory::other));
  if (training) plan_backward(plan, ctx, plan.make(y.shape, DType::f32, MemCategory::other));
  return static_cast<int64_t>(tracker.current_bytes(MemCategory::activations));
}

}  // namespace fsdp
