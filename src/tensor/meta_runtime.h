#pragma once
// The meta device: a DeviceRuntime that charges the MemoryTracker exactly as the real runtimes
// do and computes nothing. fsdp_app --plan runs the real trainer, engine and layers on it (with
// comm/meta_comm.h's communicator), so the memory plan is the real code's own accounting, not a
// hand-written mirror of it.
//
//  - device() is the device being planned for (cpu or cuda): the run takes that device's code
//    paths (staging copies, host shards), and so charges what that device's run charges.
//  - Memory is address space only: anonymous mappings with MAP_NORESERVE, zero pages until a
//    host write touches them. Kernels never write, so a plan of a model far larger than this
//    machine commits only the pages host code writes (a batch of data, a scalar).
//  - With a timeline, kernels cost their FLOPs and bytes at the planned device's rates.
//  - Kernels do nothing; those returning host values return zeros (sum 0, all finite). Copies
//    move no bytes; a device-to-host copy leaves zeros in its destination (host reads of device
//    values see zeros).
#include <memory>

#include "tensor/device.h"

namespace fsdp {

class Timeline;

// timeline: a timed plan's clock (tensor/timeline.h), which every kernel, copy, event and wait
// then advances; null for a memory plan.
std::unique_ptr<DeviceRuntime> make_meta_runtime(Device planned, MemoryTracker& tracker, Timeline* timeline = nullptr);

}  // namespace fsdp
