#include "models/t5/t5_buckets.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "tensor/error.h"

namespace fsdp {

// HF (transformers 4.36):
//   relative_position_if_large = max_exact + (
//       torch.log(relative_position.float() / max_exact)
//       / math.log(max_distance / max_exact)
//       * (num_buckets - max_exact)
//   ).to(torch.long)
// torch runs each step on an f32 tensor, a Python scalar being cast to f32 where it meets the
// tensor: the division by max_exact, logf, the division by the f64 math.log(...) rounded to f32,
// the product with num_buckets - max_exact, each rounded to f32, then truncation toward zero.
// Truncation makes a bucket jump wherever that value crosses an integer, so the steps are done
// in f32 exactly as torch orders them rather than in f64 (which agrees for T5's defaults, whose
// boundaries are powers of two, but need not for every num_buckets and max_distance). logf is
// glibc's where torch's CPU kernel uses Sleef's; they agreed on every position checked
// (|j - i| < 5000 for eight (num_buckets, max_distance) pairs, against torch 1.13).
int32_t t5_relative_bucket(int64_t relative_position, bool bidirectional, int64_t num_buckets, int64_t max_distance) {
  int64_t bucket = 0;
  if (bidirectional) {
    num_buckets /= 2;
    if (relative_position > 0) bucket += num_buckets;
    relative_position = std::llabs(relative_position);
  } else {
    relative_position = -std::min<int64_t>(relative_position, 0);
  }
  const int64_t max_exact = num_buckets / 2;
  if (relative_position < max_exact) return static_cast<int32_t>(bucket + relative_position);
  const auto log_ratio = static_cast<float>(
      std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)));  // math.log, then to f32
  const float scaled = static_cast<float>(relative_position) / static_cast<float>(max_exact);
  const float fraction = std::log(scaled) / log_ratio;
  const float large = fraction * static_cast<float>(num_buckets - max_exact);
  const int64_t if_large = std::min<int64_t>(max_exact + static_cast<int64_t>(large), num_buckets - 1);
  return static_cast<int32_t>(bucket + if_large);
}

void t5_relative_buckets(int32_t* bucket, int64_t Tq, int64_t Tk, bool bidirectional, int64_t num_buckets,
                         int64_t max_distance) {
  if (num_buckets < 4 || (bidirectional && num_buckets % 2 != 0))
    throw Error("t5_relative_buckets: num_buckets = " + std::to_string(num_buckets) +
                " (needs >= 4, even when bidirectional)");
  const int64_t max_exact = (bidirectional ? num_buckets / 2 : num_buckets) / 2;
  if (max_distance <= max_exact)
    throw Error("t5_relative_buckets: max_distance = " + std::to_string(max_distance) + " must exceed " +
                std::to_string(max_exact) + " (num_buckets / 4 or / 2)");
  if (Tq <= 0 || Tk <= 0) return;
  // The bucket depends on j - i only: each of the Tq + Tk - 1 differences once, by_diff[d + Tq - 1].
  std::vector<int32_t> by_diff(static_cast<size_t>(Tq + Tk - 1));
  for (int64_t d = -(Tq - 1); d < Tk; ++d)
    by_diff[static_cast<size_t>(d + Tq - 1)] = t5_relative_bucket(d, bidirectional, num_buckets, max_distance);
  for (int64_t i = 0; i < Tq; ++i)  // row i holds differences -i .. Tk - 1 - i
    std::copy_n(by_diff.begin() + (Tq - 1 - i), Tk, bucket + i * Tk);
}

}  // namespace fsdp
