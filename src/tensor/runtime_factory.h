#pragma once
// What tensor/cuda (a CUDA build) or tensor/nocuda (a build without it) provides to
// make_runtime (device.cpp). Meson compiles exactly one of the two folders: no #ifdef.
#include <memory>
#include <string>

#include "tensor/device.h"

namespace fsdp {

// The runtime of GPU (local_rank % device count). Throws Error with the reason when there is none.
std::unique_ptr<DeviceRuntime> make_cuda_runtime(MemoryTracker& tracker, int local_rank);
bool cuda_built_impl();
int cuda_device_count_impl(std::string* why_none);

}  // namespace fsdp
