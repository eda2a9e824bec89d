#include "tensor/host_runtime.h"

#include <malloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <new>

#include "tensor/kernels.h"

namespace fsdp {

namespace {

// glibc gives blocks above its mmap threshold (dynamic, at most 32 MiB) their own mapping and
// returns the top of the heap to the kernel past its trim threshold; either way the next step's
// buffers of the same sizes are fresh pages, faulted in and zeroed by the kernel: measured on
// the bench transformer at np 2 (FULL_SHARD, 4 samples per rank), 8,200 page faults a step and
// 3.6% of the step in clear_page. Every step frees and allocates the same sizes, so the heap keeps
// them: no mapping per block and no trim below 1 GiB (after the first two steps: no new faults
// on rank 0, ~1,600 a step on rank 1).
// Process-wide and idempotent; blocks above 1 GiB (a large model's flat shards) still get
// their own mapping and go back to the kernel when freed. Tensors of HostBlockCache::kMinBytes
// and up no longer come from malloc (host_runtime.h says why); this still serves the large
// vectors the kernels and the collectives allocate per call.
void keep_freed_host_memory() {
  constexpr int kKeepBytes = 1 << 30;
  mallopt(M_MMAP_THRESHOLD, kKeepBytes);
  mallopt(M_TRIM_THRESHOLD, kKeepBytes);
}

}  // namespace

size_t HostBlockCache::rounded(size_t bytes) {
  // Eight classes per power of two: at most 1/8 over the request, and a size that grows a little
  // each call (a decoder's logits during generation) stays in its class for a while.
  // >= 128 KiB for bytes >= kMinBytes; whole pages (and never 0) for any size.
  const size_t step = std::max<size_t>(std::bit_floor(bytes) / 8, 4096);
  return (bytes + step - 1) / step * step;
}

HostBlockCache::~HostBlockCache() {
  for (auto& [size, ptr] : free_) munmap(ptr, size);
}

void* HostBlockCache::take(size_t bytes) {
  const size_t size = rounded(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = free_.find(size); it != free_.end()) {
    void* p = it->second;
    free_.erase(it);
    cached_ -= size;
    live_ += size;
    return p;
  }
  // No block of this size: make room from the cache first, under the high-water mark of live
  // bytes plus a quarter. With no slack, a step whose backward frees each layer's buffers as it
  // goes (sizes the forward does not use) evicted and remapped ~6 blocks a step on the bench
  // transformer: 14k page faults a step, none with an eighth, for 22 MB more RSS (2026-11-27).
  // An eighth stopped being enough once saved activations were packed to half size and widened
  // one at a time, grad shards came per unit and units were gathered again for backward at np 1
  // (2026-12-02): 133k faults a step, 12% of the step (bf16, np 1); a quarter: none again, and
  // max RSS 965 MB against 1065 before those changes (the tracked peak 720 against 905 MiB).
  const size_t bound = high_water_ + high_water_ / 4;
  while (!free_.empty() && live_ + cached_ + size > bound) {
    auto largest = std::prev(free_.end());
    munmap(largest->second, largest->first);
    cached_ -= largest->first;
    free_.erase(largest);
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  live_ += size;
  high_water_ = std::max(high_water_, live_);
  return p;
}

void HostBlockCache::give(void* ptr, size_t bytes) {
  const size_t size = rounded(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  live_ -= size;
  free_.emplace(size, ptr);
  cached_ += size;
}

size_t HostBlockCache::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached_;
}

size_t HostBlockCache::live_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_;
}

// The one place the sanitizer build differs (tests/sanitize.sh): GCC defines
// __SANITIZE_ADDRESS__, clang answers __has_feature(address_sanitizer).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
constexpr bool kAddressSanitizer = __has_feature(address_sanitizer);
#else
constexpr bool kAddressSanitizer = false;
#endif

bool HostRuntime::uses_block_cache() { return !kAddressSanitizer; }

HostRuntime::HostRuntime(MemoryTracker& tracker) : tracker_(tracker) { keep_freed_host_memory(); }

void* HostRuntime::allocate(size_t bytes, MemCategory category, Stream) {
  void* p = cached(bytes) ? blocks_.take(bytes) : aligned_host_alloc(bytes);
  tracker_.on_alloc(category, bytes);
  return p;
}

void HostRuntime::deallocate(void* ptr, size_t bytes, MemCategory category, Stream) {
  tracker_.on_free(category, bytes);
  if (cached(bytes))
    blocks_.give(ptr, bytes);
  else
    std::free(ptr);
}

void* HostRuntime::allocate_pinned(size_t bytes) { return aligned_host_alloc(bytes); }

void HostRuntime::free_pinned(void* ptr) { std::free(ptr); }

void HostRuntime::copy_async(void* dst, const void* src, size_t bytes, CopyKind, Stream) {
  if (bytes) std::memmove(dst, src, bytes);
}

void HostRuntime::memset_async(void* dst, int value, size_t bytes, Stream) {
  if (bytes) std::memset(dst, value, bytes);
}

std::unique_ptr<Event> HostRuntime::record(Stream) { return std::make_unique<DoneEvent>(); }

Kernels& HostRuntime::kernels() { return *kernels_; }

}  // namespace fsdp
