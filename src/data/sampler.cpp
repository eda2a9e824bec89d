// The global-batch sampler. Step s of epoch e holds the same global indices whatever the world
// size, so a run on 1 rank and on 8 ranks sees the same data and the same mean loss.
#include <algorithm>
#include <numeric>
#include <string>

#include "data/data.h"
#include "tensor/error.h"
#include "tensor/rng.h"

namespace fsdp {

namespace {

// Fisher-Yates from the last position down; swap partner j of position i is drawn with counter i,
// so the permutation depends only on (seed, epoch). Lemire's multiply-shift maps 64 random bits
// to [0, i] without the bias of a modulo.
std::vector<int64_t> epoch_permutation(int64_t count, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(count));
  std::iota(order.begin(), order.end(), int64_t{0});
  CounterRng rng(seed, hash_name("epoch/" + std::to_string(epoch)));
  for (int64_t i = count - 1; i > 0; --i) {
    const auto bound = static_cast<unsigned __int128>(i) + 1;
    auto j = static_cast<int64_t>((rng.bits64(static_cast<uint64_t>(i)) * bound) >> 64);
    std::swap(order[i], order[j]);
  }
  return order;
}

}  // namespace

Sampler::Sampler(const SamplerOptions& options) : options_(options) {
  const int64_t size = options.dataset_size, batch = options.global_batch;
  if (batch <= 0) throw Error("sampler: global batch must be positive, got " + std::to_string(batch));
  if (size <= 0) throw Error("sampler: dataset is empty (" + std::to_string(size) + " samples)");
  if (options.drop_last && batch > size)
    throw Error("sampler: batch of " + std::to_string(batch) + " is larger than the dataset of " +
                std::to_string(size) + " samples");
}

int64_t Sampler::steps_per_epoch() const {
  const int64_t size = options_.dataset_size, batch = options_.global_batch;
  return options_.drop_last ? size / batch : (size + batch - 1) / batch;
}

std::vector<int64_t> Sampler::global_batch(int64_t epoch, int64_t step) const {
  const int64_t steps = steps_per_epoch();
  if (epoch < 0) throw Error("sampler: epoch " + std::to_string(epoch) + " is negative");
  if (step < 0 || step >= steps)
    throw Error("sampler: step " + std::to_string(step) + " is out of range [0, " + std::to_string(steps) + ")");
  const int64_t begin = step * options_.global_batch;
  const int64_t end = std::min(begin + options_.global_batch, options_.dataset_size);
  std::vector<int64_t> indices(static_cast<size_t>(end - begin));
  if (!options_.shuffle) {
    std::iota(indices.begin(), indices.end(), begin);
    return indices;
  }
  if (cached_epoch_ != epoch) {
    cached_order_ = epoch_permutation(options_.dataset_size, options_.seed, epoch);
    cached_epoch_ = epoch;
  }
  std::copy(cached_order_.begin() + begin, cached_order_.begin() + end, indices.begin());
  return indices;
}

std::pair<int64_t, int64_t> Sampler::rank_slice(int64_t n, int rank, int ranks) {
  if (ranks <= 0 || rank < 0 || rank >= ranks || n < 0)
    throw Error("sampler: rank_slice(n=" + std::to_string(n) + ", rank=" + std::to_string(rank) +
                ", ranks=" + std::to_string(ranks) + ") needs n >= 0 and 0 <= rank < ranks");
  const int64_t base = n / ranks, extra = n % ranks;
  return {rank * base + std::min<int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}

}  // namespace fsdp
