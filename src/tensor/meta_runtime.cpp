#include "tensor/meta_runtime.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <string>

#include "tensor/kernels.h"

namespace fsdp {

namespace {

// Every kernel a no-op; host values are zeros (a finite, zero loss and gradient norm). A planned
// device's GEMMs at matmul_precision high or medium charge the rounded operand copies the CUDA
// kernels hold while each runs (matmul_precision.h), so the plan's peak is the run's.
class MetaKernels final : public Kernels {
 public:
  MetaKernels(Device device, MemoryTracker& tracker) : device_(device), tracker_(tracker) {}
  Device device() const override { return device_; }
  int64_t causal_row_block(int64_t T) const override { return device_ == Device::cpu ? host_causal_row_block(T) : T; }
  void gemm(bool, bool, int64_t M, int64_t N, int64_t K, float, const float*, int64_t, const float*, int64_t, float,
            float*, int64_t) override {
    charge_operands(M, N, K, 1);
  }
  void gemm_strided_batched(bool, bool, int64_t M, int64_t N, int64_t K, float, const float*, int64_t, int64_t,
                            const float*, int64_t, int64_t, float, float*, int64_t, int64_t, int64_t batch) override {
    charge_operands(M, N, K, batch);
  }
  void gemm_bf16(bool, bool, int64_t, int64_t, int64_t, float, const uint16_t*, int64_t, const uint16_t*, int64_t,
                 float, float*, int64_t) override {}
  // The GEMMs of CudaKernels::linear_forward/backward, one after the other.
  void linear_forward(float*, const float*, const float*, const float*, int64_t rows, int64_t in,
                      int64_t out) override {
    charge_operands(rows, out, in, 1);
  }
  // With dX, CudaKernels rounds dY once for both GEMMs: its copy, with X's and then with W's.
  void linear_backward(float* dX, float*, float*, const float*, const float*, const float*, int64_t rows, int64_t in,
                       int64_t out) override {
    if (!dX || rows == 0 || in == 0 || out == 0) {
      charge_operands(out, in, rows, 1);
      if (dX) charge_operands(rows, in, out, 1);
      return;
    }
    charge(rounded_operand_element_bytes(precision_) * (rows * out + std::max(rows * in, out * in)));
  }
  void im2col(const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t) override {}
  void col2im(const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t) override {}
  void conv_bias_permute(float*, const float*, const float*, int64_t, int64_t, int64_t) override {}
  void conv_grad_permute(float*, float*, const float*, int64_t, int64_t, int64_t) override {}
  void relu_forward(float*, const float*, int64_t) override {}
  void relu_backward(float*, const float*, const float*, int64_t) override {}
  void gelu_forward(float*, const float*, int64_t) override {}
  void gelu_backward(float*, const float*, const float*, int64_t) override {}
  void gelu_tanh_forward(float*, const float*, int64_t) override {}
  void gelu_tanh_backward(float*, const float*, const float*, int64_t) override {}
  void silu_forward(float*, const float*, int64_t) override {}
  void silu_backward(float*, const float*, const float*, int64_t) override {}
  void rope(float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool) override {}
  void add(float*, const float*, const float*, int64_t) override {}
  void add_inplace(float*, const float*, int64_t) override {}
  void mul(float*, const float*, const float*, int64_t) override {}
  void scale(float*, float, int64_t) override {}
  void fill(float*, float, int64_t) override {}
  void dropout_forward(float*, float*, const float*, int64_t, int64_t, float, uint64_t, uint64_t, int64_t) override {}
  void layernorm_forward(float*, float*, float*, const float*, const float*, const float*, int64_t, int64_t,
                         float) override {}
  void layernorm_backward(float*, const float*, float*, float*, const float*, const float*, const float*, const float*,
                          const float*, int64_t, int64_t) override {}
  void log_softmax_forward(float*, const float*, int64_t, int64_t) override {}
  void log_softmax_backward(float*, const float*, const float*, int64_t, int64_t) override {}
  void causal_softmax_forward(float*, CausalRows, float*, float*) override {}
  void causal_softmax_recompute(float*, CausalRows, const float*, const float*) override {}
  void causal_softmax_backward(float*, const float*, CausalRows, float) override {}
  void rmsnorm_forward(float*, float*, const float*, const float*, int64_t, int64_t, float) override {}
  void rmsnorm_backward(float*, const float*, float*, const float*, const float*, const float*, const float*, int64_t,
                        int64_t) override {}
  void attention_softmax_forward(float*, const float*, const int32_t*, bool, int64_t, int64_t, int64_t,
                                 int64_t) override {}
  void softmax_backward(float*, const float*, int64_t, int64_t) override {}
  void relative_bias_forward(float*, const float*, const int32_t*, int64_t, int64_t, int64_t) override {}
  void relative_bias_backward(float*, const float*, const int32_t*, int64_t, int64_t, int64_t, int64_t) override {}
  void maxpool2_forward(float*, int32_t*, const float*, int64_t, int64_t, int64_t) override {}
  void maxpool2_backward(float*, const float*, const int32_t*, int64_t, int64_t, int64_t) override {}
  void embedding_forward(float*, const int32_t*, const float*, const float*, int64_t, int64_t, int64_t) override {}
  void embedding_backward(float*, float*, const float*, const int32_t*, int64_t, int64_t, int64_t) override {}
  void nll_sum(const float*, const int32_t*, int64_t, int64_t, double* sum, int64_t* correct) override {
    *sum = 0.0;
    *correct = 0;
  }
  void nll_backward(float*, const int32_t*, int64_t, int64_t, float) override {}
  void cross_entropy_backward(float*, const float*, const int32_t*, int64_t, int64_t, float) override {}
  void adamw_step(float*, const float*, float*, float*, int64_t, const AdamWArgs&) override {}
  void sgd_step(float*, const float*, float*, int64_t, const SgdArgs&) override {}
  void adadelta_step(float*, const float*, float*, float*, int64_t, const AdadeltaArgs&) override {}
  void cast(void*, DType, const void*, DType, int64_t) override {}
  double sum_squares(const float*, int64_t) override { return 0.0; }
  bool all_finite(const float*, int64_t) override { return true; }
  // Fused attention is the GPU's (cuDNN). Its workspace is cuDNN's to choose at run time; the plan
  // takes the forward's as none and the backward's as an f32 dQ accumulator and a row sum,
  // B*H*T*(hd + 1) floats (what its deterministic flash backward keeps; test_gpu prints the real
  // sizes on a device).
  std::string fused_attention_unavailable() override {
    return device_ == Device::cpu ? Kernels::fused_attention_unavailable() : std::string();
  }
  int64_t fused_attention_workspace_bytes(const FusedAttentionShape& s, bool backward) override {
    if (device_ == Device::cpu) return Kernels::fused_attention_workspace_bytes(s, backward);
    return backward ? s.B * s.H * s.T * (s.hd + 1) * static_cast<int64_t>(sizeof(float)) : 0;
  }
  void fused_attention_forward(const FusedAttentionShape&, const uint16_t*, uint16_t*, float*, void*) override {}
  void fused_attention_backward(const FusedAttentionShape&, const uint16_t*, const uint16_t*, const uint16_t*,
                                const float*, uint16_t*, void*) override {}

