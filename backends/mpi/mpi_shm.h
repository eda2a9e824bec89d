#pragma once
// Node-local reductions over an MPI-3 shared-memory window, for communicators whose ranks all
// share one node. OpenMPI 4.1's reduce_scatter (libnbc/tuned) moves every byte through
// point-to-point messages and reduces pairwise; measured on a 2-core node it runs at a tenth of
// memcpy. Here each rank stages the pieces its peers need into a ring of chunk slots in the
// window, and every rank reduces its own slice straight from all ranks' slots, n inputs at once
// in f32, rounding once (mpi_reduce.h). Chunks pipeline: a rank reduces chunk k while its peers
// stage chunk k+1. all_reduce adds a result ring: each rank publishes its reduced chunk there and
// copies the peers' reduced chunks out of it.
//
// Non-blocking: enqueue returns at once; the copies and the reduction run inside progress(),
// which every Work of the backend calls from test()/wait() on the caller's thread. Operations
// of one channel form a FIFO in issue order; all ranks issue collectives in the same order, so
// the global chunk numbering (and hence which ring slot holds what) agrees across ranks, and a
// later collective never overwrites a slot an earlier one still reads, whatever order the
// caller completes its handles in.
#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"

namespace fsdp {

class ShmChannel;

// Collective over comm: whether all its ranks run on this node (the same answer on every rank).
bool all_on_one_node(MPI_Comm comm);
// Bytes free in /dev/shm, where Open MPI backs shared windows with sparse files: touching a page
// past a full tmpfs (Docker's default is 64 MiB) is a SIGBUS, not an error code. SIZE_MAX when
// it cannot be read.
size_t dev_shm_free_bytes();

// Collective over comm: whether its ranks on this node outnumber the CPUs they may run on (the
// union of their affinity masks, so --bind-to core and --bind-to none both count right).
bool node_oversubscribed(MPI_Comm comm);

// Every live channel of one backend instance (a communicator and all communicators split from
// it). A Work's test() advances all of them: a rank waiting on one communicator must still do
// its part of a collective on another, or a peer waiting on that one would wait forever.
class ShmProgress {
 public:
  explicit ShmProgress(bool oversubscribed) : oversubscribed_(oversubscribed) {}
  // More ranks of the job on this node than CPUs they may run on: waits yield at once.
  bool oversubscribed() const { return oversubscribed_; }
  void add(ShmChannel* channel) { channels_.push_back(channel); }
  void remove(ShmChannel* channel);
  // Advances every channel as far as it can without blocking; true when anything moved.
  bool progress_all();
  bool busy() const { return busy_ops_ > 0; }

 private:
  friend class ShmChannel;
  std::vector<ShmChannel*> channels_;
  bool oversubscribed_;
  size_t busy_ops_ = 0;  // queued ops over all channels: an idle poll costs one compare
};

// One queued collective. Rank r's slice is [offsets[r], offsets[r+1]) of the full buffer.
//   reduce_scatter: in = full input; the reduced slice goes to `mine`.
//   all_reduce:     in = full input; the reduced slice goes to `mine` (inside `full`), every
//                   rank's reduced slice is then copied from the result ring into `full`.
struct ShmOp {
  enum class Kind : uint8_t { reduce_scatter, all_reduce };
  Kind kind = Kind::reduce_scatter;
  const char* in = nullptr;
  char* mine = nullptr;
  char* full = nullptr;
  std::vector<size_t> offsets;  // size n+1
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  size_t esize = 0;
  size_t chunk_count = 0;  // elements per slice per chunk
  uint64_t nchunks = 0;
  uint64_t first_chunk = 0;  // global chunk number of chunk 0 in this channel
  uint64_t written = 0, reduced = 0, gathered = 0;
  bool done = false;
  ShmChannel* channel = nullptr;  // while queued; null once done or dropped
};

class ShmChannel {
 public:
  // Collective over comm. Null when the ranks do not all share one node, when comm has one
  // rank, or when the window cannot be allocated (the caller then stays on MPI collectives).
  static std::unique_ptr<ShmChannel> create(MPI_Comm comm, std::shared_ptr<ShmProgress> progress);
  ~ShmChannel();
  ShmChannel(const ShmChannel&) = delete;
  ShmChannel& operator=(const ShmChannel&) = delete;

  // Queues a collective (see ShmOp; offsets and dtype equal on every rank). Throws if an earlier
  // collective on this channel was abandoned.
  std::shared_ptr<ShmOp> enqueue(ShmOp::Kind kind, const void* in, void* mine, void* full, std::vector<size_t> offsets,
                                 DType dtype, ReduceOp op);
  bool progress();  // non-blocking; true when a chunk moved
  // A handle destroyed while its op is incomplete (after a timeout): the ring is out of step with
  // the peers for good, so later collectives on this channel fail instead of reading garbage.
  void poison(const std::string& why);
  bool idle() const { return queue_.empty(); }
  int size() const { return size_; }

 private:
  ShmChannel() = default;
  struct alignas(64) Counter {
    std::atomic<uint64_t> value;
    char pad[64 - sizeof(std::atomic<uint64_t>)];
  };
  // Per-rank progress in global chunk numbers (each counts chunks, so it only grows). Every op
  // passes every chunk through all four steps, trivially where its kind has nothing to do.
  struct Control {
    Counter posted;    // staged its pieces for the peers
    Counter consumed;  // finished reading the peers' staged pieces (staging slot reusable)
    Counter reduced;   // published its result chunk in the result ring
    Counter gathered;  // finished reading the peers' result chunks (result slot reusable)
  };
  static constexpr size_t kControlBytes = 4096;  // keeps the ring page-aligned

  Control* control(int r) const { return reinterpret_cast<Control*>(bases_[r]); }
  char* slot(int writer, uint64_t chunk) const;
  char* piece(int writer, uint64_t chunk, int dest) const;
  char* result(int writer, uint64_t chunk) const;
  bool try_write(ShmOp& op);
  bool try_reduce(ShmOp& op);
  bool try_gather(ShmOp& op);
  // Lower bound of a counter over the ranks (peers only, or all), refreshed only when `need`
  // is not yet met: most polls read no shared line.
  bool reached(Counter Control::*counter, uint64_t& cached, uint64_t need, bool include_self);

  std::shared_ptr<ShmProgress> progress_;
  MPI_Win win_ = MPI_WIN_NULL;
  int rank_ = 0, size_ = 1;
  std::vector<char*> bases_;  // each rank's segment, mapped here
  size_t slots_ = 0;          // ring depth
  size_t piece_bytes_ = 0;    // one destination's part of one chunk
  uint64_t next_chunk_ = 0;   // global numbering of the next op's first chunk
  uint64_t min_consumed_ = 0, min_posted_ = 0, min_reduced_ = 0, min_gathered_ = 0;
  std::deque<std::shared_ptr<ShmOp>> queue_;
  std::string poisoned_;
};

}  // namespace fsdp
