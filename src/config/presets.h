#pragma once
// Hugging Face hub presets of the model families (model.preset). Internal to config/.
#include <cstdint>

namespace fsdp::config_internal {

// HF hub presets for model.kind t5 (each config.json: vocab_size 32128, 32 buckets, max
// distance 128): t5-small 60,506,624 parameters, t5-base 222,903,552, t5-large 737,668,096.
struct T5Preset {
  const char* name;
  int64_t d_model, d_kv, d_ff, layers, heads;
  bool v1_1;  // gated-gelu, untied lm_head
};
constexpr T5Preset kT5Presets[] = {
    {"t5-small", 512, 64, 2048, 6, 8, false},
    {"t5-base", 768, 64, 3072, 12, 12, false},
    {"t5-large", 1024, 64, 4096, 24, 16, false},
    {"t5-3b", 1024, 128, 16384, 24, 32, false},
    {"t5-11b", 1024, 128, 65536, 24, 128, false},
    {"google/t5-v1_1-small", 512, 64, 1024, 8, 6, true},
    {"google/t5-v1_1-base", 768, 64, 2048, 12, 12, true},
    {"google/t5-v1_1-large", 1024, 64, 2816, 24, 16, true},
    {"google/t5-v1_1-xl", 2048, 64, 5120, 24, 32, true},
    {"google/t5-v1_1-xxl", 4096, 64, 10240, 24, 64, true},
};

}  // namespace fsdp::config_internal
