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
