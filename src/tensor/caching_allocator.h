#pragma once
// A caching allocator for device memory, the scheme of PyTorch's CUDACachingAllocator reduced to
// what this trainer needs. Host-side logic only: the device calls (cudaMalloc, cudaFree, events)
// come through RawDeviceMemory, so the bookkeeping is tested on the CPU with a fake
// (tests/test_allocator.cpp) and runs unchanged over CUDA (tensor/cuda/cuda_runtime.cpp).
//
//  - Sizes round up to 512 bytes. Requests up to 1 MiB are served from 2 MiB segments (small
//    pool), larger ones from segments of the request rounded to 2 MiB (large pool); a block larger
//    than needed is split, and freed neighbours of one segment merge again.
//  - Blocks are per stream: a block freed with stream s goes back to s's free list and is reused
//    at once for s (stream order makes that safe). A block used on other streams too
//    (record_stream) is held until an event recorded on each of them at the free completes.
//  - Every allocated byte is charged to a MemCategory of the MemoryTracker (requested bytes,
//    as host tensors are), so memory plans and metrics read the same on CPU and GPU; the
//    allocator's own stats report reserved (segment) bytes and the cache on top.
//  - When the device is out of memory, the allocator frees every cached segment no block uses
//    and retries once; then it throws OutOfMemory naming the request, the category, what is
//    allocated per category, reserved and cached. Freed blocks other streams still use are waited
//    for at most AllocatorOptions::held_wait_s, so a stream that never completes cannot hang it.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "tensor/device.h"
#include "tensor/error.h"
#include "tensor/memory.h"

namespace fsdp {

class OutOfMemory : public Error {
 public:
  using Error::Error;
};

// The device calls the allocator makes. CUDA: cudaMalloc/cudaFree/cudaEventRecord/Query.
class RawDeviceMemory {
 public:
  virtual ~RawDeviceMemory() = default;
  // nullptr when the device has no room (never throws for that).
  virtual void* malloc(size_t bytes) = 0;
  virtual void free(void* ptr) = 0;
  // An event recorded now on `stream`; done() once the stream's work so far has finished.
  virtual std::unique_ptr<Event> record(Stream stream) = 0;
};

// AllocatorStats: tensor/device.h (DeviceRuntime::allocator_stats reports them).

struct AllocatorOptions {
  // Longest an out-of-memory retry (or empty_cache) waits for freed blocks that other streams
  // still use; after it the retry goes on without them and the error names them.
  double held_wait_s = 60.0;
};

class CachingAllocator {
 public:
  static constexpr size_t kRound = 512;
  static constexpr size_t kSmallLimit = 1 << 20;    // requests <= this: small pool
  static constexpr size_t kSmallSegment = 2 << 20;  // small pool segment size
  static constexpr size_t kLargeRound = 2 << 20;    // large segments round to this

  CachingAllocator(RawDeviceMemory& raw, MemoryTracker& tracker, AllocatorOptions options = {});
  ~CachingAllocator();  // returns every segment to the device (blocks still in use are a bug: counted, not freed twice)
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* allocate(size_t bytes, MemCategory category, Stream stream);
  void deallocate(void* ptr, Stream stream);  // bytes and category are remembered per block
  // The block will also be used by work on `stream` (torch's record_stream): a free waits for it.
  void record_stream(void* ptr, Stream stream);
  // Returns cached segments with no block in use to the device (after pending events complete).
  void empty_cache();
  bool owns(const void* ptr) const;
  AllocatorStats stats() const;
  // "allocated 1.2 GiB (params 400 MiB, grads ...), reserved 2.0 GiB, cached 0.8 GiB"
  std::string summary() const;

 private:
  struct Segment;
  struct Block;
  // implementation-defined members (caching_allocator.cpp)
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp
