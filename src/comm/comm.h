#pragma once
// The collective layer: one interface, several backends (backends/mpi, ucx, nccl) chosen at run
// time by name. The boundary is whole collectives, not send/recv, so NCCL runs its own
// algorithms. Every call returns a Work handle at once; every wait has a timeout whose message
// names the backend, collective, count, dtype and the communicator's sequence number.
#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/device_buffers.h"
#include "tensor/device.h"  // Stream
#include "tensor/dtype.h"
#include "tensor/error.h"

namespace fsdp {

enum class ReduceOp : uint8_t { sum, avg, max, min };
std::string_view reduce_op_name(ReduceOp op);

struct CollectiveDesc;

// Thrown when a wait outlives comm.timeout_s: names what hung so a user can tell which rank
// and which collective to look at.
class CommTimeout : public Error {
 public:
  using Error::Error;  // a timeout worded by its thrower (device events)
  // "mpi all_gather #84 (count 80, f32) did not complete within comm.timeout_s = 20 s (...)";
  // purpose, when given, follows the collective's name ("of unit blocks.3 (backward)").
  CommTimeout(const CollectiveDesc& desc, double timeout_s, std::string_view purpose = {});
  // The same timeout, its message naming what the collective was for: the FSDP engine adds the
  // unit and phase, which the collective layer does not know. A timeout worded by its thrower
  // gets the purpose in front.
  CommTimeout for_purpose(std::string_view purpose) const;

