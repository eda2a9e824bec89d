#include "nn/flat.h"

#include <algorithm>

namespace fsdp {

FlatLayout make_flat_layout(const std::vector<Param*>& params) {
  FlatLayout layout;
  layout.params = params;
  for (Param* p : params) {
    layout.offsets.push_back(layout.numel);
    layout.numel += p->numel();
  }
  return layout;
}

void bind_flat(const FlatLayout& layout, float* data, float* grad) {
  for (size_t i = 0; i < layout.params.size(); ++i) {
    layout.params[i]->data = data + layout.offsets[i];
    layout.params[i]->grad = grad ? grad + layout.offsets[i] : nullptr;
  }
}

void init_flat_range(const FlatLayout& layout, float* out, int64_t begin, int64_t end, uint64_t seed) {
  std::fill(out, out + (end - begin), 0.0f);  // padding past the last param stays zero
  for (size_t i = 0; i < layout.params.size(); ++i) {
    int64_t p_begin = layout.offsets[i], p_end = p_begin + layout.params[i]->numel();
    int64_t lo = std::max(begin, p_begin), hi = std::min(end, p_end);
    if (lo < hi) layout.params[i]->init_values(out + (lo - begin), lo - p_begin, hi - lo, seed);
  }
}

}  // namespace fsdp
