#pragma once
// Optimizers on flat f32 spans — FSDP hands them shards, a single rank hands them the whole
// flat parameter buffer — in host or device memory (each update is one Kernels call).
// PyTorch's exact update formulas (torch.optim, foreach=False, 1.13/2.x), state kept per
// element in the same flat layout so it shards with the parameters.
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include <vector>
#include "optim/kinds.h"

#include "tensor/memory.h"
#include "tensor/tensor.h"

namespace fsdp {

struct OptimizerConfig;
struct SchedulerConfig;
class DeviceRuntime;

// Part of the flat gradient: the gradients of flat elements [offset, offset + grads.size()).
// FSDP hands one slice per unit's shard, each its own allocation (fsdp.h: a unit's grad shard
// lives from its first reduce_scatter of a step to the next step's start).
struct GradSlice {
  int64_t offset = 0;
  std::span<const float> grads;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One step on params (size n) with the gradient in slices that tile [0, n) in order, at
  // learning rate lr: each slice's update is one kernel on that range of the params and the
  // state, the same per-element arithmetic as one kernel over all. Increments step().
  virtual void step(std::span<float> params, std::span<const GradSlice> grads, double lr) = 0;
  // The whole gradient in one span.
  void step(std::span<float> params, std::span<const float> grads, double lr) {
    const GradSlice whole{0, grads};
    step(params, std::span<const GradSlice>(&whole, 1), lr);
  }
  // Named state tensors, in PyTorch's names (momentum_buffer; square_avg, acc_delta;
  // exp_avg, exp_avg_sq), each the same flat size as the params. For checkpoints.
  virtual std::vector<std::pair<std::string, Tensor*>> state() = 0;
  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t n) { step_count_ = n; }

 protected:
  int64_t step_count_ = 0;
};

// `numel` = size of the flat spans this optimizer will see; state is allocated now (zeros) and
// charged to MemCategory::optim. This one keeps the state in host memory charged to `tracker`
// and steps with the host kernels: step() takes host spans.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, int64_t numel, MemoryTracker* tracker);
// State in the runtime's memory (charged to its tracker), stepped by its kernels: step() takes
// spans of that memory (device pointers on CUDA) and returns once the update is enqueued on
// the runtime's compute stream.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, int64_t numel, DeviceRuntime& runtime);

// Learning-rate schedule: lr for a given optimizer step and epoch (both 0-based).
// step: StepLR over epochs, lr * gamma^(epoch / step_size) (the seed steps it per epoch).
// cosine: linear warmup over warmup_steps (lr * (step+1)/warmup), then cosine from lr to min_lr
// over the remaining total_steps - warmup_steps.
class LrSchedule {
 public:
  LrSchedule(const SchedulerConfig& config, double base_lr, int64_t total_steps);
  double lr(int64_t step, int64_t epoch) const;

 private:
  SchedulerKind kind_;
  double base_lr_, gamma_, min_lr_;
  int64_t step_size_, warmup_steps_, total_steps_;
};

}  // namespace fsdp
