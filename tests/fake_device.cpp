#include "fake_device.h"

#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <utility>

#include "tensor/error.h"

namespace fsdp::testing {

namespace {

constexpr size_t kRawAlign = 512;  // cudaMalloc hands out at least 256-byte aligned blocks

// The guarded range for the SIGSEGV handler. A signal handler can only reach state through a
// global; one FakeDevice at a time may guard memory (checked in the constructor).
struct GuardState {
  const char* begin = nullptr;
  const char* end = nullptr;
  struct sigaction previous {};
};
GuardState g_guard;

void write_stderr(const char* text) {
  // async-signal-safe output: write(2) only
  size_t left = std::strlen(text);
  while (left > 0) {
    ssize_t n = write(STDERR_FILENO, text, left);
    if (n <= 0) return;
    text += n;
    left -= static_cast<size_t>(n);
  }
}

void on_segv(int sig, siginfo_t* info, void* context) {
  const char* addr = static_cast<const char*>(info->si_addr);
  if (addr >= g_guard.begin && addr < g_guard.end) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "fake device: host code touched device memory (arena offset %zu) outside any stream operation: "
                  "a host read or write of a device pointer; backtrace:\n",
                  static_cast<size_t>(addr - g_guard.begin));
    write_stderr(line);
    void* frames[48];
    backtrace_symbols_fd(frames, backtrace(frames, 48), STDERR_FILENO);
    _exit(kHostTouchExit);
  }
  // Not ours: hand it to whoever was there before (a sanitizer), or die of it as usual.
  if ((g_guard.previous.sa_flags & SA_SIGINFO) && g_guard.previous.sa_sigaction) {
    g_guard.previous.sa_sigaction(sig, info, context);
    return;
  }
  signal(sig, SIG_DFL);
}

}  // namespace

// Reserved address space; pages are readable only while `open` depth > 0.
class FakeDevice::Arena {
 public:
  explicit Arena(size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw Error("fake device: cannot reserve " + std::to_string(bytes) + " bytes");
    base_ = static_cast<char*>(p);
    if (g_guard.begin) {
      munmap(base_, bytes_);
      throw Error("fake device: only one FakeDevice may exist at a time");
    }
    g_guard.begin = base_;
    g_guard.end = base_ + bytes_;
    struct sigaction sa {};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_guard.previous);
  }
  ~Arena() {
    sigaction(SIGSEGV, &g_guard.previous, nullptr);
    g_guard = GuardState{};
    munmap(base_, bytes_);
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // nullptr when the arena is full (the allocator's out-of-memory path).
  void* take(size_t bytes) {
    bytes = (bytes + kRawAlign - 1) / kRawAlign * kRawAlign;
    auto it = free_.find(bytes);
    if (it != free_.end()) {
      void* p = it->second;
      free_.erase(it);
      return p;
    }
    if (used_ + bytes > bytes_) return nullptr;
    char* p = base_ + used_;
    used_ += bytes;
    if (open_depth_ > 0) protect(PROT_READ | PROT_WRITE);
    sizes_[p] = bytes;
    return p;
  }
  void give_back(void* p) {
    auto it = sizes_.find(static_cast<char*>(p));
    if (it != sizes_.end()) free_.emplace(it->second, p);
  }
  bool contains(const void* p) const {
    const auto* c = static_cast<const char*>(p);
    return c >= base_ && c < base_ + used_;
  }
  void open() {
    if (open_depth_++ == 0) protect(PROT_READ | PROT_WRITE);
  }
  void close() {
    if (--open_depth_ == 0) protect(PROT_NONE);
  }

 private:
  void protect(int prot) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t span = (used_ + page - 1) / page * page;
    if (span > 0 && mprotect(base_, span, prot) != 0) throw Error("fake device: mprotect failed");
  }
  char* base_ = nullptr;
  size_t bytes_ = 0, used_ = 0;
  int open_depth_ = 0;
  std::map<char*, size_t> sizes_;
  std::multimap<size_t, void*> free_;
};

