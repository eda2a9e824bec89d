#pragma once
// The run's data: the datasets a config names, loaded by every rank with the outcome agreed on,
// and this rank's slice of a global batch in the buffers the model reads.
#include <cstdint>
#include <memory>
#include <span>

#include "tensor/tensor.h"

namespace fsdp {

struct Config;
class Communicator;
class Dataset;
class DeviceRuntime;
class MemoryTracker;

struct Datasets {
  std::shared_ptr<const Dataset> train, eval;
};

// Every rank loads; every rank fails with the first failing rank's message (comm/agree.h).
Datasets load_data_agreed(const Config& c, Communicator& world);

// Everything the loop needs for one batch: this rank's slice of a global batch, in the
// buffers the model reads.
struct BatchBuffers {
  Tensor inputs, targets;
};

void load_batch(const Dataset& data, std::span<const int64_t> indices, BatchBuffers& b, MemoryTracker* mem);
// A device run's copy of the host batch (the host batch itself on a host runtime).
const BatchBuffers& upload_batch(DeviceRuntime& rt, const BatchBuffers& host, BatchBuffers& dev);

}  // namespace fsdp
