#pragma once
// Fused causal attention on the GPU (Kernels::fused_attention_*, FusedAttentionShape): cuDNN's
// scaled-dot-product attention, forward and backward, through NVIDIA's header-only cuDNN frontend.
// Meson compiles one of two files: cudnn_attention.cpp when -Dcudnn_frontend_include names the
// frontend's headers (jobs/cudnn-frontend.sh fetches them; jobs/gpu-bundle.sh passes them), else
// no_cudnn_attention.cpp, whose unavailable() says how to get it. libcudnn.so.9 is loaded when
// fused attention first runs, not linked: a binary without cuDNN on its machine runs every other
// path and says in one line why fused attention cannot.
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "tensor/kernels.h"

namespace fsdp::cuda {

class FusedAttention {
 public:
  explicit FusedAttention(cudaStream_t stream);
  ~FusedAttention();
  FusedAttention(const FusedAttention&) = delete;
  FusedAttention& operator=(const FusedAttention&) = delete;

  // "" when usable here, else one line: why not (this build, or no libcudnn on this machine).
  std::string unavailable();
  int64_t workspace_bytes(const FusedAttentionShape& s, bool backward);
  void forward(const FusedAttentionShape& s, const uint16_t* qkv, uint16_t* o, float* stats, void* workspace);
  void backward(const FusedAttentionShape& s, const uint16_t* qkv, const uint16_t* o, const uint16_t* dO,
                const float* stats, uint16_t* dqkv, void* workspace);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp::cuda
