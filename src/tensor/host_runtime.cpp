#include "tensor/host_runtime.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "tensor/kernels.h"

namespace fsdp {

namespace {

// Host work is complete when it returns: every event is already reached.
class DoneEvent final : public Event {
 public:
  bool done() const override { return true; }
};

void* aligned_bytes(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;  // as Buffer: 64-byte alignment for the vector loops
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (!p) throw std::bad_alloc();
  return p;
}

}  // namespace

void* HostRuntime::allocate(size_t bytes, MemCategory category, Stream) {
  void* p = aligned_bytes(bytes);
  tracker_.on_alloc(category, bytes);
  return p;
}

void HostRuntime::deallocate(void* ptr, size_t bytes, MemCategory category, Stream) {
  tracker_.on_free(category, bytes);
  std::free(ptr);
}

void* HostRuntime::allocate_pinned(size_t bytes) { return aligned_bytes(bytes); }

void HostRuntime::free_pinned(void* ptr) { std::free(ptr); }

void HostRuntime::copy_async(void* dst, const void* src, size_t bytes, CopyKind, Stream) {
  if (bytes) std::memmove(dst, src, bytes);
}

void HostRuntime::memset_async(void* dst, int value, size_t bytes, Stream) {
  if (bytes) std::memset(dst, value, bytes);
}

std::unique_ptr<Event> HostRuntime::record(Stream) { return std::make_unique<DoneEvent>(); }

Kernels& HostRuntime::kernels() { return cpu_kernels(); }

}  // namespace fsdp
