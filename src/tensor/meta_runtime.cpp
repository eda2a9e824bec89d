#include "tensor/meta_runtime.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <string>

#include "tensor/gemm_steps.h"
#include "tensor/kernels.h"
#include "tensor/timeline.h"

namespace fsdp {

namespace {

// Every kernel a no-op; host values are zeros (a finite, zero loss and gradient norm). A planned
// device's GEMMs at matmul_precision high or medium charge the rounded operand copies the CUDA
// kernels hold while each runs: both run gemm_steps.h, so the plan's peak is the run's.
class MetaKernels final : public Kernels {
 public:
  MetaKernels(Device device, MemoryTracker& tracker) : device_(device), tracker_(tracker) {}
  Device device() const override { return device_; }
  int64_t causal_row_block(int64_t T) const override { return device_ == Device::cpu ? host_causal_row_block(T) : T; }
  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
            const float* B, int64_t ldb, float beta, float* C, int64_t ldc) override {
    const GemmCall c{trans_a, trans_b, M, N, K, alpha, beta, C, ldc, 0, 1};
    Steps steps{*this};
    gemm_steps(steps, c, gemm_a(c, A, lda, 0), gemm_b(c, B, ldb, 0));
  }
  void gemm_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                            int64_t lda, int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b, float beta,
                            float* C, int64_t ldc, int64_t stride_c, int64_t batch) override {
    const GemmCall c{trans_a, trans_b, M, N, K, alpha, beta, C, ldc, stride_c, batch};
    Steps steps{*this};
    gemm_steps(steps, c, gemm_a(c, A, lda, stride_a), gemm_b(c, B, ldb, stride_b));
  }
  void gemm_bf16(bool, bool, int64_t M, int64_t N, int64_t K, float, const uint16_t*, int64_t, const uint16_t*, int64_t,
                 float, float*, int64_t) override {
    time_gemm(M, N, K, 1, true);
  }
  void linear_forward(float* Y, const float* X, const float* W, const float* b, int64_t rows, int64_t in,
                      int64_t out) override {
    Steps steps{*this};
    linear_forward_steps(steps, Y, X, W, b, rows, in, out);
  }
  void linear_backward(float* dX, float* dW, float* db, const float* dY, const float* X, const float* W, int64_t rows,
                       int64_t in, int64_t out) override {
    Steps steps{*this};
    linear_backward_steps(steps, dX, dW, db, dY, X, nullptr, W, rows, in, out);
  }
  void linear_backward_bf16_x(float* dX, float* dW, float* db, const float* dY, const uint16_t* X, const float* W,
                              int64_t rows, int64_t in, int64_t out) override {
    require_medium_for_bf16_x();
    Steps steps{*this};
    linear_backward_steps(steps, dX, dW, db, dY, nullptr, X, W, rows, in, out);
  }
  void im2col(const float*, float*, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K, int64_t, int64_t,
              int64_t) override {
    floats(2 * B * C * H * W * K * K);
  }
  void col2im(const float*, float*, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K, int64_t, int64_t,
              int64_t) override {
    floats(2 * B * C * H * W * K * K);
  }
  void conv_bias_permute(float*, const float*, const float*, int64_t B, int64_t out, int64_t P) override {
    floats(2 * B * out * P);
  }
  void conv_grad_permute(float*, float*, const float*, int64_t B, int64_t out, int64_t P) override {
    floats(2 * B * out * P);
  }
  void relu_forward(float*, const float*, int64_t n) override { floats(2 * n); }
  void relu_backward(float*, const float*, const float*, int64_t n) override { floats(3 * n); }
  void gelu_forward(float*, const float*, int64_t n) override { floats(2 * n); }
  void gelu_backward(float*, const float*, const float*, int64_t n) override { floats(3 * n); }
  void gelu_tanh_forward(float*, const float*, int64_t n) override { floats(2 * n); }
  void gelu_tanh_backward(float*, const float*, const float*, int64_t n) override { floats(3 * n); }
  void silu_forward(float*, const float*, int64_t n) override { floats(2 * n); }
  void silu_backward(float*, const float*, const float*, int64_t n) override { floats(3 * n); }
  void rope(float*, const float*, const float*, int64_t rows, int64_t, int64_t heads, int64_t D, int64_t, int64_t,
            bool) override {
    floats(2 * rows * heads * D);  // rows already count every position
  }
  void add(float*, const float*, const float*, int64_t n) override { floats(3 * n); }
  void add_inplace(float*, const float*, int64_t n) override { floats(3 * n); }
  void mul(float*, const float*, const float*, int64_t n) override { floats(3 * n); }
  void scale(float*, float, int64_t n) override { floats(2 * n); }
  void fill(float*, float, int64_t n) override { floats(n); }
  void dropout_forward(float*, uint8_t*, const float*, int64_t B, int64_t per_sample, float, uint64_t, uint64_t,
                       int64_t) override {  // x read, y written, a byte of mask written
    if (timeline_) timeline_->dropout(9.0 * static_cast<double>(B * per_sample), static_cast<double>(B * per_sample));
  }
  void dropout_backward(float*, const float*, const uint8_t*, float, int64_t n) override {
    bytes(9.0 * static_cast<double>(n));
  }
  void layernorm_forward(float*, float*, float*, const float*, const float*, const float*, int64_t rows, int64_t C,
                         float) override {
    floats(2 * rows * C);
  }
  void add_layernorm_forward(float*, float*, float*, float*, const float*, const float*, const float*, const float*,
                             int64_t rows, int64_t C, float, DType) override {
    floats(4 * rows * C);  // x and the residual read, the sum and y written
  }
  void add_rmsnorm_forward(float*, float*, float*, const float*, const float*, const float*, int64_t rows, int64_t C,
                           float, DType) override {
    floats(4 * rows * C);
  }
  void layernorm_backward(float*, const float*, float*, float*, const float*, const float*, const float*, const float*,
                          const float*, int64_t rows, int64_t C) override {
    floats(3 * rows * C);
  }
  void log_softmax_forward(float*, const float*, int64_t rows, int64_t C) override { floats(2 * rows * C); }
  void log_softmax_backward(float*, const float*, const float*, int64_t rows, int64_t C) override {
    floats(3 * rows * C);
  }
  void causal_softmax_forward(float*, CausalRows g, float*, float*) override { floats(g.planes * g.rows * g.T); }
  void causal_softmax_recompute(float*, CausalRows g, const float*, const float*) override {
    floats(g.planes * g.rows * g.T);
  }
  void causal_softmax_backward(float*, const float*, CausalRows g, float) override {
    floats(2 * g.planes * g.rows * g.T);
  }
  void causal_softmax_flash(float*, CausalRows g, float*, float*, DType) override { floats(g.planes * g.rows * g.T); }
  void attention_rescale(float*, const float*, int64_t B, int64_t T, int64_t H, int64_t hd, int64_t, DType) override {
    floats(2 * B * T * H * hd);
  }
  void causal_softmax_normalize(float*, CausalRows g, const float*, DType) override {
    floats(2 * g.planes * g.rows * g.T);
  }
  void rmsnorm_forward(float*, float*, const float*, const float*, int64_t rows, int64_t C, float) override {
    floats(2 * rows * C);
  }
  void rmsnorm_backward(float*, const float*, float*, const float*, const float*, const float*, const float*,
                        int64_t rows, int64_t C) override {
    floats(3 * rows * C);
  }
  void attention_softmax_forward(float*, const float*, const int32_t*, bool, int64_t B, int64_t H, int64_t Tq,
                                 int64_t Tk) override {
    floats(2 * B * H * Tq * Tk);
  }
  void softmax_backward(float*, const float*, int64_t rows, int64_t Tk) override { floats(3 * rows * Tk); }
  void relative_bias_forward(float*, const float*, const int32_t*, int64_t H, int64_t Tq, int64_t Tk) override {
    floats(H * Tq * Tk);
  }
  void relative_bias_backward(float*, const float*, const int32_t*, int64_t B, int64_t H, int64_t Tq,
                              int64_t Tk) override {
    floats(B * H * Tq * Tk);
  }
  void maxpool2_forward(float*, int32_t*, const float*, int64_t planes, int64_t H, int64_t W) override {
    floats(2 * planes * H * W);
  }
  void maxpool2_backward(float*, const float*, const int32_t*, int64_t planes, int64_t H, int64_t W) override {
    floats(2 * planes * H * W);
  }
  void embedding_forward(float*, const int32_t*, const float*, const float*, int64_t B, int64_t T, int64_t C) override {
    floats(2 * B * T * C);
  }
  void embedding_backward(float*, float*, const float*, const int32_t*, int64_t B, int64_t T, int64_t C) override {
    floats(2 * B * T * C);
  }
  void nll_sum(const float*, const int32_t*, int64_t rows, int64_t C, double* sum, int64_t* correct) override {
    floats(rows * C);
    *sum = 0.0;
    *correct = 0;
  }
  void nll_backward(float*, const int32_t*, int64_t rows, int64_t C, float) override { floats(rows * C); }
  void cross_entropy_backward(float*, const float*, const int32_t*, int64_t rows, int64_t C, float) override {
    floats(2 * rows * C);
  }
  void cross_entropy_sum(const float*, const int32_t*, int64_t rows, int64_t C, float*, double* sum,
                         int64_t* correct) override {
    floats(3 * rows * C);  // the row's max, its sum of exponentials, the argmax
    *sum = 0.0;
    *correct = 0;
  }
  void cross_entropy_backward_logits(float*, const float*, const float*, const int32_t*, int64_t rows, int64_t C,
                                     float) override {
    floats(2 * rows * C);
  }
  void adamw_step(float*, const float*, float*, float*, int64_t n, const AdamWArgs&) override { floats(7 * n); }
  void sgd_step(float*, const float*, float*, int64_t n, const SgdArgs&) override { floats(5 * n); }
  void adadelta_step(float*, const float*, float*, float*, int64_t n, const AdadeltaArgs&) override { floats(7 * n); }
  void round_to(float*, DType dtype, int64_t n) override {
    if (dtype != DType::f32) floats(2 * n);
  }
  void cast(void*, DType dst, const void*, DType src, int64_t n) override {
    bytes(static_cast<double>(n) * static_cast<double>(dtype_bytes(dst) + dtype_bytes(src)));
  }
  double sum_squares(const float*, int64_t n) override {
    floats(n);
    return 0.0;
  }
  bool all_finite(const float*, int64_t n) override {
    floats(n);
    return true;
  }
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
  // Causal flash attention: QK^T and PV over half the (T, T) square, bf16 operands; the backward's
  // five GEMMs to the forward's two (recomputing P), 2.5x its FLOPs.
  void fused_attention_forward(const FusedAttentionShape& sh, const uint16_t*, uint16_t*, float*, void*) override {
    time_attention(sh, 1.0);
  }
  void fused_attention_backward(const FusedAttentionShape& sh, const uint16_t*, const uint16_t*, const uint16_t*,
                                const float*, uint16_t*, void*) override {
    time_attention(sh, 2.5);
  }
  void set_timeline(Timeline* timeline) { timeline_ = timeline; }

