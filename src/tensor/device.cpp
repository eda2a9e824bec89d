#include "tensor/device.h"

#include <chrono>

#include "tensor/error.h"
#include "tensor/host_runtime.h"
#include "tensor/runtime_factory.h"

namespace fsdp {

std::unique_ptr<DeviceRuntime> make_runtime(Device device, MemoryTracker& tracker, int local_rank) {
  if (device == Device::cpu) return std::make_unique<HostRuntime>(tracker);
  return make_cuda_runtime(tracker, local_rank);
}

bool cuda_built() { return cuda_built_impl(); }

int cuda_device_count(std::string* why_none) { return cuda_device_count_impl(why_none); }

Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::cpu;
  if (name == "cuda") return Device::cuda;
  throw Error("unknown device '" + name + "' (cpu or cuda)");
}

HostTimedEvent::HostTimedEvent()
    : seconds_(std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count()) {}

std::unique_ptr<Event> DeviceRuntime::record_timed(Stream) { return std::make_unique<HostTimedEvent>(); }

double DeviceRuntime::elapsed_s(const Event& from, const Event& to) {
  const auto* a = dynamic_cast<const HostTimedEvent*>(&from);
  const auto* b = dynamic_cast<const HostTimedEvent*>(&to);
  if (!a || !b) throw Error("elapsed_s: events that record_timed did not make");
  return b->seconds() - a->seconds();
}

std::string_view device_name(Device device) { return device == Device::cpu ? "cpu" : "cuda"; }

namespace {
// All of src into dst, on the compute stream; returns when done, so a pageable source may be
// reused as soon as this returns.
Tensor copy_sync(DeviceRuntime& rt, Tensor dst, const Tensor& src, CopyKind kind) {
  if (dst.bytes()) {
    const Stream s = rt.compute_stream();
    rt.copy_async(dst.raw(), src.raw(), dst.bytes(), kind, s);
    rt.synchronize(s);
  }
  return dst;
}
}  // namespace

Tensor to_device(DeviceRuntime& rt, const Tensor& host, MemCategory category) {
  if (host.device() != Device::cpu) throw Error("to_device: the source tensor is not in host memory");
  return copy_sync(rt, Tensor::empty(rt, host.shape(), host.dtype(), category), host,
                   rt.device() == Device::cpu ? CopyKind::host_to_host : CopyKind::host_to_device);
}

Tensor to_host(DeviceRuntime& rt, const Tensor& dev, MemCategory category, MemoryTracker* tracker) {
  return copy_sync(rt, Tensor::empty(dev.shape(), dev.dtype(), category, tracker), dev,
                   dev.device() == Device::cpu ? CopyKind::host_to_host : CopyKind::device_to_host);
}

}  // namespace fsdp
