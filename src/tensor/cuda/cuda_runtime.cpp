#include "tensor/cuda/cuda_runtime.h"

#include <nvtx3/nvToolsExt.h>
#include <sched.h>

#include <chrono>
#include <cstdio>
#include <sstream>

#include "tensor/cuda/cuda_kernels.h"
#include "tensor/error.h"
#include "tensor/runtime_factory.h"

namespace fsdp {
namespace cuda {

void check_cuda(cudaError_t rc, const char* call, const std::string& context) {
  if (rc == cudaSuccess) return;
  (void)cudaGetLastError();  // clear a non-sticky error so it is reported once
  throw Error(std::string("cuda: ") + call + ": " + cudaGetErrorString(rc) + " (" + context + ")");
}

namespace {

// Destructors report instead of throwing.
void report(cudaError_t rc, const char* call) {
  if (rc != cudaSuccess && rc != cudaErrorCudartUnloading)
    std::fprintf(stderr, "cuda: %s: %s (in a destructor)\n", call, cudaGetErrorString(rc));
}

const char* kind_name(CopyKind kind) {
  switch (kind) {
    case CopyKind::host_to_device: return "host to device";
    case CopyKind::device_to_host: return "device to host";
    case CopyKind::device_to_device: return "device to device";
    case CopyKind::host_to_host: return "host to host";
  }
  return "?";
}

cudaMemcpyKind native_kind(CopyKind kind) {
  switch (kind) {
    case CopyKind::host_to_device: return cudaMemcpyHostToDevice;
    case CopyKind::device_to_host: return cudaMemcpyDeviceToHost;
    case CopyKind::device_to_device: return cudaMemcpyDeviceToDevice;
    case CopyKind::host_to_host: return cudaMemcpyHostToHost;
  }
  return cudaMemcpyDefault;
}

}  // namespace

StreamHandle::StreamHandle() {
  check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags",
             "non-blocking stream");
}
StreamHandle::~StreamHandle() {
  if (stream_) report(cudaStreamDestroy(stream_), "cudaStreamDestroy");
}

EventHandle::EventHandle(bool timed) {
  check_cuda(cudaEventCreateWithFlags(&event_, timed ? cudaEventDefault : cudaEventDisableTiming),
             "cudaEventCreateWithFlags", "event");
}
EventHandle::~EventHandle() {
  if (event_) report(cudaEventDestroy(event_), "cudaEventDestroy");
}

PinnedBuffer::PinnedBuffer(size_t bytes) {
  check_cuda(cudaMallocHost(&ptr_, bytes), "cudaMallocHost", std::to_string(bytes) + " bytes pinned");
}
PinnedBuffer::~PinnedBuffer() {
  if (ptr_) report(cudaFreeHost(ptr_), "cudaFreeHost");
}

DeviceBuffer::DeviceBuffer(size_t bytes) {
  check_cuda(cudaMalloc(&ptr_, bytes), "cudaMalloc", std::to_string(bytes) + " bytes of scratch");
}
DeviceBuffer::~DeviceBuffer() {
  if (ptr_) report(cudaFree(ptr_), "cudaFree");
}

CudaEvent::CudaEvent(cudaStream_t stream, bool timed) : event_(timed) {
  check_cuda(cudaEventRecord(event_.get(), stream), "cudaEventRecord", "record");
}

bool CudaEvent::done() const {
  cudaError_t rc = cudaEventQuery(event_.get());
  if (rc == cudaErrorNotReady) return false;
  check_cuda(rc, "cudaEventQuery", "event");
  return true;
}

void* CudaRawMemory::malloc(size_t bytes) {
  void* ptr = nullptr;
  cudaError_t rc = cudaMalloc(&ptr, bytes);
  if (rc == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // out of memory is not sticky: clear it, the allocator retries
    return nullptr;
  }
  check_cuda(rc, "cudaMalloc", std::to_string(bytes) + " bytes");
  return ptr;
}

void CudaRawMemory::free(void* ptr) { check_cuda(cudaFree(ptr), "cudaFree", "allocator segment"); }

std::unique_ptr<Event> CudaRawMemory::record(Stream stream) { return std::make_unique<CudaEvent>(native(stream)); }

CudaRuntime::CudaRuntime(MemoryTracker& tracker, int local_rank) : tracker_(tracker) {
  std::string why;
  int count = cuda_device_count_impl(&why);
  if (count == 0) throw Error("device cuda: no CUDA device: " + why);
  device_ = (local_rank < 0 ? 0 : local_rank) % count;
  const std::string which = "device " + std::to_string(device_);
  check_cuda(cudaSetDevice(device_), "cudaSetDevice", which);
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, device_), "cudaGetDeviceProperties", which);
  std::ostringstream d;
  d << "cuda:" << device_ << " (" << prop.name << ", sm_" << prop.major << prop.minor << ", "
    << (prop.totalGlobalMem >> 30) << " GiB)";
  description_ = d.str();
  compute_ = std::make_unique<StreamHandle>();
  comm_ = std::make_unique<StreamHandle>();
  allocator_ = std::make_unique<CachingAllocator>(raw_, tracker_);
  kernels_ = std::make_unique<CudaKernels>(compute_->get(), *allocator_);
}