namespace {

class FakeEvent final : public Event {
 public:
  FakeEvent(const FakeDevice& dev, const void* stream, size_t index) : dev_(dev), stream(stream), index(index) {}
  bool done() const override { return dev_.ran(stream) >= index; }
  const FakeDevice& dev_;
  const void* stream;
  size_t index;  // done once the stream has run this many operations
};

// record_timed's event: the host's clock when the stream ran up to it (the fake's "device time").
class FakeTimedEvent final : public Event {
 public:
  FakeTimedEvent(const FakeDevice& dev, const void* stream, size_t index, std::shared_ptr<double> seconds)
      : dev_(dev), stream(stream), index(index), seconds(std::move(seconds)) {}
  bool done() const override { return dev_.ran(stream) >= index; }
  const FakeDevice& dev_;
  const void* stream;
  size_t index;
  std::shared_ptr<double> seconds;  // set by the stamping operation when it runs
};

// Every kernel is the host kernel, enqueued on the compute stream with its arguments captured by
// value; the three that return host values synchronise first, as the device kernels do.
class DeferredKernels final : public Kernels {
 public:
  explicit DeferredKernels(FakeDevice& dev) : dev_(dev) {}
  Device device() const override { return Device::cuda; }

  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
            int64_t ldb, float beta, float* C, int64_t ldc) override {
    defer(&Kernels::gemm, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void gemm_strided_batched(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                            int64_t sa, const float* B, int64_t ldb, int64_t sb, float beta, float* C, int64_t ldc,
                            int64_t sc, int64_t batch) override {
    defer(&Kernels::gemm_strided_batched, ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch);
  }
  void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
                 const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) override {
    defer(&Kernels::gemm_bf16, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void linear_forward(float* Y, const float* X, const float* W, const float* b, int64_t rows, int64_t in,
                      int64_t out) override {
    defer(&Kernels::linear_forward, Y, X, W, b, rows, in, out);
  }
  void linear_backward(float* dX, float* dW, float* db, const float* dY, const float* X, const float* W, int64_t rows,
                       int64_t in, int64_t out) override {
    defer(&Kernels::linear_backward, dX, dW, db, dY, X, W, rows, in, out);
  }
  void linear_backward_bf16_x(float* dX, float* dW, float* db, const float* dY, const uint16_t* X, const float* W,
                              int64_t rows, int64_t in, int64_t out) override {
    defer(&Kernels::linear_backward_bf16_x, dX, dW, db, dY, X, W, rows, in, out);
  }
  void im2col(const float* x, float* col, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K, int64_t pad,
              int64_t OH, int64_t OW) override {
    defer(&Kernels::im2col, x, col, B, C, H, W, K, pad, OH, OW);
  }
  void col2im(const float* dcol, float* dx, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K, int64_t pad,
              int64_t OH, int64_t OW) override {
    defer(&Kernels::col2im, dcol, dx, B, C, H, W, K, pad, OH, OW);
  }
  void conv_bias_permute(float* y, const float* ybuf, const float* bias, int64_t B, int64_t out, int64_t P) override {
    defer(&Kernels::conv_bias_permute, y, ybuf, bias, B, out, P);
  }
  void conv_grad_permute(float* dyt, float* db, const float* dy, int64_t B, int64_t out, int64_t P) override {
    defer(&Kernels::conv_grad_permute, dyt, db, dy, B, out, P);
  }
  void relu_forward(float* y, const float* x, int64_t n) override { defer(&Kernels::relu_forward, y, x, n); }
  void relu_backward(float* dx, const float* dy, const float* y, int64_t n) override {
    defer(&Kernels::relu_backward, dx, dy, y, n);
  }
  void gelu_forward(float* y, const float* x, int64_t n) override { defer(&Kernels::gelu_forward, y, x, n); }
  void gelu_backward(float* dx, const float* dy, const float* x, int64_t n) override {
    defer(&Kernels::gelu_backward, dx, dy, x, n);
  }
  void gelu_tanh_forward(float* y, const float* x, int64_t n) override { defer(&Kernels::gelu_tanh_forward, y, x, n); }
  void gelu_tanh_backward(float* dx, const float* dy, const float* x, int64_t n) override {
    defer(&Kernels::gelu_tanh_backward, dx, dy, x, n);
  }
  void silu_forward(float* y, const float* x, int64_t n) override { defer(&Kernels::silu_forward, y, x, n); }
  void silu_backward(float* dx, const float* dy, const float* x, int64_t n) override {
    defer(&Kernels::silu_backward, dx, dy, x, n);
  }
  void rope(float* x, const float* cos, const float* sin, int64_t rows, int64_t T, int64_t heads, int64_t D, int64_t ld,
            int64_t pos0, bool backward) override {
    defer(&Kernels::rope, x, cos, sin, rows, T, heads, D, ld, pos0, backward);
  }
  void add(float* y, const float* a, const float* b, int64_t n) override { defer(&Kernels::add, y, a, b, n); }
  void add_inplace(float* y, const float* x, int64_t n) override { defer(&Kernels::add_inplace, y, x, n); }
  void mul(float* y, const float* a, const float* b, int64_t n) override { defer(&Kernels::mul, y, a, b, n); }
  void scale(float* x, float factor, int64_t n) override { defer(&Kernels::scale, x, factor, n); }
  void fill(float* x, float value, int64_t n) override { defer(&Kernels::fill, x, value, n); }
  void dropout_forward(float* y, uint8_t* keep, const float* x, int64_t B, int64_t per_sample, float p, uint64_t key,
                       uint64_t stream, int64_t sample_offset) override {
    defer(&Kernels::dropout_forward, y, keep, x, B, per_sample, p, key, stream, sample_offset);
  }
  void dropout_backward(float* dx, const float* dy, const uint8_t* keep, float p, int64_t n) override {
    defer(&Kernels::dropout_backward, dx, dy, keep, p, n);
  }
  void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w, const float* b,
                         int64_t rows, int64_t C, float eps) override {
    defer(&Kernels::layernorm_forward, y, mean, rstd, x, w, b, rows, C, eps);
  }
  void layernorm_backward(float* dx, const float* residual, float* dw, float* db, const float* dy, const float* x,
                          const float* w, const float* mean, const float* rstd, int64_t rows, int64_t C) override {
    defer(&Kernels::layernorm_backward, dx, residual, dw, db, dy, x, w, mean, rstd, rows, C);
  }
  void log_softmax_forward(float* y, const float* x, int64_t rows, int64_t C) override {
    defer(&Kernels::log_softmax_forward, y, x, rows, C);
  }
  void log_softmax_backward(float* dx, const float* dy, const float* y, int64_t rows, int64_t C) override {
    defer(&Kernels::log_softmax_backward, dx, dy, y, rows, C);
  }
  void causal_softmax_forward(float* P, CausalRows g, float* row_max, float* row_inv) override {
    defer(&Kernels::causal_softmax_forward, P, g, row_max, row_inv);
  }
  void causal_softmax_recompute(float* P, CausalRows g, const float* row_max, const float* row_inv) override {
    defer(&Kernels::causal_softmax_recompute, P, g, row_max, row_inv);
  }
  void causal_softmax_backward(float* dP, const float* P, CausalRows g, float scale) override {
    defer(&Kernels::causal_softmax_backward, dP, P, g, scale);
  }
  void causal_softmax_flash(float* P, CausalRows g, float* row_max, float* row_inv, DType dtype) override {
    defer(&Kernels::causal_softmax_flash, P, g, row_max, row_inv, dtype);
  }
  void attention_rescale(float* y, const float* row_inv, int64_t B, int64_t T, int64_t H, int64_t hd,
                         int64_t inv_stride, DType dtype) override {
    defer(&Kernels::attention_rescale, y, row_inv, B, T, H, hd, inv_stride, dtype);
  }
  void causal_softmax_normalize(float* P, CausalRows g, const float* row_inv, DType dtype) override {
    defer(&Kernels::causal_softmax_normalize, P, g, row_inv, dtype);
  }
  void add_layernorm_forward(float* sum, float* y, float* mean, float* rstd, const float* x, const float* residual,
                             const float* w, const float* b, int64_t rows, int64_t C, float eps, DType dtype) override {
    defer(&Kernels::add_layernorm_forward, sum, y, mean, rstd, x, residual, w, b, rows, C, eps, dtype);
  }
  void add_rmsnorm_forward(float* sum, float* y, float* rstd, const float* x, const float* residual, const float* w,
                           int64_t rows, int64_t C, float eps, DType dtype) override {
    defer(&Kernels::add_rmsnorm_forward, sum, y, rstd, x, residual, w, rows, C, eps, dtype);
  }
  void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t rows, int64_t C,
                       float eps) override {
    defer(&Kernels::rmsnorm_forward, y, rstd, x, w, rows, C, eps);
  }
  void rmsnorm_backward(float* dx, const float* residual, float* dw, const float* dy, const float* x, const float* w,
                        const float* rstd, int64_t rows, int64_t C) override {
    defer(&Kernels::rmsnorm_backward, dx, residual, dw, dy, x, w, rstd, rows, C);
  }
  void attention_softmax_forward(float* P, const float* bias, const int32_t* key_valid, bool causal, int64_t B,
                                 int64_t H, int64_t Tq, int64_t Tk) override {
    defer(&Kernels::attention_softmax_forward, P, bias, key_valid, causal, B, H, Tq, Tk);
  }
  void softmax_backward(float* dP, const float* P, int64_t rows, int64_t Tk) override {
    defer(&Kernels::softmax_backward, dP, P, rows, Tk);
  }
  void relative_bias_forward(float* bias, const float* table, const int32_t* bucket, int64_t H, int64_t Tq,
                             int64_t Tk) override {
    defer(&Kernels::relative_bias_forward, bias, table, bucket, H, Tq, Tk);
  }
  void relative_bias_backward(float* dtable, const float* dS, const int32_t* bucket, int64_t B, int64_t H, int64_t Tq,
                              int64_t Tk) override {
    defer(&Kernels::relative_bias_backward, dtable, dS, bucket, B, H, Tq, Tk);
  }
  void maxpool2_forward(float* y, int32_t* argmax, const float* x, int64_t planes, int64_t H, int64_t W) override {
    defer(&Kernels::maxpool2_forward, y, argmax, x, planes, H, W);
  }
  void maxpool2_backward(float* dx, const float* dy, const int32_t* argmax, int64_t planes, int64_t H,
                         int64_t W) override {
    defer(&Kernels::maxpool2_backward, dx, dy, argmax, planes, H, W);
  }
  void embedding_forward(float* y, const int32_t* tokens, const float* wte, const float* wpe, int64_t B, int64_t T,
                         int64_t C) override {
    defer(&Kernels::embedding_forward, y, tokens, wte, wpe, B, T, C);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dy, const int32_t* tokens, int64_t B, int64_t T,
                          int64_t C) override {
    defer(&Kernels::embedding_backward, dwte, dwpe, dy, tokens, B, T, C);
  }
  void nll_sum(const float* logp, const int32_t* targets, int64_t rows, int64_t C, double* sum,
               int64_t* correct) override {
    now([&] { host_->nll_sum(logp, targets, rows, C, sum, correct); });
  }
  void nll_backward(float* d, const int32_t* targets, int64_t rows, int64_t C, float g) override {
    defer(&Kernels::nll_backward, d, targets, rows, C, g);
  }
  void cross_entropy_backward(float* d, const float* logp, const int32_t* targets, int64_t rows, int64_t C,
                              float inv_n) override {
    defer(&Kernels::cross_entropy_backward, d, logp, targets, rows, C, inv_n);
  }
  void cross_entropy_sum(const float* logits, const int32_t* targets, int64_t rows, int64_t C, float* lse, double* sum,
                         int64_t* correct) override {
    now([&] { host_->cross_entropy_sum(logits, targets, rows, C, lse, sum, correct); });
  }
  void cross_entropy_backward_logits(float* d, const float* logits, const float* lse, const int32_t* targets,
                                     int64_t rows, int64_t C, float inv_n) override {
    defer(&Kernels::cross_entropy_backward_logits, d, logits, lse, targets, rows, C, inv_n);
  }
  void adamw_step(float* p, const float* g, float* exp_avg, float* exp_avg_sq, int64_t n, const AdamWArgs& a) override {
    defer(&Kernels::adamw_step, p, g, exp_avg, exp_avg_sq, n, a);
  }
  void sgd_step(float* p, const float* g, float* momentum_buffer, int64_t n, const SgdArgs& a) override {
    defer(&Kernels::sgd_step, p, g, momentum_buffer, n, a);
  }
  void adadelta_step(float* p, const float* g, float* square_avg, float* acc_delta, int64_t n,
                     const AdadeltaArgs& a) override {
    defer(&Kernels::adadelta_step, p, g, square_avg, acc_delta, n, a);
  }
  void cast(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) override {
    defer(&Kernels::cast, dst, dst_dtype, src, src_dtype, n);
  }
  void round_to(float* x, DType dtype, int64_t n) override { defer(&Kernels::round_to, x, dtype, n); }
  double sum_squares(const float* x, int64_t n) override {
    double s = 0;
    now([&] { s = host_->sum_squares(x, n); });
    return s;
  }
  bool all_finite(const float* x, int64_t n) override {
    bool ok = false;
    now([&] { ok = host_->all_finite(x, n); });
    return ok;
  }

 private:
  template <class Fn, class... Args>
  void defer(Fn fn, Args... args) {
    dev_.count_kernel();
    // The host kernel set of this fake, with the matmul precision of the call (the kernel runs later).
    dev_.enqueue(dev_.compute_stream(), [h = host_.get(), p = precision_, fn, args...] {
      h->set_matmul_precision(p);
      (h->*fn)(args...);
    });
  }
  void now(const std::function<void()>& fn) {
    dev_.count_kernel();
    dev_.synchronize(dev_.compute_stream());
    dev_.with_memory_open(fn);
  }
  FakeDevice& dev_;
  std::unique_ptr<Kernels> host_ = make_cpu_kernels();  // runs the deferred kernels
};

}  // namespace

