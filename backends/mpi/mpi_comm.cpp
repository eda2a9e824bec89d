#include "mpi/mpi_comm.h"

#include <climits>
#include <cstring>
#include <functional>

#include "comm/reduce.h"

namespace fsdp {

namespace {

template <DType D, ReduceOp Op>
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_into(inout, in, static_cast<size_t>(*len), D, Op);
}

int checked_count(size_t count, const char* collective) {
  if (count > static_cast<size_t>(INT_MAX))
    throw Error(std::string("mpi ") + collective + ": count " + std::to_string(count) + " exceeds MPI's int range");
  return static_cast<int>(count);
}

void check(int rc, const CollectiveDesc& d) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw Error(d.text() + ": " + std::string(msg, len));
  }
}

// One MPI request; `finish` runs once on completion (avg's division).
class MpiWork : public PollingWork {
 public:
  MpiWork(CollectiveDesc desc, double timeout_s, std::function<void()> finish = {})
      : PollingWork(std::move(desc), timeout_s), finish_(std::move(finish)) {}
  ~MpiWork() override {
    // A handle dropped before completion must not leave MPI writing into freed memory silently:
    // wait for it (bounded by the timeout), swallowing errors in a destructor.
    if (!done_ && request_ != MPI_REQUEST_NULL) {
      try {
        wait();
      } catch (...) {
      }
    }
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    check(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE), desc_);
    if (!flag) return false;
    done_ = true;
    if (finish_) finish_();
    return true;
  }
  MPI_Request* request() { return &request_; }

 private:
  MPI_Request request_ = MPI_REQUEST_NULL;
  std::function<void()> finish_;
  bool done_ = false;
};

}  // namespace

MpiHalfTypes::MpiHalfTypes() {
  MPI_Type_contiguous(1, MPI_UINT16_T, &bf16_);
  MPI_Type_commit(&bf16_);
  MPI_Type_contiguous(1, MPI_UINT16_T, &f16_);
  MPI_Type_commit(&f16_);
  MPI_Op_create(half_op<DType::bf16, ReduceOp::sum>, 1, &bf16_ops_[0]);
  MPI_Op_create(half_op<DType::bf16, ReduceOp::max>, 1, &bf16_ops_[1]);
  MPI_Op_create(half_op<DType::bf16, ReduceOp::min>, 1, &bf16_ops_[2]);
  MPI_Op_create(half_op<DType::f16, ReduceOp::sum>, 1, &f16_ops_[0]);
  MPI_Op_create(half_op<DType::f16, ReduceOp::max>, 1, &f16_ops_[1]);
  MPI_Op_create(half_op<DType::f16, ReduceOp::min>, 1, &f16_ops_[2]);
}

MpiHalfTypes::~MpiHalfTypes() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Op* ops : {bf16_ops_, f16_ops_})
    for (int i = 0; i < 3; ++i) MPI_Op_free(&ops[i]);
  MPI_Type_free(&bf16_);
  MPI_Type_free(&f16_);
}

MPI_Datatype MpiHalfTypes::datatype(DType dtype) const {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::bf16: return bf16_;
    case DType::f16: return f16_;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op MpiHalfTypes::op(DType dtype, ReduceOp op) const {
  int i = op == ReduceOp::max ? 1 : op == ReduceOp::min ? 2 : 0;
  if (dtype == DType::bf16) return bf16_ops_[i];
  if (dtype == DType::f16) return f16_ops_[i];
  return i == 1 ? MPI_MAX : i == 2 ? MPI_MIN : MPI_SUM;
}

MpiCommHandle::~MpiCommHandle() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

MpiCommunicator::MpiCommunicator(MPI_Comm owned, std::shared_ptr<MpiHalfTypes> types, const CommOptions& options)
    : Communicator(options), comm_(owned), types_(std::move(types)) {
  MPI_Comm_rank(owned, &rank_);
  MPI_Comm_size(owned, &size_);
  // Errors come back as codes and become exceptions with the collective's name.
  MPI_Comm_set_errhandler(owned, MPI_ERRORS_RETURN);
}

CollectiveDesc MpiCommunicator::describe(const char* collective, size_t count, DType dtype) {
  return {"mpi", collective, count, dtype, next_seq()};
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) const {
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_Comm_split(comm_.get(), color, key, &sub);
  return std::make_unique<MpiCommunicator>(sub, types_, options());
}

std::unique_ptr<Work> MpiCommunicator::all_gather(const void* in, void* out, size_t count, DType dtype, Stream) {
  auto work = std::make_unique<MpiWork>(describe("all_gather", count, dtype), options().timeout_s);
  int n = checked_count(count, "all_gather");
  MPI_Datatype t = types_->datatype(dtype);
  const void* send = static_cast<const char*>(out) + rank_ * count * dtype_bytes(dtype) == in ? MPI_IN_PLACE : in;
  check(MPI_Iallgather(send, n, t, out, n, t, comm_.get(), work->request()), work->desc());
  return work;
}

std::unique_ptr<Work> MpiCommunicator::reduce_scatter(const void* in, void* out, size_t count, DType dtype,
                                                      ReduceOp op, Stream) {
  std::function<void()> finish;
  if (op == ReduceOp::avg) finish = [out, count, dtype, n = size_] { scale_for_avg(out, count, dtype, n); };
  auto work = std::make_unique<MpiWork>(describe("reduce_scatter", count, dtype), options().timeout_s, std::move(finish));
  int n = checked_count(count, "reduce_scatter");
  check(MPI_Ireduce_scatter_block(in, out, n, types_->datatype(dtype), types_->op(dtype, op), comm_.get(),
                                  work->request()),
        work->desc());
  return work;
}

std::unique_ptr<Work> MpiCommunicator::all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                                                  Stream) {
  std::function<void()> finish;
  if (op == ReduceOp::avg) finish = [out, count, dtype, n = size_] { scale_for_avg(out, count, dtype, n); };
  auto work = std::make_unique<MpiWork>(describe("all_reduce", count, dtype), options().timeout_s, std::move(finish));
  int n = checked_count(count, "all_reduce");
  const void* send = in == out ? MPI_IN_PLACE : in;
  check(MPI_Iallreduce(send, out, n, types_->datatype(dtype), types_->op(dtype, op), comm_.get(), work->request()),
        work->desc());
  return work;
}

std::unique_ptr<Work> MpiCommunicator::broadcast(void* buf, size_t count, DType dtype, int root, Stream) {
  auto work = std::make_unique<MpiWork>(describe("broadcast", count, dtype), options().timeout_s);
  if (root < 0 || root >= size_)
    throw Error(work->desc().text() + ": root " + std::to_string(root) + " outside [0, " + std::to_string(size_) + ")");
  check(MPI_Ibcast(buf, checked_count(count, "broadcast"), types_->datatype(dtype), root, comm_.get(), work->request()),
        work->desc());
  return work;
}

void MpiCommunicator::barrier() {
  MpiWork work(describe("barrier", 0, DType::u8), options().timeout_s);
  check(MPI_Ibarrier(comm_.get(), work.request()), work.desc());
  work.wait();
}

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm bootstrap, const CommOptions& options) {
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Comm_dup(bootstrap, &dup);  // our traffic never matches the application's
  return std::make_unique<MpiCommunicator>(dup, std::make_shared<MpiHalfTypes>(), options);
}

}  // namespace fsdp