 private:
  // shared_ptr: an exception's copy must not throw.
  std::shared_ptr<const CollectiveDesc> desc_;
  double timeout_s_ = 0;
};

struct CommOptions {
  double timeout_s = 300.0;
  // The process's device runtime (not owned; outlives the communicator), or null for host
  // buffers only. On a cuda runtime, backends without native device buffers (all but nccl) are
  // wrapped by make_communicator to accept that device's buffers (comm/device_comm.h).
  DeviceRuntime* runtime = nullptr;
  DeviceBuffers device_buffers = DeviceBuffers::automatic;
};

// Whether a backend's library reads and writes device memory itself, asked at run time (the
// library loaded may differ from the headers built against). `library` names it for messages
// ("CUDA-aware Open MPI v4.1.4"); `why_not` says why it does not.
struct LibraryDeviceSupport {
  bool reads_device_memory = false;
  std::string library;
  std::string why_not;
};

// How a backend takes device buffers (comm/device_comm.h applies it): device pointers straight
// to the library for the data movers (all_gather, broadcast) and for the reductions
// (reduce_scatter, all_reduce with sum, max, min), or pinned host staging. `text` is what the
// run prints: "device pointers (CUDA-aware Open MPI v4.1.4)", "pinned staging: <why>".
struct DevicePath {
  bool direct_moves = false;
  bool direct_reductions = false;
  std::string text;
};
// The rule for every host-data-plane backend: `setting` against what the library says;
// `reductions_why_staged` non-empty when the backend itself reduces on the host (its reductions
// stay staged even with device pointers for the movers).
DevicePath choose_device_path(DeviceBuffers setting, const LibraryDeviceSupport& library,
                              const std::string& reductions_why_staged = {});
// Collective over `comm`: every rank takes the same path (a backend's algorithms may depend on
// it), the least direct one any rank chose; a rank that loses its device pointers says why.
DevicePath agree_device_path(DevicePath path, MPI_Comm comm);

// What a handle describes in messages: "mpi reduce_scatter #17 (count 4096, bf16)".
struct CollectiveDesc {
  std::string backend;
  std::string collective;
  size_t count = 0;
  DType dtype = DType::f32;
  uint64_t seq = 0;
  // purpose, when given, follows the collective's name: "mpi all_gather of unit blocks.3
  // (forward) #84 (count 80, f32)".
  std::string text(std::string_view purpose = {}) const;
};

// What one poll of a wait saw: the collective is done; else whether anything moved. Backends
// whose progress reports events (UCX, MPI's shared-memory pipeline) say so, and the wait's idle
// clock restarts; a poll that cannot tell says false, and the wait backs off by its age.
struct PollResult {
  bool done = false;
  bool moved = false;
};

// How a wait hands its core over while nothing moves: it polls flat out until idle for at least
// spin_polls polls and spin_time, then yields after every poll until idle for yield_polls polls
// and yield_time, then sleeps 50 us per poll (a long wait, such as a peer still computing, costs
// no CPU). Yielding matters on oversubscribed nodes (CI, more ranks than cores): the rank waited
// for may need this core. There one yield can take a whole time slice, so a phase measured in
// polls lasts far longer than one measured in time: a rank that reaches the sleep phase after a
// few yields answers its peers late (UCX rings ran 5-11x slower at np=3 on 2 cores with UCX's
// thresholds as times instead of polls). The defaults are PollingWork's.
struct WaitBackoff {
  uint64_t spin_polls = 64;
  std::chrono::nanoseconds spin_time{0};
  uint64_t yield_polls = 4096;
  std::chrono::nanoseconds yield_time{0};
};

namespace wait_detail {
// poll_until_deadline's out-of-line parts.
[[noreturn]] void throw_timeout(const CollectiveDesc& desc, double timeout_s);
void yield_core();  // sched_yield
void idle_sleep();  // 50 us: a long wait costs next to no CPU, a completion is seen within ~50 us
}  // namespace wait_detail

// The one wait loop of the collective layer: calls poll() (returning PollResult) until it reports
// done; throws CommTimeout naming desc once timeout_s has passed. Backends keep their specifics
// in poll() (what to progress, what counts as moving) and in the backoff they pass. A template,
// so that poll() inlines: on an oversubscribed node the time an idle poll takes lengthens the
// spin phase, which is latency for the peer waiting for this core.
template <class Poll>
void poll_until_deadline(const CollectiveDesc& desc, double timeout_s, const WaitBackoff& backoff, Poll&& poll) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  // In double: a huge comm.timeout_s must not overflow the clock's integer nanoseconds.
  const auto deadline = start + std::chrono::duration<double>(timeout_s);
  // A backoff counted in polls reads the clock every 64th poll only: an idle poll can cost little
  // more than the read (UCX rings ran 1.75x slower at np=3 on 2 cores with a read per poll). One
  // with time thresholds reads it every poll, as the MPI backend's loop did.
  const bool timed = backoff.spin_time.count() > 0 || backoff.yield_time.count() > 0;
  auto now = start, idle_since = start;
  uint64_t idle_polls = 0;
  for (uint64_t polls = 1;; ++polls) {
    const PollResult r = poll();
    if (r.done) return;
    if (timed || (polls & 63) == 0) {
      now = Clock::now();
      if (now > deadline) wait_detail::throw_timeout(desc, timeout_s);
    }
    if (r.moved) {
      idle_since = now;
      idle_polls = 0;
      continue;
    }
    ++idle_polls;
    const auto idle = now - idle_since;
    if (idle_polls < backoff.spin_polls || idle < backoff.spin_time) continue;
    if (idle_polls < backoff.yield_polls || idle < backoff.yield_time) {
      wait_detail::yield_core();
    } else {
      wait_detail::idle_sleep();
    }
  }
}

class Work {
 public:
  virtual ~Work() = default;
  virtual bool test() = 0;           // non-blocking poll; true once complete
  virtual void wait() = 0;           // host blocks, at most timeout_s; then CommTimeout
  virtual void wait_on(Stream) = 0;  // a device stream waits, the host does not
};

// Work whose wait() polls test() until done or the deadline (poll_until_deadline, the default
// backoff), yielding the core between polls so oversubscribed ranks make progress. Backends
// implement test() only.
class PollingWork : public Work {
 public:
  PollingWork(CollectiveDesc desc, double timeout_s) : desc_(std::move(desc)), timeout_s_(timeout_s) {}
  void wait() override;
  void wait_on(Stream stream) override;  // host backends: the same as wait()
  const CollectiveDesc& desc() const { return desc_; }

 protected:
  CollectiveDesc desc_;
  double timeout_s_;
};

// A handle that is already complete (count 0, world size 1, blocking fallbacks).
class DoneWork : public Work {
 public:
  bool test() override { return true; }
  void wait() override {}
  void wait_on(Stream) override {}
};