// The allocator's device calls: segments from the arena, poisoned when first handed out.
class FakeDevice::RawMemory final : public RawDeviceMemory {
 public:
  RawMemory(FakeDevice& dev, Arena& arena) : dev_(dev), arena_(arena) {}
  void* malloc(size_t bytes) override {
    void* p = arena_.take(bytes);
    if (p) dev_.with_memory_open([&] { std::memset(p, 0xFF, bytes); });
    return p;
  }
  void free(void* ptr) override { arena_.give_back(ptr); }
  std::unique_ptr<Event> record(Stream stream) override { return dev_.record(stream); }

 private:
  FakeDevice& dev_;
  Arena& arena_;
};

FakeDevice::FakeDevice(MemoryTracker& tracker, FakeDeviceOptions options)
    : tracker_(tracker),
      options_(options),
      arena_(std::make_unique<Arena>(options.arena_bytes)),
      raw_(std::make_unique<RawMemory>(*this, *arena_)),
      allocator_(std::make_unique<CachingAllocator>(*raw_, tracker)),
      kernels_(std::make_unique<DeferredKernels>(*this)) {}

FakeDevice::~FakeDevice() {
  // Finish what is queued (copies back into host buffers the caller may still read), then return
  // the memory; the arena's destructor restores the SIGSEGV handler.
  for (auto& [stream, q] : queues_) run_until(stream, q.ops.size());
  allocator_.reset();
  for (auto& [p, bytes] : pinned_) std::free(const_cast<char*>(p));
}

