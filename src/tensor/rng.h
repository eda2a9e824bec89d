#pragma once
// Counter-based randomness (Philox4x32-10): value i of a stream depends only on (key, stream, i),
// never on call order, thread or rank. That is what lets each FSDP rank initialise only its own
// slice of a parameter and still get exactly the values a full init would give, and what makes
// dropout masks independent of the world size.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace fsdp {

uint64_t hash_name(std::string_view name);  // FNV-1a 64

class CounterRng {
 public:
  CounterRng(uint64_t key, uint64_t stream) : key_(key), stream_(stream) {}
  std::array<uint32_t, 4> block(uint64_t counter) const;
  float uniform(uint64_t counter) const;  // [0, 1), 24 random bits
  float normal(uint64_t counter) const;   // N(0, 1), Box-Muller on one block
  uint64_t bits64(uint64_t counter) const;

 private:
  uint64_t key_;
  uint64_t stream_;
};

// Parameter initialisation: out[i] is element (offset + i) of the tensor named `name`.
void init_uniform(float* out, size_t count, size_t offset, uint64_t seed, std::string_view name, float low, float high);
void init_normal(float* out, size_t count, size_t offset, uint64_t seed, std::string_view name, float mean, float std);

}  // namespace fsdp
