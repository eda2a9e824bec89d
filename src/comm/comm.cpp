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

std::string CollectiveDesc::text() const {
  return backend + " " + collective + " #" + std::to_string(seq) + " (count " + std::to_string(count) + ", " +
         std::string(dtype_name(dtype)) + ")";
}

void PollingWork::wait() {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
  // Spin briefly for short collectives, then yield, then sleep: a rank that waits must give its
  // core to the rank it waits for when they share one (oversubscribed runs, CI).
  for (uint64_t polls = 0; !test(); ++polls) {
    if (polls < 64) continue;
    if (polls < 4096) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if ((polls & 63) == 0 && Clock::now() > deadline) {
      char secs[32];
      std::snprintf(secs, sizeof secs, "%g", timeout_s_);
      throw CommTimeout(desc_.text() + " did not complete within comm.timeout_s = " + secs +
                        " s (a rank may have failed or skipped this collective)");
    }
  }
}

void PollingWork::wait_on(Stream) { wait(); }

std::vector<std::string> built_backends() {
  std::vector<std::string> names;
  for (const BackendEntry& e : backend_table()) names.emplace_back(e.name);
  return names;
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
    return wrap_for_device(std::move(comm), *options.runtime, e.device_aware && e.device_aware());
  }
  throw Error("comm.backend '" + backend + "' is not built in this binary (built: " + built + ")");
}

}  // namespace fsdp
