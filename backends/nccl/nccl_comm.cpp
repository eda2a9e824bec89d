#include "nccl/nccl_comm.h"

#include <string>

namespace fsdp {

namespace {

[[noreturn]] void throw_cuda(const std::string& context, const char* call, cudaError_t rc) {
  throw Error(context + ": " + call + ": " + cudaGetErrorString(rc));
}

void check_cuda(cudaError_t rc, const std::string& context, const char* call) {
  if (rc != cudaSuccess) throw_cuda(context, call, rc);
}

ncclDataType_t nccl_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: return ncclUint8;
  }
  throw Error("nccl: unknown dtype " + std::to_string(static_cast<int>(dtype)));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  throw Error("nccl: unknown reduce op " + std::to_string(static_cast<int>(op)));
}

// Makes `device` current and returns it: lets a member initialiser run before the stream and
// event members are created on that device.
int use_device(int device) {
  check_cuda(cudaSetDevice(device), "nccl backend", "cudaSetDevice");
  return device;
}

// One enqueued collective: an event recorded on its stream right after it.
class NcclWork : public PollingWork {
 public:
  NcclWork(CollectiveDesc desc, double timeout_s, std::shared_ptr<NcclCommHandle> comm, cudaStream_t stream)
      : PollingWork(std::move(desc), timeout_s), comm_(std::move(comm)) {
    check_cuda(cudaEventRecord(event_.get(), stream), desc_.text(), "cudaEventRecord");
  }

  bool test() override {
    if (done_) return true;
    cudaError_t rc = cudaEventQuery(event_.get());
    if (rc == cudaSuccess) return done_ = true;
    if (rc != cudaErrorNotReady) throw_cuda(desc_.text(), "cudaEventQuery", rc);
    if (comm_->aborted())
      throw Error(desc_.text() + ": the NCCL communicator was aborted (an earlier collective timed out or failed)");
    // A peer that died or a network failure shows up here, not in the event, which would stay
    // pending forever: abort so the kernel stops and the stream becomes usable again.
    ncclResult_t err = comm_->async_error();
    if (err != ncclSuccess && err != ncclInProgress) {
      std::string text = comm_->error_text(err);
      comm_->abort();
      throw Error(desc_.text() + ": " + text + " (NCCL communicator aborted)");
    }
    return false;
  }

  void wait() override {
    try {
      PollingWork::wait();
    } catch (const CommTimeout&) {
      // NCCL's kernel spins until its peers arrive; only an abort releases the GPU.
      comm_->abort();
      throw;
    }
  }

  void wait_on(Stream stream) override {
    cudaStream_t target = stream.native ? static_cast<cudaStream_t>(stream.native) : cudaStreamLegacy;
    check_cuda(cudaStreamWaitEvent(target, event_.get(), 0), desc_.text(), "cudaStreamWaitEvent");
  }

 private:
  std::shared_ptr<NcclCommHandle> comm_;
  cuda::EventHandle event_;
  bool done_ = false;
};

}  // namespace

NcclCommHandle::~NcclCommHandle() {
  if (aborted_ || comm_ == nullptr) return;
  // Destroy flushes pending operations, which never finish after an error: abort instead.
  ncclResult_t err = ncclSuccess;
  if (ncclCommGetAsyncError(comm_, &err) != ncclSuccess || (err != ncclSuccess && err != ncclInProgress)) {
    ncclCommAbort(comm_);
  } else {
    ncclCommDestroy(comm_);
  }
}

void NcclCommHandle::abort() {
  if (aborted_) return;
  aborted_ = true;
  if (comm_ != nullptr) ncclCommAbort(comm_);
  comm_ = nullptr;
}

ncclResult_t NcclCommHandle::async_error() const {
  if (comm_ == nullptr) return ncclInvalidUsage;
  ncclResult_t err = ncclSuccess;
  ncclResult_t rc = ncclCommGetAsyncError(comm_, &err);
  return rc != ncclSuccess ? rc : err;
}

