#include "nn/module.h"

#include <algorithm>

#include "nn/activation_stash.h"
#include "tensor/rng.h"

namespace fsdp {

void Param::init_values(float* out, int64_t offset, int64_t count, uint64_t seed) const {
  switch (init.kind) {
    case ParamInit::Kind::uniform: init_uniform(out, count, offset, seed, name, init.a, init.b); break;
    case ParamInit::Kind::normal: init_normal(out, count, offset, seed, name, init.a, init.b); break;
    case ParamInit::Kind::constant: std::fill(out, out + count, init.a); break;
  }
  if (init.zero_row < 0 || shape.size() != 2) return;
  // The row's elements that fall in [offset, offset + count): the draws of the others stay put
  // (every element's draw depends on its index alone).
  const int64_t row_begin = init.zero_row * shape[1], row_end = row_begin + shape[1];
  const int64_t begin = std::max(offset, row_begin), end = std::min(offset + count, row_end);
  if (begin < end) std::fill(out + (begin - offset), out + (end - offset), 0.0f);
}

Param& Module::add_param(const std::string& local_name, Shape shape, ParamInit init) {
  auto p = std::make_unique<Param>();
  p->name = child_name(local_name);
  p->shape = std::move(shape);
  p->init = init;
  params_.push_back(std::move(p));
  return *params_.back();
}

std::vector<Param*> Module::params() {
  std::vector<Param*> out;
  visit([&](Module& m) {
    for (auto& p : m.params_) out.push_back(p.get());
  });
  return out;
}

void Module::visit(const std::function<void(Module&)>& fn) {
  fn(*this);
  for (Module* c : children_) c->visit(fn);
}

void RunCtx::rounded(const Tensor& t) const {
  if (stash && compute_dtype != DType::f32) stash->record(t);
}

Tensor Layer::forward(RunCtx& ctx, const Tensor& x) {
  ctx.pre_forward(*this);
  const bool recompute_later = checkpointed() && ctx.training;
  if (recompute_later) saved_input_ = x;
  Tensor y = do_forward(ctx, x);
  if (ctx.training) drop_output();
  if (recompute_later) release_activations();
  if (ctx.stash && hooked()) ctx.stash->end_unit_forward(y);  // an FSDP unit's end
  ctx.post_forward(*this);
  return y;
}

Tensor Layer::backward(RunCtx& ctx, const Tensor& dy) {
  ctx.pre_backward(*this);  // FSDP gathers the unit here: the recompute runs after it
  const bool recomputed = checkpointed() && saved_input_.defined();
  if (recomputed) {
    do_forward(ctx, saved_input_);
    saved_input_ = Tensor();
  }
  Tensor dx = do_backward(ctx, dy);
  // The forward's buffers and the backward's own are spent once the backward returns (dx keeps
  // its own handle): freed now, as autograd frees saved tensors, so a backward holds the forward's
  // activations plus one layer's gradients, not every layer's of both. The next forward
  // reallocates (the caching allocator and HostBlockCache reuse the blocks).
  release_activations();
  ctx.post_backward(*this);
  return dx;
}

int64_t Module::num_params() {
  int64_t n = 0;
  for (Param* p : params()) n += p->numel();
  return n;
}

}  // namespace fsdp
