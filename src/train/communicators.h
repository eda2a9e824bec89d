#pragma once
// The run's communicators, made in one place.
//  - world: host values (losses, agreements, metrics, node colors). comm.backend on a cpu run; on
//    a device run MPI (NCCL cannot carry host values, and every backend bootstraps from MPI).
//  - device: a device run's FSDP data plane, comm.backend over the device's buffers (NCCL
//    natively, MPI/UCX through comm/device_comm.h). Null on a cpu run, whose FSDP groups split
//    from the world.
// Without MPI (MPI_COMM_NULL: in-process tests and tools) the world is a local one-rank
// communicator.
#include <mpi.h>

#include <functional>
#include <memory>

#include "comm/comm.h"

namespace fsdp {

struct Config;
class DeviceRuntime;

struct RunCommunicators {
  std::unique_ptr<Communicator> world;   // null when with_world was false
  std::unique_ptr<Communicator> device;  // null on a cpu run
};

// decorate: applied to the world once made (fsdp_app's test fault injection); may be empty.
RunCommunicators make_run_communicators(
    const Config& config, MPI_Comm comm, DeviceRuntime& runtime, bool with_world,
    const std::function<std::unique_ptr<Communicator>(std::unique_ptr<Communicator>)>& decorate = {});

}  // namespace fsdp