 private:
  // gemm_steps.h's executor for a plan: a rounded copy is its bytes, charged to the planned
  // device's activations while it lives (none on a CPU, whose copies are host scratch); a GEMM is
  // its time. Where cuBLASLt would fuse the bias, the plan times the GEMM and a bias pass.
  struct Steps {
    class Copy {
     public:
      Copy(MetaKernels& k, int64_t bytes) : k_(k), bytes_(k.device_ == Device::cpu ? 0 : bytes) {
        if (bytes_ > 0) k_.tracker_.on_alloc(MemCategory::activations, static_cast<size_t>(bytes_), MemSpace::device);
      }
      ~Copy() {
        if (bytes_ > 0) k_.tracker_.on_free(MemCategory::activations, static_cast<size_t>(bytes_), MemSpace::device);
      }
      Copy(const Copy&) = delete;
      Copy& operator=(const Copy&) = delete;
      const void* get() const { return nullptr; }

     private:
      MetaKernels& k_;
      int64_t bytes_;
    };
    MatmulPrecision precision() const { return k.precision_; }
    // The rounding is a pass over the operand too: f32 read, the copy written.
    Copy round(const GemmOperand& o, int64_t batch) const {
      const int64_t n = batch * o.rows * o.cols, element_bytes = rounded_operand_element_bytes(k.precision_);
      k.bytes(static_cast<double>(n * (4 + element_bytes)));
      return Copy(k, element_bytes * n);
    }
    void gemm(const GemmCall& c, const GemmOperand&, const GemmOperand&) const {
      k.time_gemm(c.M, c.N, c.K, c.batch, false);
    }
    void gemm_on(const GemmCall& c, const GemmOperand&, const void*, const GemmOperand&, const void*) const {
      k.time_gemm(c.M, c.N, c.K, c.batch, false);
    }
    bool bias_epilogue(const GemmCall& c, const GemmOperand&, const void*, const GemmOperand&, const void*,
                       const float*) const {
      k.time_gemm(c.M, c.N, c.K, c.batch, false);
      k.floats(c.M * c.N);
      return true;
    }
    void bias_rows(float*, const float*, int64_t rows, int64_t cols) const { k.floats(rows * cols); }
    void col_sum_add(float*, const float*, int64_t rows, int64_t cols) const { k.floats(rows * cols); }
    MetaKernels& k;
  };

