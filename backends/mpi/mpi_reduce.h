#pragma once
// Host reduction for the MPI backend: comm/reduce.h's semantics (dst = op(srcs[0..n-1]), bf16
// and f16 accumulate in f32 and round once), with bf16/f16 kernels the compiler vectorises
// (conversions inlined; F16C when the target has it). reduce.h's half path converts through
// out-of-line calls per element: measured here 0.13 G elements/s for bf16 n=2, against
// several G elements/s for these, which would make a bf16 reduce_scatter slower than f32's.
// Results are bit-identical to reduce_many (same per-element operation order and rounding).
#include <cstddef>

#include "comm/comm.h"

namespace fsdp {

// dst = op(srcs[0], ..., srcs[n-1]); dst may alias any src at the same offsets. avg divides by n
// here: for bf16/f16 before the one rounding (the f32 sum / n, rounded once).
void mpi_reduce_many(void* dst, const void* const* srcs, size_t n, size_t count, DType dtype, ReduceOp op);
// avg's division after an MPI reduction: reduce.h's scale_for_avg, with fast half kernels.
void mpi_scale_for_avg(void* dst, size_t count, DType dtype, int divisor);

}  // namespace fsdp