CudaRuntime::~CudaRuntime() {
  // Work still queued may use blocks and the kernels' scratch: finish it before freeing.
  if (compute_) report(cudaStreamSynchronize(compute_->get()), "cudaStreamSynchronize");
  if (comm_) report(cudaStreamSynchronize(comm_->get()), "cudaStreamSynchronize");
  kernels_.reset();
  allocator_.reset();
}

void* CudaRuntime::allocate(size_t bytes, MemCategory category, Stream stream) {
  return allocator_->allocate(bytes, category, stream);
}

void CudaRuntime::deallocate(void* ptr, size_t, MemCategory, Stream stream) { allocator_->deallocate(ptr, stream); }

void* CudaRuntime::allocate_pinned(size_t bytes) {
  void* ptr = nullptr;
  check_cuda(cudaMallocHost(&ptr, bytes), "cudaMallocHost", std::to_string(bytes) + " bytes pinned");
  return ptr;
}

void CudaRuntime::free_pinned(void* ptr) {
  if (ptr) check_cuda(cudaFreeHost(ptr), "cudaFreeHost", "pinned buffer");
}

bool CudaRuntime::is_device_pointer(const void* ptr) const {
  if (!ptr) return false;
  cudaPointerAttributes attr{};
  cudaError_t rc = cudaPointerGetAttributes(&attr, ptr);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();  // older runtimes report plain host pointers as an error
    return false;
  }
  return (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) && attr.device == device_;
}

void CudaRuntime::copy_async(void* dst, const void* src, size_t bytes, CopyKind kind, Stream stream) {
  if (bytes == 0) return;
  check_cuda(cudaMemcpyAsync(dst, src, bytes, native_kind(kind), native(stream)), "cudaMemcpyAsync",
             std::to_string(bytes) + " bytes " + kind_name(kind));
}

void CudaRuntime::memset_async(void* dst, int value, size_t bytes, Stream stream) {
  if (bytes == 0) return;
  check_cuda(cudaMemsetAsync(dst, value, bytes, native(stream)), "cudaMemsetAsync", std::to_string(bytes) + " bytes");
}

std::unique_ptr<Event> CudaRuntime::record(Stream stream) { return std::make_unique<CudaEvent>(native(stream)); }

void CudaRuntime::wait(Stream stream, const Event& event) {
  if (const auto* e = dynamic_cast<const CudaEvent*>(&event)) {
    check_cuda(cudaStreamWaitEvent(native(stream), e->get(), 0), "cudaStreamWaitEvent", "stream wait");
    return;
  }
  // An event of another runtime (the host's): complete when it was recorded.
  if (!event.done()) throw Error("cuda: wait: an event that is not a CUDA event and not complete");
}

void CudaRuntime::synchronize(const Event& event, double timeout_s) {
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_s));
  while (!event.done()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      std::ostringstream m;
      m << "cuda: synchronize: device work not complete after the timeout of " << timeout_s << " s (cuda:" << device_
        << ")";
      throw Error(m.str());
    }
    sched_yield();
  }
}

void CudaRuntime::synchronize(Stream stream) {
  check_cuda(cudaStreamSynchronize(native(stream)), "cudaStreamSynchronize", "cuda:" + std::to_string(device_));
}

std::unique_ptr<Event> CudaRuntime::record_timed(Stream stream) {
  return std::make_unique<CudaEvent>(native(stream), true);
}

double CudaRuntime::elapsed_s(const Event& from, const Event& to) {
  const auto* a = dynamic_cast<const CudaEvent*>(&from);
  const auto* b = dynamic_cast<const CudaEvent*>(&to);
  if (!a || !b) throw Error("cuda: elapsed_s: events that record_timed did not make");
  check_cuda(cudaEventSynchronize(a->get()), "cudaEventSynchronize", "trace event");
  check_cuda(cudaEventSynchronize(b->get()), "cudaEventSynchronize", "trace event");
  float ms = 0.0f;
  check_cuda(cudaEventElapsedTime(&ms, a->get(), b->get()), "cudaEventElapsedTime", "trace event");
  return static_cast<double>(ms) * 1e-3;
}

// NVTX3 is header-only (it finds an attached tool at the first call): without Nsight, a call
// is a check of a null function pointer.
void CudaRuntime::range_push(const char* name) { nvtxRangePushA(name); }
void CudaRuntime::range_pop() { nvtxRangePop(); }

Kernels& CudaRuntime::kernels() { return *kernels_; }

DeviceRuntime::DeviceMemory CudaRuntime::device_memory() {
  size_t free_bytes = 0, total_bytes = 0;
  int count = 1;
  check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo", "the device's free memory");
  check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount", "the devices of this node");
  return {static_cast<int64_t>(free_bytes), count, "cuda:" + std::to_string(device_)};
}

}  // namespace cuda

std::unique_ptr<DeviceRuntime> make_cuda_runtime(MemoryTracker& tracker, int local_rank) {
  return std::make_unique<cuda::CudaRuntime>(tracker, local_rank);
}

bool cuda_built_impl() { return true; }

int cuda_device_count_impl(std::string* why_none) {
  int count = 0;
  cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    if (why_none) *why_none = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(rc);
    return 0;
  }
  if (count == 0 && why_none) *why_none = "cudaGetDeviceCount: no device";
  return count;
}

}  // namespace fsdp