void* FakeDevice::allocate(size_t bytes, MemCategory category, Stream stream) {
  return allocator_->allocate(bytes, category, stream);
}

void FakeDevice::deallocate(void* ptr, size_t bytes, MemCategory, Stream stream) {
  if (!ptr) return;
  // Poisoned in the stream order of the free: whoever reads the block after this without the
  // order that makes it theirs reads NaN.
  memset_async(ptr, 0xFF, bytes, stream);
  allocator_->deallocate(ptr, stream);
}

void* FakeDevice::allocate_pinned(size_t bytes) {
  void* p = std::malloc(std::max<size_t>(bytes, 1));
  std::memset(p, 0xFF, std::max<size_t>(bytes, 1));
  pinned_[static_cast<const char*>(p)] = std::max<size_t>(bytes, 1);
  return p;
}

void FakeDevice::free_pinned(void* ptr) {
  if (!ptr) return;
  pinned_.erase(static_cast<const char*>(ptr));
  std::free(ptr);
}

bool FakeDevice::is_device_pointer(const void* ptr) const { return arena_->contains(ptr); }

bool FakeDevice::is_pinned(const void* ptr, size_t bytes) const {
  const auto* a = static_cast<const char*>(ptr);
  auto it = pinned_.upper_bound(a);
  if (it == pinned_.begin()) return false;
  --it;
  return a + bytes <= it->first + it->second;
}

