#pragma once
// Host reduction kernels shared by every backend that reduces on the CPU: dst = op(dst, src),
// elementwise, for every dtype. bf16/f16 go through f32 and round once per call; reduce_many
// sums any number of inputs in f32 and rounds once at the end, which is what "accumulate in
// f32, round once" means for a direct (non-ring) reduce-scatter.
#include <cstddef>

#include "comm/comm.h"

namespace fsdp {

void reduce_into(void* dst, const void* src, size_t count, DType dtype, ReduceOp op);
// dst = op(srcs[0], ..., srcs[n-1]); dst may alias srcs[0].
void reduce_many(void* dst, const void* const* srcs, size_t n, size_t count, DType dtype, ReduceOp op);
// avg's last step: dst /= divisor (integers divide with truncation, as NCCL does).
void scale_for_avg(void* dst, size_t count, DType dtype, int divisor);

}  // namespace fsdp