  // The timed plan's costs (tensor/timeline.h): FLOPs and bytes of each call at its shapes.
  void time_gemm(int64_t M, int64_t N, int64_t K, int64_t batch, bool bf16) {
    if (!timeline_) return;
    const double m = static_cast<double>(M), n = static_cast<double>(N), k = static_cast<double>(K);
    const double b = static_cast<double>(batch), elem = bf16 ? 2.0 : 4.0;
    timeline_->gemm(2.0 * m * n * k * b, b * (elem * (m * k + k * n) + 4.0 * m * n), std::min({m, n, k}), precision_,
                    bf16);
  }
  void time_attention(const FusedAttentionShape& sh, double factor) {
    if (!timeline_) return;
    const double bh = static_cast<double>(sh.B * sh.H), t = static_cast<double>(sh.T), hd = static_cast<double>(sh.hd);
    timeline_->gemm(factor * 2.0 * bh * t * t * hd, factor * bh * t * hd * 2.0 * 5.0, std::min(t, hd), precision_,
                    true);
  }
  void floats(int64_t n) { bytes(4.0 * static_cast<double>(n)); }
  void bytes(double b) {
    if (timeline_) timeline_->memory_bound(b);
  }

  Device device_;
  MemoryTracker& tracker_;
  Timeline* timeline_ = nullptr;
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
  MetaRuntime(Device planned, MemoryTracker& tracker, Timeline* timeline)
      : device_(planned), tracker_(tracker), kernels_(planned, tracker), timeline_(timeline) {
    kernels_.set_timeline(timeline);
  }
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
  void copy_async(void* dst, const void*, size_t bytes, CopyKind kind, Stream stream) override {
    if (timeline_)
      timeline_->copy_on(lane(stream), static_cast<double>(bytes),
                         kind == CopyKind::host_to_device || kind == CopyKind::device_to_host);
    // Host reads of device values see zeros. Reading an untouched page maps the zero page, so
    // a large staging buffer that is already zero stays uncommitted.
    if (kind != CopyKind::device_to_host || bytes == 0) return;
    const auto* d = static_cast<const unsigned char*>(dst);
    if (std::any_of(d, d + bytes, [](unsigned char b) { return b != 0; })) std::memset(dst, 0, bytes);
  }
  void memset_async(void*, int, size_t bytes, Stream stream) override {
    if (timeline_) timeline_->copy_on(lane(stream), static_cast<double>(bytes) / 2, false);
  }
  // Without a timeline every stream is the host's (a memory plan needs no order). With one, a
  // planned GPU has its two streams, told apart by these tags; events carry their lane's time.
  Stream compute_stream() override { return {timed_device() ? timeline_->tag(Lane::compute) : nullptr}; }
  Stream comm_stream() override { return {timed_device() ? timeline_->tag(Lane::comm) : nullptr}; }
  std::unique_ptr<Event> record(Stream stream) override {
    return std::make_unique<TimedEvent>(timeline_ ? timeline_->now(lane(stream)) : 0.0);
  }
  void wait(Stream stream, const Event& event) override {
    if (const auto* e = dynamic_cast<const TimedEvent*>(&event); timeline_ && e)
      timeline_->wait_until(lane(stream), e->at_s);
  }
  void synchronize(const Event& event, double) override {
    if (const auto* e = dynamic_cast<const TimedEvent*>(&event); timeline_ && e)
      timeline_->wait_until(Lane::host, e->at_s);
  }
  void synchronize(Stream stream) override {
    if (timeline_) timeline_->wait_until(Lane::host, timeline_->now(lane(stream)));
  }
  Kernels& kernels() override { return kernels_; }

 private:
  struct TimedEvent final : DoneEvent {
    explicit TimedEvent(double t) : at_s(t) {}
    double at_s;
  };
  bool timed_device() const { return timeline_ && device_ != Device::cpu; }
  Lane lane(Stream s) const { return timeline_->lane_of(s.native); }

  Device device_;
  MemoryTracker& tracker_;
  MetaKernels kernels_;
  Timeline* timeline_;
};

}  // namespace

std::unique_ptr<DeviceRuntime> make_meta_runtime(Device planned, MemoryTracker& tracker, Timeline* timeline) {
  return std::make_unique<MetaRuntime>(planned, tracker, timeline);
}

}  // namespace fsdp
