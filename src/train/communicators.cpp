#include "train/communicators.h"

#include "comm/local.h"
#include "config/config.h"
#include "tensor/device.h"

namespace fsdp {

RunCommunicators make_run_communicators(
    const Config& c, MPI_Comm comm, DeviceRuntime& runtime, bool with_world,
    const std::function<std::unique_ptr<Communicator>(std::unique_ptr<Communicator>)>& decorate) {
  RunCommunicators r;
  const bool device = runtime.device() != Device::cpu;
  if (with_world) {
    if (comm == MPI_COMM_NULL)
      r.world = make_local_communicator({c.comm.timeout_s});
    else
      r.world = make_communicator(device ? "mpi" : c.comm.backend, comm, {c.comm.timeout_s});
    if (decorate) r.world = decorate(std::move(r.world));
  }
  if (device && comm != MPI_COMM_NULL)
    r.device = make_communicator(c.comm.backend, comm, {c.comm.timeout_s, &runtime, c.comm.device_buffers});
  return r;
}

}  // namespace fsdp
