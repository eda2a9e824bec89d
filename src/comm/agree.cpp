#include "comm/agree.h"

#include "comm/comm.h"
#include "tensor/error.h"

namespace fsdp {

namespace {

// The three exchanges an agreement needs, over either transport.
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int min(int v) = 0;
  virtual int sum(int v) = 0;
  virtual void broadcast(std::string& text, int root) = 0;  // resized on the receivers
};

// This rank's outcome as the agreement of `ranks` ranks that all end alike.
Agreement alone(const std::string& error, int rank, int ranks) {
  if (error.empty()) return {-1, 0, ranks, ""};
  return {rank, ranks, ranks, error};
}

Agreement agree(Exchange& x, const std::string& error) {
  if (x.size() == 1) return alone(error, 0, 1);
  Agreement a;
  a.ranks = x.size();
  const int first = x.min(error.empty() ? x.size() : x.rank());
  if (first == x.size()) return a;
  a.first_failed = first;
  a.failed_ranks = x.sum(error.empty() ? 0 : 1);
  a.message = x.rank() == first ? error : std::string();
  x.broadcast(a.message, first);
  return a;
}

class MpiExchange final : public Exchange {
 public:
  explicit MpiExchange(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int min(int v) override { return reduce(v, MPI_MIN); }
  int sum(int v) override { return reduce(v, MPI_SUM); }
  void broadcast(std::string& text, int root) override {
    int len = static_cast<int>(text.size());
    MPI_Bcast(&len, 1, MPI_INT, root, comm_);
    text.resize(static_cast<size_t>(len));
    MPI_Bcast(text.data(), len, MPI_CHAR, root, comm_);
  }

 private:
  int reduce(int v, MPI_Op op) {
    int out = 0;
    MPI_Allreduce(&v, &out, 1, MPI_INT, op, comm_);
    return out;
  }
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

class CommExchange final : public Exchange {
 public:
  explicit CommExchange(Communicator& comm) : comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  int min(int v) override { return reduce(v, ReduceOp::min); }
  int sum(int v) override { return reduce(v, ReduceOp::sum); }
  void broadcast(std::string& text, int root) override {
    int64_t len = static_cast<int64_t>(text.size());
    comm_.broadcast(&len, 1, DType::i64, root)->wait();
    text.resize(static_cast<size_t>(len));
    comm_.broadcast(text.data(), text.size(), DType::u8, root)->wait();
  }

 private:
  int reduce(int v, ReduceOp op) {
    auto x = static_cast<int32_t>(v);
    comm_.all_reduce(&x, &x, 1, DType::i32, op)->wait();
    return x;
  }
  Communicator& comm_;
};

}  // namespace

std::string Agreement::text() const {
  if (ok() || all_failed()) return message;
  return message + " (on rank " + std::to_string(first_failed) + ")";
}

void Agreement::throw_if_failed() const {
  if (!ok()) throw Error(text());
}

Agreement agree_on_error(MPI_Comm comm, const std::string& error) {
  if (comm == MPI_COMM_NULL) return alone(error, 0, 1);
  MpiExchange x(comm);
  return agree(x, error);
}

Agreement agree_on_error(Communicator& comm, const std::string& error) {
  // A meta communicator stands for one rank of a world that does not exist: its "collectives"
  // move nothing, so this rank's own outcome is the agreement.
  if (comm.backend() == "meta") return alone(error, comm.rank(), comm.size());
  CommExchange x(comm);
  return agree(x, error);
}

}  // namespace fsdp
