#pragma once
// The NCCL backend: NCCL's own collectives on device buffers. MPI bootstraps it (the unique id
// is broadcast over the bootstrap communicator); each rank drives the GPU numbered by its
// node-local rank modulo the device count.
//
// Streams: a collective given a Stream is enqueued on that cudaStream_t. Given a null Stream it
// runs on the communicator's own non-blocking stream, ordered after work already issued to the
// legacy default stream (so buffers filled there or by blocking streams are ready). Completion is
// a cudaEvent: Work::wait() blocks the host with comm.timeout_s, Work::wait_on(s) makes stream s
// wait (a null s means the legacy default stream, which synchronous cudaMemcpy uses too).
// A timeout or an asynchronous NCCL error aborts the NCCL communicator (ncclCommAbort), which
// frees the GPU from a hung kernel; that communicator is unusable afterwards.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <memory>
#include <string>

#include "comm/comm.h"
#include "tensor/cuda/cuda_runtime.h"  // the RAII stream, event and buffer handles

namespace fsdp {

// Owns an ncclComm_t. Shared by the communicator and its in-flight Work so that a timeout in
// wait() can abort it even after the communicator is gone.
class NcclCommHandle {
 public:
  explicit NcclCommHandle(ncclComm_t comm) : comm_(comm) {}
  ~NcclCommHandle();
  NcclCommHandle(const NcclCommHandle&) = delete;
  NcclCommHandle& operator=(const NcclCommHandle&) = delete;
  ncclComm_t get() const { return comm_; }
  bool aborted() const { return aborted_; }
  void abort();  // idempotent
  // The communicator's asynchronous error (ncclSuccess, ncclInProgress or a failure).
  ncclResult_t async_error() const;
  // "ncclGetErrorString: ncclGetLastError" for messages.
  std::string error_text(ncclResult_t rc) const;

 private:
  ncclComm_t comm_;
  bool aborted_ = false;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(ncclComm_t owned, int device, const CommOptions& options);
  std::string_view backend() const override { return "nccl"; }
  DevicePath device_path() const override { return {true, true, "device buffers (NCCL's own)"}; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const { return device_; }
  // ncclCommSplit. NCCL has no "undefined" group: a negative color takes part in the split
  // (NCCL_SPLIT_NOCOLOR, so the other ranks complete) and then throws Error.
  std::unique_ptr<Communicator> split(int color, int key) const override;
  std::unique_ptr<Work> all_gather(const void* in, void* out, size_t count, DType dtype, Stream stream) override;
  std::unique_ptr<Work> reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                                       Stream stream) override;
  std::unique_ptr<Work> all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                                   Stream stream) override;
  std::unique_ptr<Work> broadcast(void* buf, size_t count, DType dtype, int root, Stream stream) override;
  // A one-byte all_reduce on the communicator's stream, waited for with the timeout.
  void barrier() override;

 private:
  CollectiveDesc describe(const char* collective, size_t count, DType dtype);
  // Sets the device, checks the communicator is usable, picks the stream for the collective.
  cudaStream_t prepare(Stream stream, const CollectiveDesc& desc);
  // Wraps the enqueue's result and records the completion event.
  std::unique_ptr<Work> finish(ncclResult_t rc, cudaStream_t stream, CollectiveDesc desc);

  std::shared_ptr<NcclCommHandle> comm_;
  int device_ = 0;  // initialised by making it current, before the stream and event are created
  int rank_ = 0, size_ = 1;
  cuda::StreamHandle stream_;
  cuda::EventHandle legacy_ready_;               // orders the own stream after the legacy default stream
  std::unique_ptr<cuda::DeviceBuffer> scratch_;  // barrier's byte, allocated on first use
};

// Throws Error("nccl backend: no CUDA device found (...)") on every rank when any rank has no
// usable device, so callers (tests, fsdp_bench) can skip the backend.
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm bootstrap, const CommOptions& options);

}  // namespace fsdp