// Memory that every rank of a communicator maps, when all its ranks share one node: the same
// bytes, each rank at its own address (fsdp.node_shared_params keeps the node's one copy of the
// gathered parameters there). Contents are undefined until written; ranks order their accesses
// with C++ atomics placed in it (a shared mapping's unified memory model). Freeing it is
// collective, as creating it was.
class NodeSharedMemory {
 public:
  virtual ~NodeSharedMemory() = default;
  virtual char* data() = 0;  // bytes() long, 64-byte aligned
  virtual size_t bytes() const = 0;
  // Polls ready() until it is true, keeping the backend's own collectives moving meanwhile (a peer
  // may be waiting for this rank's part of one); throws CommTimeout naming `what` after
  // comm.timeout_s.
  virtual void wait(const std::function<bool()>& ready, const std::string& what) = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string_view backend() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Collective over this communicator, like MPI_Comm_split: ranks with equal color form a group,
  // ordered by key. Used for FSDP's shard and replicate groups.
  virtual std::unique_ptr<Communicator> split(int color, int key) const = 0;
  // The same split when every rank knows the whole partition: color_of_rank[r] for every rank r
  // of this communicator (every rank passes the same vector); ranks keep their order. The meta
  // communicator (comm/meta_comm.h), which stands for one rank of a world that does not exist,
  // needs the whole partition to know its groups' sizes.
  virtual std::unique_ptr<Communicator> split_by(const std::vector<int>& color_of_rank) const {
    return split(color_of_rank.at(static_cast<size_t>(rank())), rank());
  }

  // count = elements per rank (nccl-tests convention). out holds size()*count elements for
  // all_gather; in holds size()*count for reduce_scatter. in == out + rank*count (all_gather)
  // or in == out (all_reduce) is in-place and allowed.
  virtual std::unique_ptr<Work> all_gather(const void* in, void* out, size_t count, DType dtype,
                                           Stream stream = {}) = 0;
  virtual std::unique_ptr<Work> reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                                               Stream stream = {}) = 0;
  virtual std::unique_ptr<Work> all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                                           Stream stream = {}) = 0;
  virtual std::unique_ptr<Work> broadcast(void* buf, size_t count, DType dtype, int root, Stream stream = {}) = 0;
  virtual void barrier() = 0;  // with the timeout
  // Collective: `bytes` that every rank of this communicator maps, or null on every rank when
  // they do not all share a node or the backend cannot map it (the default; the MPI backend maps
  // an MPI-3 shared window when /dev/shm has room).
  virtual std::unique_ptr<NodeSharedMemory> share_node_memory(size_t bytes) {
    (void)bytes;
    return nullptr;
  }
  // How this communicator takes buffers of options().runtime's device (comm/device_comm.h reads
  // it). The default: a backend that never reads device memory stages everything.
  virtual DevicePath device_path() const {
    return {false, false, "pinned staging: the " + std::string(backend()) + " backend takes host memory only"};
  }

  const CommOptions& options() const { return options_; }

 protected:
  explicit Communicator(CommOptions options) : options_(options) {}
  // Per-communicator sequence number for messages (and for tags in point-to-point backends).
  uint64_t next_seq() { return seq_++; }

 private:
  CommOptions options_;
  uint64_t seq_ = 0;
};

// The registry. Backends are compiled in by Meson when their dependencies are found; asking for
// one that was not built is an Error listing those that were.
std::vector<std::string> built_backends();
std::unique_ptr<Communicator> make_communicator(const std::string& backend, MPI_Comm bootstrap,
                                                const CommOptions& options);

// How backends register (backends/registry.cpp, generated by Meson, defines the table).
using CommunicatorFactory = std::unique_ptr<Communicator> (*)(MPI_Comm bootstrap, const CommOptions& options);
struct BackendEntry {
  const char* name = nullptr;
  CommunicatorFactory make = nullptr;
  // Device buffers (CommOptions::runtime on cuda): a native backend (nccl) takes them itself;
  // any other is wrapped (comm/device_comm.h) with the path its communicator's device_path()
  // chose.
  bool device_native = false;
  // share_node_memory can map memory the ranks of a node share (when they are on one node and
  // there is room): what a plan of fsdp.node_shared_params assumes for this backend.
  bool maps_node_memory = false;
};
// The registry's entry for `backend`, or nothing when this build has none of that name.
std::optional<BackendEntry> find_backend(const std::string& backend);
std::vector<BackendEntry> backend_table();

}  // namespace fsdp
