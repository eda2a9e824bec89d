#pragma once
// How f32 GEMMs treat their operands (train.matmul_precision): the three levels of
// torch.set_float32_matmul_precision, as its documentation defines them.
//   highest  f32 operands, f32 accumulation (cuBLAS without TF32): the default.
//   high     each operand rounded to TF32 (10 mantissa bits), f32 accumulation: tensor cores
//            (cuBLAS CUBLAS_COMPUTE_32F_FAST_TF32).
//   medium   each operand rounded to bf16 (7 mantissa bits), f32 accumulation: bf16 tensor cores
//            (CUBLAS_COMPUTE_32F_FAST_16BF): on an H100/H200 about 15x the plain f32 rate by the
//            datasheet (dense bf16 ~990 TFLOP/s against ~67 f32).
// The CPU rounds the operands the same way (nearest, ties to even) and runs sgemm on them: a
// product of two bf16 or TF32 values is exact in f32, so the CPU and the GPU agree to summation
// order at every level, and a run checks against the other. (PyTorch itself runs TF32 for both
// 'high' and 'medium' on CUDA, and ignores the setting on most CPUs.)
#include <cstdint>
#include <string_view>

namespace fsdp {

enum class MatmulPrecision : uint8_t { highest, high, medium };

constexpr std::string_view matmul_precision_name(MatmulPrecision p) {
  switch (p) {
    case MatmulPrecision::highest: return "highest";
    case MatmulPrecision::high: return "high";
    case MatmulPrecision::medium: return "medium";
  }
  return "?";
}

}  // namespace fsdp