std::string NcclCommHandle::error_text(ncclResult_t rc) const {
  std::string text = ncclGetErrorString(rc);
  const char* last = ncclGetLastError(comm_);
  if (last != nullptr && *last != '\0') text += std::string(" (") + last + ")";
  return text;
}

NcclCommunicator::NcclCommunicator(ncclComm_t owned, int device, const CommOptions& options)
    : Communicator(options), comm_(std::make_shared<NcclCommHandle>(owned)), device_(use_device(device)) {
  ncclResult_t rc = ncclCommUserRank(owned, &rank_);
  if (rc == ncclSuccess) rc = ncclCommCount(owned, &size_);
  if (rc != ncclSuccess) throw Error("nccl backend: ncclCommUserRank/ncclCommCount: " + comm_->error_text(rc));
}

CollectiveDesc NcclCommunicator::describe(const char* collective, size_t count, DType dtype) {
  return {"nccl", collective, count, dtype, next_seq()};
}

cudaStream_t NcclCommunicator::prepare(Stream stream, const CollectiveDesc& desc) {
  if (comm_->aborted())
    throw Error(desc.text() + ": the NCCL communicator was aborted (an earlier collective timed out or failed)");
  check_cuda(cudaSetDevice(device_), desc.text(), "cudaSetDevice");
  if (stream.native != nullptr) return static_cast<cudaStream_t>(stream.native);
  // Our stream does not synchronise implicitly with anything: make it wait for what the caller
  // already queued on the legacy default stream (which itself waits for the blocking streams).
  check_cuda(cudaEventRecord(legacy_ready_.get(), cudaStreamLegacy), desc.text(), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(stream_.get(), legacy_ready_.get(), 0), desc.text(), "cudaStreamWaitEvent");
  return stream_.get();
}

std::unique_ptr<Work> NcclCommunicator::finish(ncclResult_t rc, cudaStream_t stream, CollectiveDesc desc) {
  if (rc != ncclSuccess) throw Error(desc.text() + ": " + comm_->error_text(rc));
  return std::make_unique<NcclWork>(std::move(desc), options().timeout_s, comm_, stream);
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key) const {
  const std::string context = "nccl split (color " + std::to_string(color) + ", key " + std::to_string(key) + ")";
  if (comm_->aborted()) throw Error(context + ": the NCCL communicator was aborted");
  check_cuda(cudaSetDevice(device_), context, "cudaSetDevice");
  ncclComm_t sub = nullptr;
  // config nullptr: the new communicator inherits the parent's (blocking) configuration.
  ncclResult_t rc = ncclCommSplit(comm_->get(), color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, nullptr);
  if (rc != ncclSuccess) throw Error(context + ": " + comm_->error_text(rc));
  if (color < 0) throw Error(context + ": a negative color leaves this rank in no group, which NCCL cannot express");
  return std::make_unique<NcclCommunicator>(sub, device_, options());
}

std::unique_ptr<Work> NcclCommunicator::all_gather(const void* in, void* out, size_t count, DType dtype,
                                                   Stream stream) {
  CollectiveDesc desc = describe("all_gather", count, dtype);
  cudaStream_t s = prepare(stream, desc);
  // In place (in == out + rank*count) is NCCL's own convention too.
  return finish(ncclAllGather(in, out, count, nccl_dtype(dtype), comm_->get(), s), s, std::move(desc));
}

std::unique_ptr<Work> NcclCommunicator::reduce_scatter(const void* in, void* out, size_t count, DType dtype,
                                                       ReduceOp op, Stream stream) {
  CollectiveDesc desc = describe("reduce_scatter", count, dtype);
  cudaStream_t s = prepare(stream, desc);
  return finish(ncclReduceScatter(in, out, count, nccl_dtype(dtype), nccl_op(op), comm_->get(), s), s, std::move(desc));
}

std::unique_ptr<Work> NcclCommunicator::all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                                                   Stream stream) {
  CollectiveDesc desc = describe("all_reduce", count, dtype);
  cudaStream_t s = prepare(stream, desc);
  return finish(ncclAllReduce(in, out, count, nccl_dtype(dtype), nccl_op(op), comm_->get(), s), s, std::move(desc));
}

