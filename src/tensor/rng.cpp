#include "tensor/rng.h"

#include "tensor/kernel_math.h"

#include <cmath>

namespace fsdp {

uint64_t hash_name(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::array<uint32_t, 4> CounterRng::block(uint64_t counter) const {
  // The one Philox of host and device (kernel_math.h): dropout masks are bitwise the same on both.
  const kmath::Philox4 b = kmath::philox_block(key_, stream_, counter);
  return {b.v[0], b.v[1], b.v[2], b.v[3]};
}

float CounterRng::uniform(uint64_t counter) const {
  return static_cast<float>(block(counter)[0] >> 8) * (1.0f / 16777216.0f);
}

uint64_t CounterRng::bits64(uint64_t counter) const {
  auto b = block(counter);
  return (static_cast<uint64_t>(b[1]) << 32) | b[0];
}

float CounterRng::normal(uint64_t counter) const {
  auto b = block(counter);
  // u1 in (0, 1] so the log is finite; u2 in [0, 1).
  double u1 = (static_cast<double>(b[0]) + 1.0) * (1.0 / 4294967296.0);
  double u2 = static_cast<double>(b[1]) * (1.0 / 4294967296.0);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

void init_uniform(float* out, size_t count, size_t offset, uint64_t seed, std::string_view name, float low,
                  float high) {
  CounterRng rng(seed, hash_name(name));
  float span = high - low;
  for (size_t i = 0; i < count; ++i) out[i] = low + span * rng.uniform(offset + i);
}

void init_normal(float* out, size_t count, size_t offset, uint64_t seed, std::string_view name, float mean, float std) {
  CounterRng rng(seed, hash_name(name));
  for (size_t i = 0; i < count; ++i) out[i] = mean + std * rng.normal(offset + i);
}

}  // namespace fsdp
