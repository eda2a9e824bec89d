#pragma once
// The MPI backend: non-blocking MPI-3 collectives on a private duplicate of the bootstrap
// communicator, user-defined ops for bf16/f16 (mpi_types.h: f32 arithmetic, one rounding per
// op). When all ranks share one node, reduce_scatter and all_reduce run our own shared-memory
// pipeline (mpi_shm.h) instead of OpenMPI's, where it measured faster (table in mpi_comm.cpp).
// With device pointers (device_path(): a CUDA-aware Open MPI, or comm.device_buffers: direct) every
// collective is MPI's blocking one on the caller's buffers, as the library supports device memory
// only there (Open MPI 4.1's coll/cuda stages the reductions itself; its non-blocking collectives
// take no device buffers), and nothing of this backend touches the buffers on the host.
#include <mpi.h>

#include <functional>
#include <memory>

#include "comm/comm.h"
#include "comm/mpi_env.h"
#include "comm/watchdog.h"
#include "mpi/mpi_shm.h"
#include "mpi/mpi_types.h"

namespace fsdp {

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(MPI_Comm owned, std::shared_ptr<MpiHalfTypes> types, std::shared_ptr<ShmProgress> progress,
                  std::shared_ptr<Watchdog> watchdog, const CommOptions& options, DevicePath path);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;  // owns its MPI communicator
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;
  std::string_view backend() const override { return "mpi"; }
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
  // An MPI-3 shared window (MPI_Win_allocate_shared), when every rank is on this node and
  // /dev/shm has room for it; rank 0's segment holds it all, so it is contiguous.
  std::unique_ptr<NodeSharedMemory> share_node_memory(size_t bytes) override;
  MPI_Comm comm() const { return comm_.get(); }
  // Whether reduce_scatter/all_reduce may use the node-local shared-memory pipeline.
  bool shared_memory() const { return shm_ != nullptr; }
  DevicePath device_path() const override { return path_; }

 private:
  CollectiveDesc describe(const char* collective, size_t count, DType dtype);
  template <class Call>
  std::unique_ptr<Work> blocking(const CollectiveDesc& desc, Call call, const std::function<void()>& finish = {});
  MpiCommHandle comm_;
  std::shared_ptr<MpiHalfTypes> types_;
  std::shared_ptr<ShmProgress> progress_;
  std::shared_ptr<Watchdog> watchdog_;  // the deadline of blocking calls, shared by the splits
  int rank_ = 0, size_ = 1;
  DevicePath path_;
  bool device_pointers_ = false;     // path_.direct_moves: MPI's blocking collectives only, no pipeline
  std::unique_ptr<ShmChannel> shm_;  // declared last: its window is freed before the comms
};

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm bootstrap, const CommOptions& options);

}  // namespace fsdp
