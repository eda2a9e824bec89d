#pragma once
// MPI start-up and shutdown as an RAII owner. MPI is the bootstrap for every backend: ranks,
// sizes and (later) address exchange. Works alone (singleton init), under mpirun and srun.
#include <mpi.h>

#include <vector>

namespace fsdp {

// Owns an MPI_Comm: freed on destruction unless MPI is already finalized. Every backend that
// keeps a private communicator (duplicates, splits) holds it in one of these.
class MpiCommHandle {
 public:
  explicit MpiCommHandle(MPI_Comm comm) : comm_(comm) {}
  ~MpiCommHandle();
  MpiCommHandle(const MpiCommHandle&) = delete;
  MpiCommHandle& operator=(const MpiCommHandle&) = delete;
  MPI_Comm get() const { return comm_; }

 private:
  MPI_Comm comm_;
};

class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Ends every rank of the job at once: a fatal error on one rank must not leave the others
  // waiting in a collective forever.
  [[noreturn]] void abort(int code) const;
  // Ranks sharing a node (MPI_COMM_TYPE_SHARED): node_color is the world rank of the node's first
  // rank, equal on every rank of the node; local_rank is the rank within the node.
  int node_color() const { return node_color_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  // node_color of every world rank, in rank order (gathered at start-up).
  const std::vector<int>& node_color_of_rank() const { return node_colors_; }

 private:
  int rank_ = 0;
  int size_ = 1;
  int node_color_ = 0, local_rank_ = 0, local_size_ = 1;
  std::vector<int> node_colors_;
};

}  // namespace fsdp