 private:
  void charge_operands(int64_t M, int64_t N, int64_t K, int64_t batch) {
    if (M == 0 || N == 0 || batch == 0) return;
    charge(rounded_operand_bytes(precision_, M, N, K, batch));
  }
  // Bytes held for the length of one call (a planned GPU's rounded operands; none on a CPU).
  void charge(int64_t bytes) {
    if (device_ == Device::cpu || bytes == 0) return;
    tracker_.on_alloc(MemCategory::activations, static_cast<size_t>(bytes), MemSpace::device);
    tracker_.on_free(MemCategory::activations, static_cast<size_t>(bytes), MemSpace::device);
  }

  Device device_;
  MemoryTracker& tracker_;
};

size_t page_rounded(size_t bytes) {
  constexpr size_t kPage = 4096;
  return std::max<size_t>(kPage, (bytes + kPage - 1) / kPage * kPage);
}

// Address space, zero-filled by the kernel on first read, committed only where written.
void* reserve(size_t bytes) {
  void* p =
      mmap(nullptr, page_rounded(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return p;
}

void release(void* p, size_t bytes) { munmap(p, page_rounded(bytes)); }

class MetaRuntime final : public DeviceRuntime {
 public:
  MetaRuntime(Device planned, MemoryTracker& tracker)
      : device_(planned), tracker_(tracker), kernels_(planned, tracker) {}
  Device device() const override { return device_; }
  std::string describe() const override { return "meta (" + std::string(device_name(device_)) + ", plan only)"; }
  MemoryTracker& tracker() override { return tracker_; }
  bool holds_values() const override { return false; }
  // Charged as the runtime it stands in for charges: a planned device's memory, or the host's.
  MemSpace space() const { return device_ == Device::cpu ? MemSpace::host : MemSpace::device; }
  void* allocate(size_t bytes, MemCategory category, Stream) override {
    void* p = reserve(bytes);
    tracker_.on_alloc(category, bytes, space());
    return p;
  }
  void deallocate(void* ptr, size_t bytes, MemCategory category, Stream) override {
    tracker_.on_free(category, bytes, space());
    release(ptr, bytes);
  }
  // Pinned staging is untracked in every runtime; here it is address space like the rest.
  void* allocate_pinned(size_t bytes) override {
    void* p = reserve(bytes + sizeof(size_t));
    *static_cast<size_t*>(p) = bytes;  // the size munmap needs, in the first (touched) page
    return static_cast<char*>(p) + sizeof(size_t);
  }
  void free_pinned(void* ptr) override {
    char* base = static_cast<char*>(ptr) - sizeof(size_t);
    release(base, *reinterpret_cast<size_t*>(base) + sizeof(size_t));
  }
  bool is_device_pointer(const void*) const override { return false; }  // never asked: no device_comm in a plan
  void copy_async(void* dst, const void*, size_t bytes, CopyKind kind, Stream) override {
    // Host reads of device values see zeros. Reading an untouched page maps the zero page, so
    // a large staging buffer that is already zero stays uncommitted.
    if (kind != CopyKind::device_to_host || bytes == 0) return;
    const auto* d = static_cast<const unsigned char*>(dst);
    if (std::any_of(d, d + bytes, [](unsigned char b) { return b != 0; })) std::memset(dst, 0, bytes);
  }
  void memset_async(void*, int, size_t, Stream) override {}
  Stream compute_stream() override { return {}; }
  Stream comm_stream() override { return {}; }
  std::unique_ptr<Event> record(Stream) override { return std::make_unique<DoneEvent>(); }
  void wait(Stream, const Event&) override {}
  void synchronize(const Event&, double) override {}
  void synchronize(Stream) override {}
  Kernels& kernels() override { return kernels_; }

 private:
  Device device_;
  MemoryTracker& tracker_;
  MetaKernels kernels_;
};

}  // namespace

std::unique_ptr<DeviceRuntime> make_meta_runtime(Device planned, MemoryTracker& tracker) {
  return std::make_unique<MetaRuntime>(planned, tracker);
}

}  // namespace fsdp