void FakeDevice::copy_async(void* dst, const void* src, size_t bytes, CopyKind kind, Stream stream) {
  if (bytes == 0) return;
  const bool dst_dev = is_device_pointer(dst), src_dev = is_device_pointer(src);
  switch (kind) {
    case CopyKind::host_to_device: {
      ++counts_.h2d;
      if (src_dev || !dst_dev) note("host_to_device copy between the wrong memory spaces");
      if (is_pinned(src, bytes)) break;
      // Pageable source: the bytes are taken now (cudaMemcpyAsync stages them before returning).
      auto snapshot =
          std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + bytes);
      enqueue(stream, [dst, snapshot] { std::memcpy(dst, snapshot->data(), snapshot->size()); });
      return;
    }
    case CopyKind::device_to_host:
      ++counts_.d2h;
      if (!src_dev || dst_dev) note("device_to_host copy between the wrong memory spaces");
      if (is_pinned(dst, bytes)) break;
      // Pageable destination: cudaMemcpyAsync returns once the copy is done, so the stream runs.
      enqueue(stream, [dst, src, bytes] { std::memcpy(dst, src, bytes); });
      ++counts_.stream_syncs;
      run_until(stream.native, queues_[stream.native].ops.size());
      return;
    case CopyKind::device_to_device:
      ++counts_.d2d;
      if (!src_dev || !dst_dev) note("device_to_device copy between the wrong memory spaces");
      break;
    case CopyKind::host_to_host:
      if (src_dev || dst_dev) note("host_to_host copy touching device memory");
      break;
  }
  enqueue(stream, [dst, src, bytes] { std::memcpy(dst, src, bytes); });
}

