#pragma once
// The cpu DeviceRuntime: host memory charged to the tracker, the calling thread as the only
// stream (every enqueue has finished when it returns, every event is complete), host kernels.
#include <memory>

#include "tensor/device.h"
#include "tensor/kernels.h"

namespace fsdp {

class HostRuntime final : public DeviceRuntime {
 public:
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
  MemoryTracker& tracker_;
  std::unique_ptr<Kernels> kernels_ = make_cpu_kernels();  // its own: the matmul precision is per runtime
};

}  // namespace fsdp
