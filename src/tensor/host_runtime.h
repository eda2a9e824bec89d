#pragma once
// The cpu DeviceRuntime: host memory charged to the tracker, the calling thread as the only
// stream (every enqueue has finished when it returns, every event is complete), host kernels.
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

#include "tensor/device.h"
#include "tensor/kernels.h"

namespace fsdp {

// Tensor blocks of kMinBytes and up, each its own anonymous mapping, kept when freed and handed
// out again for a request of the same size class (eight per power of two: at most 1/8 over). A
// training step frees and allocates the same sizes every step, so after the first step no block
// is faulted in (and zeroed by the kernel) again. Kept apart from malloc's heap because there any
// small allocation that outlives a step (a trace's events, a metrics line) can land in a freed
// block's hole, and the next block of that size then comes from fresh pages at the top: with
// output.trace at np 2 the heap grew by ~300 MB a step and clear_page took 22% of the step. The
// cache holds little more than was once live at the same time: a request that finds no block of
// its class first unmaps cached blocks, the largest first, until live + cached + the request fit
// under the most bytes ever live (the high-water mark) plus a quarter.
class HostBlockCache {
 public:
  static constexpr size_t kMinBytes = size_t{1} << 20;
  HostBlockCache() = default;
  ~HostBlockCache();
  HostBlockCache(const HostBlockCache&) = delete;
  HostBlockCache& operator=(const HostBlockCache&) = delete;
  void* take(size_t bytes);             // throws std::bad_alloc when the kernel has no room
  void give(void* ptr, size_t bytes);   // bytes: as passed to take
  static size_t rounded(size_t bytes);  // the size class of a request of kMinBytes and up
  size_t cached_bytes() const;
  size_t live_bytes() const;

 private:
  mutable std::mutex mutex_;           // the checkpoint writer and the watchdog free on their own threads
  std::multimap<size_t, void*> free_;  // size class -> mapping
  size_t cached_ = 0, live_ = 0, high_water_ = 0;
};

class HostRuntime final : public DeviceRuntime {
 public:
  // Whether tensors of HostBlockCache::kMinBytes and up come from the block cache: not in an
  // AddressSanitizer build, whose checks (overflows, use after free) cover malloc's blocks only.
  static bool uses_block_cache();
  // Sets the process's malloc to keep the memory a step frees (see host_runtime.cpp).
  explicit HostRuntime(MemoryTracker& tracker);
  Device device() const override { return Device::cpu; }
  std::string describe() const override { return "cpu"; }
  MemoryTracker& tracker() override { return tracker_; }
  void* allocate(size_t bytes, MemCategory category, Stream stream) override;
  void deallocate(void* ptr, size_t bytes, MemCategory category, Stream stream) override;
  void* allocate_pinned(size_t bytes) override;
  void free_pinned(void* ptr) override;
  bool is_device_pointer(const void*) const override { return false; }
  void copy_async(void* dst, const void* src, size_t bytes, CopyKind kind, Stream stream) override;
  void memset_async(void* dst, int value, size_t bytes, Stream stream) override;
  Stream compute_stream() override { return {}; }
  Stream comm_stream() override { return {}; }
  std::unique_ptr<Event> record(Stream stream) override;
  void wait(Stream, const Event&) override {}
  void synchronize(const Event&, double) override {}
  void synchronize(Stream) override {}
  Kernels& kernels() override;

 private:
  static bool cached(size_t bytes) { return bytes >= HostBlockCache::kMinBytes && uses_block_cache(); }
  MemoryTracker& tracker_;
  HostBlockCache blocks_;
  std::unique_ptr<Kernels> kernels_ = make_cpu_kernels();  // its own: the matmul precision is per runtime
};

}  // namespace fsdp
