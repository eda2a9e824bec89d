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
// On the GPU, high and medium round the operands themselves into packed copies (TF32 values in
// f32, or bf16) and run cuBLAS on those: given raw f32 operands, cuBLAS 13.1 on an H200 chose TF32
// kernels for CUBLAS_COMPUTE_32F_FAST_16BF (sm90_xmma_gemm_f32f32_tf32f32_*: TF32, at half bf16's
// rate), and FAST_TF32's own conversion differed from rounding to nearest by 1.3e-3 relative in
// test_gpu (2026-11-27). On rounded operands any conversion is exact.
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

// What a GEMM operand is rounded to: f32 (not rounded), TF32 or bf16.
constexpr std::string_view rounded_operand_name(MatmulPrecision p) {
  return p == MatmulPrecision::medium ? "bf16" : p == MatmulPrecision::high ? "TF32" : "f32";
}

// Bytes of one rounded operand element on the GPU: 2 (bf16) at medium, 4 (TF32 in f32) at high.
// Which copies a GEMM kernel makes and how long each lives: tensor/gemm_steps.h.
constexpr int64_t rounded_operand_element_bytes(MatmulPrecision p) {
  return p == MatmulPrecision::medium ? 2 : p == MatmulPrecision::high ? 4 : 0;
}

}  // namespace fsdp
