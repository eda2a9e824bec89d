#include "comm/comm.h"

#include <sched.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <utility>

#include "comm/device_comm.h"

namespace fsdp {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

std::string CollectiveDesc::text(std::string_view purpose) const {
  std::string named = backend + " " + collective;
  if (!purpose.empty()) named.append(" ").append(purpose);
  return named + " #" + std::to_string(seq) + " (count " + std::to_string(count) + ", " +
         std::string(dtype_name(dtype)) + ")";
}

namespace {

std::string timeout_text(const CollectiveDesc& desc, double timeout_s, std::string_view purpose) {
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", timeout_s);
  return desc.text(purpose) + " did not complete within comm.timeout_s = " + secs +
         " s (a rank may have failed or skipped this collective)";
}

}  // namespace

CommTimeout::CommTimeout(const CollectiveDesc& desc, double timeout_s, std::string_view purpose)
    : Error(timeout_text(desc, timeout_s, purpose)),
      desc_(std::make_shared<const CollectiveDesc>(desc)),
      timeout_s_(timeout_s) {}

CommTimeout CommTimeout::for_purpose(std::string_view purpose) const {
  if (!desc_) return CommTimeout(std::string(purpose) + ": " + what());
  return {*desc_, timeout_s_, purpose};
}

namespace wait_detail {

void throw_timeout(const CollectiveDesc& desc, double timeout_s) { throw CommTimeout(desc, timeout_s); }

void yield_core() { sched_yield(); }

void idle_sleep() { std::this_thread::sleep_for(std::chrono::microseconds(50)); }

}  // namespace wait_detail

void PollingWork::wait() {
  poll_until_deadline(desc_, timeout_s_, WaitBackoff{}, [this] { return PollResult{test(), false}; });
}

void PollingWork::wait_on(Stream) { wait(); }

std::vector<std::string> built_backends() {
  std::vector<std::string> names;
  for (const BackendEntry& e : backend_table()) names.emplace_back(e.name);
  return names;
}

std::optional<BackendEntry> find_backend(const std::string& backend) {
  for (const BackendEntry& e : backend_table())
    if (backend == e.name) return e;
  return std::nullopt;
}

DevicePath choose_device_path(DeviceBuffers setting, const LibraryDeviceSupport& library,
                              const std::string& reductions_why_staged) {
  DevicePath path;
  if (setting == DeviceBuffers::staged) {
    path.text = "pinned staging: comm.device_buffers is staged";
    return path;
  }
  if (setting == DeviceBuffers::automatic && !library.reads_device_memory) {
    path.text = "pinned staging: " + library.why_not;
    return path;
  }
  path.direct_moves = true;
  path.direct_reductions = reductions_why_staged.empty();
  path.text = "device pointers (";
  if (setting == DeviceBuffers::direct)
    path.text += "comm.device_buffers is direct; " +
                 (library.reads_device_memory ? library.library : library.why_not + ": passed as asked");
  else
    path.text += library.library;
  path.text += ")";
  if (!path.direct_reductions) path.text += "; reductions through pinned staging: " + reductions_why_staged;
  return path;
}

DevicePath agree_device_path(DevicePath path, MPI_Comm comm) {
  int direct[2] = {path.direct_moves ? 1 : 0, path.direct_reductions ? 1 : 0};
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-cstyle-cast): Open MPI's MPI_IN_PLACE is ((void*)1)
  MPI_Allreduce(MPI_IN_PLACE, direct, 2, MPI_INT, MPI_MIN, comm);
  if (!path.direct_moves) return path;  // the least direct already, with its own reason
  if (direct[0] == 0) return {false, false, "pinned staging: another rank's library takes no device memory"};
  if (path.direct_reductions && direct[1] == 0) {
    path.direct_reductions = false;
    path.text += "; reductions through pinned staging: another rank's backend reduces on the host";
  }
  return path;
}

std::unique_ptr<Communicator> make_communicator(const std::string& backend, MPI_Comm bootstrap,
                                                const CommOptions& options) {
  std::string built;
  for (const BackendEntry& e : backend_table()) {
    if (backend != e.name) {
      built += (built.empty() ? "" : ", ") + std::string(e.name);
      continue;
    }
    std::unique_ptr<Communicator> comm = e.make(bootstrap, options);
    if (!options.runtime || options.runtime->device() != Device::cuda || e.device_native) return comm;
    const DevicePath path = comm->device_path();
    return wrap_for_device(std::move(comm), *options.runtime, path);
  }
  throw Error("comm.backend '" + backend + "' is not built in this binary (built: " + built + ")");
}

}  // namespace fsdp
