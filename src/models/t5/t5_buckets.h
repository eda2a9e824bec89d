#pragma once
// T5's relative position buckets (host side): the bucket table that relative_bias_forward
// (kernels.h) looks the per-head bias up with. Computed once per (Tq, Tk) on the host.
#include <cstdint>

namespace fsdp {

// bucket (Tq, Tk) = HF transformers 4.36 T5Attention._relative_position_bucket of
// relative_position = j - i (key position minus query position), bit for bit: the log branch in
// f32 as torch evaluates it (t5_buckets.cpp). bidirectional: the encoder (half the buckets for
// keys after the query); otherwise the decoder (keys after the query share bucket 0).
// num_buckets >= 4 (even when bidirectional), max_distance > num_buckets / 4 (HF's max_exact).
void t5_relative_buckets(int32_t* bucket, int64_t Tq, int64_t Tk, bool bidirectional, int64_t num_buckets,
                         int64_t max_distance);

// One bucket of the table above, for relative_position = j - i.
int32_t t5_relative_bucket(int64_t relative_position, bool bidirectional, int64_t num_buckets, int64_t max_distance);

}  // namespace fsdp
