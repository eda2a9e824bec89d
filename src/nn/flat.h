#pragma once
// One flat f32 buffer for a list of parameters, back to back in the given (PyTorch) order — a
// FlatParam. The whole model on one rank, one FSDP unit later. Offsets are element counts.
#include <cstdint>
#include <vector>

#include "nn/module.h"

namespace fsdp {

struct FlatLayout {
  std::vector<Param*> params;
  std::vector<int64_t> offsets;  // element offset of params[i] in the flat buffer
  int64_t numel = 0;
};

FlatLayout make_flat_layout(const std::vector<Param*>& params);
// Points every param's data (and grad, when given) at its slice of the flat buffers.
void bind_flat(const FlatLayout& layout, float* data, float* grad);
// Writes initial values of flat elements [begin, end) into out (end - begin elements): a rank
// materialises only its own shard, with exactly the values a full init would have there.
void init_flat_range(const FlatLayout& layout, float* out, int64_t begin, int64_t end, uint64_t seed);

}  // namespace fsdp
