#pragma once
// The device a process computes on, behind one interface: memory (charged to the same
// MemoryTracker categories as host tensors), copies, streams and events, and the kernels.
// One DeviceRuntime per process, owned by whoever trains (the trainer, a test) and passed
// down explicitly: no global, no singleton.
//
//  - HostRuntime (device cpu, tensor/host_runtime.cpp): host memory. There is one stream, the
//    calling thread, so every enqueue has finished when it returns and every event is complete.
//  - CudaRuntime (device cuda, tensor/cuda/): the rank's GPU; a caching allocator over
//    cudaMalloc (tensor/caching_allocator.h); a compute stream for kernels and a communication
//    stream for FSDP's collectives, ordered with events — no device-wide synchronisation.
//
// Stream rules (those of PyTorch's caching allocator): a block freed with stream s may be handed
// out again at once for work on s (stream order makes that safe); before another stream may
// reuse it, the allocator waits for an event recorded on s at the free.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tensor/memory.h"
#include "tensor/tensor.h"

namespace fsdp {

class Kernels;

// An ordered queue of device work: cudaStream_t on CUDA; null = the host (or the legacy
// default stream on CUDA).
struct Stream {
  void* native = nullptr;
  bool operator==(const Stream&) const = default;
};

// A point in a stream's work, recorded by DeviceRuntime::record.
class Event {
 public:
  virtual ~Event() = default;
  virtual bool done() const = 0;  // non-blocking query
};

enum class CopyKind : uint8_t { host_to_device, device_to_host, device_to_device, host_to_host };

// A caching allocator's counters (tensor/caching_allocator.h), PyTorch's memory_allocated and
// memory_reserved with their max_ forms: reserved - allocated is what the cache holds (freed
// blocks kept for reuse, and the fragments of segments).
struct AllocatorStats {
  size_t allocated_bytes = 0;  // rounded sizes of blocks in use
  size_t peak_allocated_bytes = 0;
  size_t reserved_bytes = 0;  // segments obtained from the device
  size_t peak_reserved_bytes = 0;
  size_t cached_bytes = 0;      // reserved - allocated
  uint64_t device_mallocs = 0;  // segments obtained (cudaMalloc calls that succeeded)
  uint64_t device_frees = 0;
  uint64_t cache_hits = 0;   // requests served without a device malloc
  uint64_t oom_retries = 0;  // times the cache was emptied to retry a failed malloc
};

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual Device device() const = 0;
  // "cpu", "cuda:0 (NVIDIA H100 80GB HBM3, sm_90, 79 GiB)": for the start-up banner.
  virtual std::string describe() const = 0;
  virtual MemoryTracker& tracker() = 0;
  // False for the meta device (tensor/meta_runtime.h): its memory holds no values, so host
  // loops that would fill or read it (drawing initial values, reading a weights file) are skipped.
  virtual bool holds_values() const { return true; }
  // What a run checks its memory plan against before it allocates (train/plan.h): the device's
  // free bytes now (cudaMemGetInfo), or -1 where there is no device memory to ask about (the
  // host, the meta device); and how many devices this node's ranks share (local rank % count).
  struct DeviceMemory {
    int64_t free_bytes = -1;
    int devices = 1;
    std::string name;  // "cuda:0"
  };
  virtual DeviceMemory device_memory() { return {}; }
  // The caching allocator's counters, for runtimes that have one (cuda, the tests' fake device):
  // the metrics report reserved against allocated memory from them.
  virtual std::optional<AllocatorStats> allocator_stats() const { return std::nullopt; }

  // Memory in this runtime's space, charged to `category` while allocated. `stream`: the stream
  // whose work uses the block (see the stream rules above). Throws OutOfMemory (caching_allocator.h)
  // naming the request, the category and what is in use and cached.
  virtual void* allocate(size_t bytes, MemCategory category, Stream stream) = 0;
  virtual void deallocate(void* ptr, size_t bytes, MemCategory category, Stream stream) = 0;
  // Page-locked host memory for staging copies (host runtime: ordinary aligned memory).
  virtual void* allocate_pinned(size_t bytes) = 0;
  virtual void free_pinned(void* ptr) = 0;
  // True when ptr is memory of this runtime's device (host runtime: never).
  virtual bool is_device_pointer(const void* ptr) const = 0;