std::unique_ptr<Work> NcclCommunicator::broadcast(void* buf, size_t count, DType dtype, int root, Stream stream) {
  CollectiveDesc desc = describe("broadcast", count, dtype);
  if (root < 0 || root >= size_)
    throw Error(desc.text() + ": root " + std::to_string(root) + " outside [0, " + std::to_string(size_) + ")");
  cudaStream_t s = prepare(stream, desc);
  return finish(ncclBroadcast(buf, buf, count, nccl_dtype(dtype), root, comm_->get(), s), s, std::move(desc));
}

void NcclCommunicator::barrier() {
  CollectiveDesc desc = describe("barrier", 0, DType::u8);
  if (comm_->aborted())
    throw Error(desc.text() + ": the NCCL communicator was aborted (an earlier collective timed out or failed)");
  check_cuda(cudaSetDevice(device_), desc.text(), "cudaSetDevice");
  if (!scratch_) scratch_ = std::make_unique<cuda::DeviceBuffer>(1);
  // On our own stream without the legacy-stream ordering: a barrier meets the other ranks, it
  // does not wait for this rank's kernels.
  void* byte = scratch_->get();
  finish(ncclAllReduce(byte, byte, 1, ncclUint8, ncclMax, comm_->get(), stream_.get()), stream_.get(), std::move(desc))
      ->wait();
}

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm bootstrap, const CommOptions& options) {
  int rank = 0, size = 1;
  MPI_Comm_rank(bootstrap, &rank);
  MPI_Comm_size(bootstrap, &size);
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(bootstrap, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int local_rank = 0;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_free(&node);

  std::string why;
  int device = -1, device_count = 0;
  cudaError_t rc = cudaGetDeviceCount(&device_count);
  if (rc != cudaSuccess) {
    why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(rc);
  } else if (device_count <= 0) {
    why = "cudaGetDeviceCount returned 0";
  } else {
    device = local_rank % device_count;
    rc = cudaSetDevice(device);
    if (rc != cudaSuccess) why = "cudaSetDevice(" + std::to_string(device) + "): " + cudaGetErrorString(rc);
  }
  // All ranks agree before NCCL's init, which would wait forever for a rank that gave up.
  int first_without = why.empty() ? size : rank;
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-cstyle-cast): Open MPI's MPI_IN_PLACE is ((void*)1)
  MPI_Allreduce(MPI_IN_PLACE, &first_without, 1, MPI_INT, MPI_MIN, bootstrap);
  if (first_without < size) {
    if (why.empty()) why = "rank " + std::to_string(first_without) + " has none";
    throw Error("nccl backend: no CUDA device found (" + why + ")");
  }

  // Rank 0's id and its result travel together so a failure there stops every rank.
  struct {
    int result;
    ncclUniqueId id;
  } boot{};
  if (rank == 0) boot.result = static_cast<int>(ncclGetUniqueId(&boot.id));
  MPI_Bcast(&boot, static_cast<int>(sizeof boot), MPI_BYTE, 0, bootstrap);
  if (boot.result != ncclSuccess)
    throw Error(std::string("nccl backend: ncclGetUniqueId on rank 0: ") +
                ncclGetErrorString(static_cast<ncclResult_t>(boot.result)));

  ncclComm_t comm = nullptr;
  ncclResult_t nrc = ncclCommInitRank(&comm, size, boot.id, rank);
  if (nrc != ncclSuccess) {
    std::string text = ncclGetErrorString(nrc);
    const char* last = ncclGetLastError(nullptr);
    if (last != nullptr && *last != '\0') text += std::string(" (") + last + ")";
    throw Error("nccl backend: ncclCommInitRank (rank " + std::to_string(rank) + " of " + std::to_string(size) +
                ", device " + std::to_string(device) + "): " + text);
  }
  return std::make_unique<NcclCommunicator>(comm, device, options);
}

}  // namespace fsdp