void FakeDevice::memset_async(void* dst, int value, size_t bytes, Stream stream) {
  if (bytes == 0) return;
  if (!is_device_pointer(dst)) note("memset_async on memory that is not the device's");
  enqueue(stream, [dst, value, bytes] { std::memset(dst, value, bytes); });
}

std::unique_ptr<Event> FakeDevice::record(Stream stream) {
  if (!stream.native) ++counts_.null_stream_ops;
  return std::make_unique<FakeEvent>(*this, stream.native, queues_[stream.native].ops.size());
}

std::unique_ptr<Event> FakeDevice::record_timed(Stream stream) {
  auto seconds = std::make_shared<double>(0.0);
  enqueue(stream, [seconds] {
    *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  });
  return std::make_unique<FakeTimedEvent>(*this, stream.native, queues_[stream.native].ops.size(), seconds);
}

double FakeDevice::elapsed_s(const Event& from, const Event& to) {
  const auto& a = dynamic_cast<const FakeTimedEvent&>(from);
  const auto& b = dynamic_cast<const FakeTimedEvent&>(to);
  run_until(a.stream, a.index);
  run_until(b.stream, b.index);
  return *b.seconds - *a.seconds;
}

void FakeDevice::wait(Stream stream, const Event& event) {
  ++counts_.stream_waits;
  if (options_.drop_stream_waits) return;
  const auto& e = dynamic_cast<const FakeEvent&>(event);
  enqueue(stream, [this, s = e.stream, i = e.index] { run_until(s, i); });
}

void FakeDevice::synchronize(const Event& event, double) {
  ++counts_.event_syncs;
  const auto& e = dynamic_cast<const FakeEvent&>(event);
  run_until(e.stream, e.index);
}

void FakeDevice::synchronize(Stream stream) {
  ++counts_.stream_syncs;
  run_until(stream.native, queues_[stream.native].ops.size());
}

size_t FakeDevice::pending(Stream stream) const {
  auto it = queues_.find(stream.native);
  return it == queues_.end() ? 0 : it->second.ops.size() - it->second.done;
}

size_t FakeDevice::ran(const void* stream) const {
  auto it = queues_.find(stream);
  return it == queues_.end() ? 0 : it->second.done;
}

void FakeDevice::enqueue(Stream stream, std::function<void()> op) {
  if (!stream.native) ++counts_.null_stream_ops;
  if (stream == comm_stream()) ++counts_.comm_stream_ops;
  ++counts_.ops_enqueued;
  queues_[stream.native].ops.push_back(std::move(op));
}

void FakeDevice::with_memory_open(const std::function<void()>& fn) {
  arena_->open();
  try {
    fn();
  } catch (...) {
    arena_->close();
    throw;
  }
  arena_->close();
}

void FakeDevice::library_access(const std::function<void()>& access) {
  ++counts_.library_accesses;
  if (!opened_to_libraries_) {
    arena_->open();  // never closed: see the header
    opened_to_libraries_ = true;
  }
  access();
}

void FakeDevice::run_until(const void* stream, size_t index) {
  Queue& q = queues_[stream];  // std::map: stays valid while ops enqueue elsewhere
  if (q.done >= index) return;
  with_memory_open([&] {
    while (q.done < index) {
      std::function<void()> op = std::move(q.ops[q.done]);
      ++q.done;  // before running: an op waiting on this stream's own past must not rerun it
      op();
      ++counts_.ops_run;
    }
  });
}

}  // namespace fsdp::testing
