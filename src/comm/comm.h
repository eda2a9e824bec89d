#pragma once
// The collective layer: one interface, several backends (backends/mpi, ucx, nccl) chosen at run
// time by name. The boundary is whole collectives, not send/recv, so NCCL runs its own
// algorithms. Every call returns a Work handle at once; every wait has a timeout whose message
// names the backend, collective, count, dtype and the communicator's sequence number.
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/device.h"  // Stream
#include "tensor/dtype.h"
#include "tensor/error.h"

namespace fsdp {

enum class ReduceOp : uint8_t { sum, avg, max, min };
std::string_view reduce_op_name(ReduceOp op);

// Thrown when a wait outlives comm.timeout_s: names what hung so a user can tell which rank
// and which collective to look at.
class CommTimeout : public Error {
 public:
  using Error::Error;
};

struct CommOptions {
  double timeout_s = 300.0;
  // The process's device runtime (not owned; outlives the communicator), or null for host
  // buffers only. On a cuda runtime, backends without native device buffers (all but nccl) are
  // wrapped by make_communicator to accept that device's buffers (comm/device_comm.h).
  DeviceRuntime* runtime = nullptr;
};

// What a handle describes in messages: "mpi reduce_scatter #17 (count 4096, bf16)".
struct CollectiveDesc {
  std::string backend;
  std::string collective;
  size_t count = 0;
  DType dtype = DType::f32;
  uint64_t seq = 0;
  std::string text() const;
};

class Work {
 public:
  virtual ~Work() = default;
  virtual bool test() = 0;           // non-blocking poll; true once complete
  virtual void wait() = 0;           // host blocks, at most timeout_s; then CommTimeout
  virtual void wait_on(Stream) = 0;  // a device stream waits, the host does not
};

// Work whose wait() polls test() until done or the deadline, yielding the core between polls so
// oversubscribed ranks make progress. Backends implement test() only.
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
  // any other is wrapped (comm/device_comm.h), passing device pointers to the library when
  // device_aware() says it reads device memory (a CUDA-aware MPI), staging them otherwise.
  bool device_native = false;
  bool (*device_aware)() = nullptr;  // null: never
};
std::vector<BackendEntry> backend_table();

}  // namespace fsdp
