#pragma once
// The UCX backend: collectives built from UCP tagged messages, driven as non-blocking state
// machines. One ucp_worker per communicator (its own tag space and progress engine), endpoints to
// every peer; rings for all_gather, reduce_scatter and all_reduce (= reduce_scatter + all_gather
// on the same buffer), a pipelined chain for broadcast, dissemination for barrier. Large
// messages move in chunks so receiving chunk k+1, reducing chunk k and sending proceed together.
//
// Tags are 64 bits: [communicator id 8 | sequence number 24 | phase 4 | message 28], message =
// step * lanes + chunk. Every (receiver, tag) has one sender, so concurrent collectives on one
// communicator never match each other's messages; split communicators have their own workers.
//
// Progress is family-wide (a communicator and its splits share one ucp_context): testing any
// collective progresses every worker and advances every collective in flight, as MPI does, so
// ranks may wait on concurrent collectives in different orders. A collective completes only
// after a one-byte "done" exchange with its ring neighbours, so no rank stops progressing
// while a neighbour still needs it. wait() backs off (yield, then sleep) only after ~1000
// polls without UCX events.
//
// bf16/f16 sum and avg accumulate in f32 along the ring: the partial sums travel as f32 and the
// owner of a block rounds once at the end (avg divides before that rounding). The
// reduce-scatter phase of a half-precision sum therefore moves f32 (twice the bytes of the
// payload); the all-gather phase of all_reduce moves the rounded half values. max/min are exact
// in any precision and move in the payload's own type.
#include <mpi.h>

#include <cstdint>
#include <memory>

#include "comm/comm.h"
#include "comm/mpi_env.h"
#include "ucx/ucx_resources.h"

namespace fsdp {

class UcxWork;  // ucx_comm.cpp

// Chunking, the same on every rank (rank 0's values are broadcast at creation);
// FSDP_UCX_CHUNK_BYTES and FSDP_UCX_LANES override the defaults. Measured with f32 16 MiB
// all_reduce/reduce_scatter at np 2 and 4 over shared memory on the 2-core development host
// (noisy, shared): 512 KiB x 8 lanes beat 128 KiB-1 MiB chunks with 2 or 4 lanes.
// Staging per reduce_scatter/all_reduce in flight: 2 * lanes * chunk_bytes = 8 MiB at most.
struct UcxTuning {
  size_t chunk_bytes = size_t{512} << 10;  // largest message of a ring step (the staging slot size)
  size_t lanes = 8;                        // chunks a reduce-scatter keeps in flight (2 slots each)
};

class UcxCommunicator : public Communicator {
 public:
  // Collective over `owned` (address exchange); takes ownership of it.
  UcxCommunicator(MPI_Comm owned, std::shared_ptr<ucx::Context> context, const CommOptions& options, UcxTuning tuning,
                  uint8_t id, DevicePath path);
  ~UcxCommunicator() override;  // collective: closes endpoints, fences
  UcxCommunicator(const UcxCommunicator&) = delete;
  UcxCommunicator& operator=(const UcxCommunicator&) = delete;
  std::string_view backend() const override { return "ucx"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::unique_ptr<Communicator> split(int color, int key) const override;
  std::unique_ptr<Work> all_gather(const void* in, void* out, size_t count, DType dtype, Stream stream) override;
  std::unique_ptr<Work> reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                                       Stream stream) override;
  std::unique_ptr<Work> all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                                   Stream stream) override;
  std::unique_ptr<Work> broadcast(void* buf, size_t count, DType dtype, int root, Stream stream) override;
  void barrier() override;
  // Device memory goes to UCX for all_gather and broadcast when its context moves CUDA memory;
  // reduce_scatter and all_reduce stay staged: the rings reduce on the host.
  DevicePath device_path() const override { return path_; }

 private:
  CollectiveDesc describe(const char* collective, size_t count, DType dtype);
  std::unique_ptr<UcxWork> make_work(CollectiveDesc desc) const;

  MpiCommHandle comm_;  // first: freed last; the bootstrap duplicate (address exchange, splits, fence)
  std::shared_ptr<ucx::Context> context_;
  std::shared_ptr<ucx::Worker> worker_;
  UcxTuning tuning_;
  int rank_ = 0, size_ = 1;
  uint8_t id_ = 0;
  DevicePath path_;
  mutable uint32_t splits_ = 0;  // same on every rank: split is collective
};

std::unique_ptr<Communicator> make_ucx_communicator(MPI_Comm bootstrap, const CommOptions& options);

}  // namespace fsdp
