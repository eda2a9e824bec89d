#pragma once
// The CUDA device runtime (tensor/device.h's DeviceRuntime on the rank's GPU) and the RAII
// handles it is built from. Every failing CUDA call throws
//   Error("cuda: <call>: <cudaGetErrorString> (<context>)")
// through check_cuda(); destructors only report (they must not throw).
#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "tensor/caching_allocator.h"
#include "tensor/device.h"
#include "tensor/kernels.h"

namespace fsdp::cuda {

// Throws Error("cuda: <call>: <error string> (<context>)") unless rc is cudaSuccess. Clears the
// sticky-free "last error" so a later cudaGetLastError does not report this one again.
void check_cuda(cudaError_t rc, const char* call, const std::string& context);

// A non-blocking stream on the current device (no implicit sync with the legacy default stream).
class StreamHandle {
 public:
  StreamHandle();
  ~StreamHandle();
  StreamHandle(const StreamHandle&) = delete;
  StreamHandle& operator=(const StreamHandle&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// An event with timing disabled (the cheapest to record and query), or enabled (the trace's).
class EventHandle {
 public:
  explicit EventHandle(bool timed = false);
  ~EventHandle();
  EventHandle(const EventHandle&) = delete;
  EventHandle& operator=(const EventHandle&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Page-locked host memory (cudaMallocHost).
class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

// Device memory from cudaMalloc, freed with cudaFree (scratch that bypasses the allocator).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

// A cudaEvent recorded on a stream (the Event of device.h).
class CudaEvent final : public Event {
 public:
  explicit CudaEvent(cudaStream_t stream, bool timed = false);
  bool done() const override;  // cudaEventQuery: true once the stream's earlier work finished
  cudaEvent_t get() const { return event_.get(); }

 private:
  EventHandle event_;
};

// The device calls of the caching allocator over the current device.
class CudaRawMemory final : public RawDeviceMemory {
 public:
  void* malloc(size_t bytes) override;  // nullptr on cudaErrorMemoryAllocation (error cleared)
  void free(void* ptr) override;
  std::unique_ptr<Event> record(Stream stream) override;
};

class CudaKernels;

class CudaRuntime final : public DeviceRuntime {
 public:
  // GPU local_rank % cudaGetDeviceCount(); Error when there is none.
  CudaRuntime(MemoryTracker& tracker, int local_rank);
  ~CudaRuntime() override;
  CudaRuntime(const CudaRuntime&) = delete;
  CudaRuntime& operator=(const CudaRuntime&) = delete;

  Device device() const override { return Device::cuda; }
  std::string describe() const override { return description_; }
  MemoryTracker& tracker() override { return tracker_; }
  int device_index() const { return device_; }
  CachingAllocator& allocator() { return *allocator_; }
  std::optional<AllocatorStats> allocator_stats() const override { return allocator_->stats(); }
  DeviceMemory device_memory() override;

  void* allocate(size_t bytes, MemCategory category, Stream stream) override;
  void deallocate(void* ptr, size_t bytes, MemCategory category, Stream stream) override;
  void* allocate_pinned(size_t bytes) override;
  void free_pinned(void* ptr) override;
  bool is_device_pointer(const void* ptr) const override;

  void copy_async(void* dst, const void* src, size_t bytes, CopyKind kind, Stream stream) override;
  void memset_async(void* dst, int value, size_t bytes, Stream stream) override;

  Stream compute_stream() override { return Stream{compute_->get()}; }
  Stream comm_stream() override { return Stream{comm_->get()}; }
  std::unique_ptr<Event> record(Stream stream) override;
  void wait(Stream stream, const Event& event) override;
  void synchronize(const Event& event, double timeout_s) override;
  void synchronize(Stream stream) override;
  // Timing-enabled events (cudaEventElapsedTime, ~0.5 us resolution); NVTX ranges.
  std::unique_ptr<Event> record_timed(Stream stream) override;
  double elapsed_s(const Event& from, const Event& to) override;
  void range_push(const char* name) override;
  void range_pop() override;

  Kernels& kernels() override;

 private:
  MemoryTracker& tracker_;
  int device_ = 0;
  std::string description_;
  std::unique_ptr<StreamHandle> compute_, comm_;
  CudaRawMemory raw_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::unique_ptr<CudaKernels> kernels_;
};

inline cudaStream_t native(Stream s) { return static_cast<cudaStream_t>(s.native); }

}  // namespace fsdp::cuda
