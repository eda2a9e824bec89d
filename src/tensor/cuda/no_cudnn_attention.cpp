// FusedAttention in a GPU build configured without the cuDNN frontend (fused_attention.h).
#include "tensor/cuda/fused_attention.h"
#include "tensor/error.h"

namespace fsdp::cuda {

struct FusedAttention::Impl {};

FusedAttention::FusedAttention(cudaStream_t) {}
FusedAttention::~FusedAttention() = default;

std::string FusedAttention::unavailable() {
  return "this GPU build has no fused attention: configure it with "
         "-Dcudnn_frontend_include=$(bash jobs/cudnn-frontend.sh) (cuDNN's frontend headers)";
}
int64_t FusedAttention::workspace_bytes(const FusedAttentionShape&, bool) { throw Error(unavailable()); }
void FusedAttention::forward(const FusedAttentionShape&, const uint16_t*, uint16_t*, float*, void*) {
  throw Error(unavailable());
}
void FusedAttention::backward(const FusedAttentionShape&, const uint16_t*, const uint16_t*, const uint16_t*,
                              const float*, uint16_t*, void*) {
  throw Error(unavailable());
}

}  // namespace fsdp::cuda
