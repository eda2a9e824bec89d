#pragma once
// A driverless "cuda" DeviceRuntime for checking stream and event order on the CPU.
//
//  - Memory: the real CachingAllocator (tensor/caching_allocator.h) over an arena of host pages
//    that are PROT_NONE except while a stream operation runs. Host code that reads or writes device
//    memory outside of one (a bug that would read garbage or fault on a GPU) gets SIGSEGV, and the
//    handler names it on stderr and exits with kHostTouchExit. New segments and freed blocks are
//    poisoned (0xFF bytes: NaN in f32) in stream order, so reading a block before its producer ran
//    or after its free shows up as NaN.
//  - Streams are deferred queues: nothing enqueued runs until the host synchronises on the stream
//    (or an event on it), or until another stream's operation that waits on one of its events runs.
//    That is the laziest legal schedule, so a missing host wait reads stale data and a missing
//    stream wait reads the producer's poison.
//  - Kernels are the host kernels (cpu_kernels()), each enqueued on the compute stream; those
//    that return a host value synchronise the compute stream first, as CudaKernels do. Results
//    are therefore bitwise those of the host runtime when the order is right.
//  - Copies follow cudaMemcpyAsync's pageable rules: a host_to_device copy from pageable memory
//    takes the bytes when it is enqueued; a device_to_host copy into pageable memory returns
//    only when the stream has run up to and including it. Pinned memory is truly asynchronous.
//
// Options::drop_stream_waits makes wait(stream, event) do nothing: the tests' proof that a
// missing stream wait is caught.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tensor/caching_allocator.h"
#include "tensor/device.h"
#include "tensor/kernels.h"

namespace fsdp::testing {

constexpr int kHostTouchExit = 86;  // exit status after the host touched fake device memory

struct FakeDeviceOptions {
  size_t arena_bytes = size_t{1} << 30;  // reserved address space (pages are touched on use)
  bool drop_stream_waits = false;
  int64_t free_bytes = -1;  // what device_memory() reports as free (-1: unknown, not checked)
};

struct FakeDeviceCounts {
  uint64_t ops_enqueued = 0, ops_run = 0;
  uint64_t kernels = 0;  // kernel launches
  uint64_t h2d = 0, d2h = 0, d2d = 0;
  uint64_t stream_waits = 0;      // wait(stream, event)
  uint64_t event_syncs = 0;       // synchronize(event): the host waits for one point of a stream
  uint64_t stream_syncs = 0;      // synchronize(stream), host-value kernels, pageable d2h copies
  uint64_t comm_stream_ops = 0;   // work enqueued on the communication stream
  uint64_t null_stream_ops = 0;   // work on Stream{}: a bug for this runtime (counted, run in order)
  uint64_t library_accesses = 0;  // device-pointer collective calls and waits (library_access)
};

class FakeDevice final : public DeviceRuntime {
 public:
  FakeDevice(MemoryTracker& tracker, FakeDeviceOptions options = {});
  ~FakeDevice() override;
  FakeDevice(const FakeDevice&) = delete;
  FakeDevice& operator=(const FakeDevice&) = delete;

  Device device() const override { return Device::cuda; }
  std::string describe() const override { return "fake cuda (deferred streams, guarded memory)"; }
  DeviceMemory device_memory() override { return {options_.free_bytes, 1, "fake cuda:0"}; }
  MemoryTracker& tracker() override { return tracker_; }
  void* allocate(size_t bytes, MemCategory category, Stream stream) override;
  void deallocate(void* ptr, size_t bytes, MemCategory category, Stream stream) override;
  void* allocate_pinned(size_t bytes) override;
  void free_pinned(void* ptr) override;
  bool is_device_pointer(const void* ptr) const override;
  void copy_async(void* dst, const void* src, size_t bytes, CopyKind kind, Stream stream) override;
  void memset_async(void* dst, int value, size_t bytes, Stream stream) override;
  Stream compute_stream() override { return Stream{&compute_tag_}; }
  Stream comm_stream() override { return Stream{&comm_tag_}; }
  std::unique_ptr<Event> record(Stream stream) override;
  // Timed events (the trace's device spans): stamped with the host's clock when the stream runs
  // up to them; elapsed_s runs both streams that far first.
  std::unique_ptr<Event> record_timed(Stream stream) override;
  double elapsed_s(const Event& from, const Event& to) override;
  void wait(Stream stream, const Event& event) override;
  void synchronize(const Event& event, double timeout_s) override;
  void synchronize(Stream stream) override;
  Kernels& kernels() override { return *kernels_; }

  // Work enqueued on a stream that has not run yet.
  size_t pending(Stream stream) const;
  const FakeDeviceCounts& counts() const { return counts_; }
  const CachingAllocator& allocator() const { return *allocator_; }
  std::optional<AllocatorStats> allocator_stats() const override { return allocator_->stats(); }
  // Errors the runtime noticed without crashing (a copy between the wrong spaces, ...).
  const std::vector<std::string>& errors() const { return errors_; }
  void count_kernel() { ++counts_.kernels; }

  // For the runtime's own pieces (kernels, the raw memory): run `op` on `stream` in order.
  void enqueue(Stream stream, std::function<void()> op);
  // Runs `fn` now with device memory readable (host-value kernels after their synchronisation).
  void with_memory_open(const std::function<void()>& fn);
  // A library handed device pointers (comm.device_buffers: direct) reads and writes the memory
  // as a GPU's CUDA-aware MPI or UCX does, and not only during the call: a peer process may copy
  // out of it later (UCX's CMA rendezvous reads with process_vm_readv while this rank does
  // something else). So from the first such access the memory stays open for good: a run on a
  // device-pointer path keeps the stream-order checks (poison, deferred streams) but no longer
  // faults on host access. Counted.
  void library_access(const std::function<void()>& access) override;
  size_t ran(const void* stream) const;

 private:
  struct Queue {
    std::vector<std::function<void()>> ops;
    size_t done = 0;
  };
  class Arena;
  class RawMemory;
  void run_until(const void* stream, size_t index);
  bool is_pinned(const void* ptr, size_t bytes) const;
  void note(const std::string& error) { errors_.push_back(error); }

  MemoryTracker& tracker_;
  FakeDeviceOptions options_;
  FakeDeviceCounts counts_;
  std::unique_ptr<Arena> arena_;
  std::unique_ptr<RawMemory> raw_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::unique_ptr<Kernels> kernels_;
  std::map<const void*, Queue> queues_;
  std::map<const char*, size_t> pinned_;  // start -> bytes
  std::vector<std::string> errors_;
  char compute_tag_ = 0, comm_tag_ = 0;  // their addresses are the streams
  bool opened_to_libraries_ = false;     // library_access opened the memory for good
};

}  // namespace fsdp::testing