  // Enqueued on `stream`: returns at once on CUDA. Host memory in an async copy must be pinned
  // to overlap; pageable memory works but the copy is synchronous for the host.
  virtual void copy_async(void* dst, const void* src, size_t bytes, CopyKind kind, Stream stream) = 0;
  virtual void memset_async(void* dst, int value, size_t bytes, Stream stream) = 0;

  virtual Stream compute_stream() = 0;  // where kernels() runs
  virtual Stream comm_stream() = 0;     // FSDP's all_gather / reduce_scatter
  virtual std::unique_ptr<Event> record(Stream stream) = 0;
  virtual void wait(Stream stream, const Event& event) = 0;            // the stream waits; the host does not
  virtual void synchronize(const Event& event, double timeout_s) = 0;  // the host waits, then CommTimeout-like Error
  virtual void synchronize(Stream stream) = 0;

  // The trace (fsdp/trace.h) times device work with these; nothing else calls them. An event
  // that carries the time `stream` reaches it (the host runtime's: the time of the call), and
  // the seconds from `from` to `to` (waits for both; negative when `to` came first). Events of
  // record() carry no time. The defaults are the host's: a host runtime has no stream to wait on.
  virtual std::unique_ptr<Event> record_timed(Stream stream);
  virtual double elapsed_s(const Event& from, const Event& to);
  // Named ranges for a profiler attached from outside (NVTX on CUDA, so Nsight Systems shows the
  // trace's names); no-ops elsewhere. Pushes and pops nest on the calling thread.
  virtual void range_push(const char* name) {}
  virtual void range_pop() {}

  // Runs `access`, in which a library (a CUDA-aware MPI, a UCX with CUDA transports) reads or
  // writes this device's memory itself, from the host thread: a GPU needs nothing around it; the
  // fake device of the tests, whose memory faults on any host access outside a stream
  // operation, opens it for the call (comm/device_comm.h wraps every device-pointer call so).
  virtual void library_access(const std::function<void()>& access) { access(); }

  virtual Kernels& kernels() = 0;  // enqueued on compute_stream()
};

// Complete when made: the events of the host runtime (its work has finished when it returns) and
// of the meta device.
class DoneEvent : public Event {
 public:
  bool done() const override { return true; }
};

// The event of the default record_timed: complete when made, stamped with the host's clock.
class HostTimedEvent final : public DoneEvent {
 public:
  HostTimedEvent();
  double seconds() const { return seconds_; }  // steady_clock, seconds since its epoch

 private:
  double seconds_;
};

// A host runtime always exists; cuda throws Error when this binary was built without CUDA
// ("built without CUDA: reconfigure with -Dgpu=enabled") or the process sees no GPU ("no CUDA
// device: cudaGetDeviceCount: ..."). local_rank picks the GPU (local_rank % device count).
std::unique_ptr<DeviceRuntime> make_runtime(Device device, MemoryTracker& tracker, int local_rank);
// Whether this binary has the CUDA runtime compiled in (the -Dgpu build), and how many GPUs this
// process sees (0 without CUDA or without a driver). For test skips and messages.
bool cuda_built();
int cuda_device_count(std::string* why_none = nullptr);

Device parse_device(const std::string& name);  // "cpu" | "cuda"; Error otherwise
std::string_view device_name(Device device);

// Host <-> runtime copies of a whole tensor, synchronous for the host (tests, checkpoints, the
// loss value): where a copy is asked for, never implicitly.
Tensor to_device(DeviceRuntime& rt, const Tensor& host, MemCategory category);
Tensor to_host(DeviceRuntime& rt, const Tensor& dev, MemCategory category = MemCategory::other,
               MemoryTracker* tracker = nullptr);

}  // namespace fsdp
