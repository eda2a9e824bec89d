#pragma once
// train.optimizer.kind and train.scheduler.kind: optim/'s algorithms by PyTorch's names.
#include "tensor/name_table.h"

namespace fsdp {

enum class OptimizerKind { sgd, adadelta, adamw };
inline constexpr NameTable<OptimizerKind, 3> kOptimizerKinds{
    {{OptimizerKind::sgd, "sgd"}, {OptimizerKind::adadelta, "adadelta"}, {OptimizerKind::adamw, "adamw"}}};

enum class SchedulerKind { none, step, cosine };
inline constexpr NameTable<SchedulerKind, 3> kSchedulerKinds{
    {{SchedulerKind::none, "none"}, {SchedulerKind::step, "step"}, {SchedulerKind::cosine, "cosine"}}};

constexpr const auto& name_table(OptimizerKind) { return kOptimizerKinds; }
constexpr const auto& name_table(SchedulerKind) { return kSchedulerKinds; }

}  // namespace fsdp
