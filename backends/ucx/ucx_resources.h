#pragma once
// RAII owners of the UCP objects the UCX backend uses: the context (shared by a communicator and
// every communicator split from it), one worker per communicator with its endpoints and worker
// address, in-flight requests, and a pool of staging buffers. Nothing here knows about
// collectives; ucx_comm.cpp builds rings out of it.
#include <mpi.h>
#include <ucp/api/ucp.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"

namespace fsdp::ucx {

// Error with UCX's text for the status: "ucx: ucp_init: No such device".
[[noreturn]] void fail(const std::string& what, ucs_status_t status);

// Something in flight that progress should move along: a collective's state machine.
class Pollable {
 public:
  virtual void poll_quietly() noexcept = 0;  // advance; keep any error for the owner's test()

 protected:
  ~Pollable() = default;
};

// One ucp_context per communicator family. Splits share it: a context owns the transports'
// resources (memory domains, registration cache, shared-memory segments, sockets), so opening
// one per split would multiply them for no gain, while isolation between communicators comes
// from each having its own worker (its own tag-matching space and progress engine).
// Transports follow UCX's own environment (UCX_TLS, UCX_NET_DEVICES, ...).
class Context {
 public:
  Context();
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ucp_context_h get() const { return context_; }
  // Whether this context moves CUDA memory (its transports list UCS_MEMORY_TYPE_CUDA: UCX built
  // with CUDA, its cuda modules loaded, a driver present); names the library for messages.
  LibraryDeviceSupport device_support() const;

  // Progress is family-wide, as MPI's is: testing any collective progresses every worker and
  // advances every collective in flight in the family. Ring algorithms forward data, so a rank
  // blocked in one collective must keep forwarding for the others: otherwise ranks that wait
  // in different orders (or on a split group while a peer waits on the parent) deadlock. One
  // thread drives a family, as one thread drives an MPI communicator in this project.
  void attach(ucp_worker_h worker) { workers_.push_back(worker); }
  void detach(ucp_worker_h worker);
  void enlist(Pollable* pollable) { pollables_.push_back(pollable); }
  void dismiss(Pollable* pollable);  // safe from inside progress_all
  unsigned progress_all();           // returns the workers' event count (0: nothing happened)

 private:
  ucp_context_h context_ = nullptr;
  std::vector<ucp_worker_h> workers_;
  std::vector<Pollable*> pollables_;  // null entries are dismissed ones, compacted after a pass
  bool progressing_ = false;
};

// The address a worker publishes to its peers, released on destruction.
class WorkerAddress {
 public:
  explicit WorkerAddress(ucp_worker_h worker);
  ~WorkerAddress();
  WorkerAddress(const WorkerAddress&) = delete;
  WorkerAddress& operator=(const WorkerAddress&) = delete;
  const void* data() const { return address_; }
  size_t bytes() const { return bytes_; }

 private:
  ucp_worker_h worker_;
  ucp_address_t* address_ = nullptr;
  size_t bytes_ = 0;
};

// A ucp_worker handle alone (destroyed last, after the endpoints).
class WorkerHandle {
 public:
  explicit WorkerHandle(ucp_context_h context);
  ~WorkerHandle();
  WorkerHandle(const WorkerHandle&) = delete;
  WorkerHandle& operator=(const WorkerHandle&) = delete;
  ucp_worker_h get() const { return worker_; }

 private:
  ucp_worker_h worker_ = nullptr;
};

// Endpoints to every peer (none to self). close() is the collective, graceful path; the
// destructor forces whatever is still open (error paths, after MPI_Finalize).
class Endpoints {
 public:
  Endpoints() = default;
  ~Endpoints();
  Endpoints(const Endpoints&) = delete;
  Endpoints& operator=(const Endpoints&) = delete;
  // Exchanges worker addresses over `comm` (MPI_Allgather of lengths, MPI_Allgatherv of bytes)
  // and creates one endpoint per peer.
  void connect(ucp_worker_h worker, MPI_Comm comm);
  ucp_ep_h operator[](int rank) const { return eps_[static_cast<size_t>(rank)]; }
  // Flush-closes (or force-closes) every endpoint and progresses the worker until all closes
  // finished or `bound_s` passed. Returns false on the bound.
  bool close(bool force, double bound_s);

 private:
  ucp_worker_h worker_ = nullptr;
  std::vector<ucp_ep_h> eps_;
};

// A UCX request in flight. Completion is read with ucp_request_check_status, not a callback:
// no callback can then write into a Work that no longer exists, and progressing the worker for
// one Work completes other Works' requests without running their code.
class Request {
 public:
  Request() = default;
  Request(Request&& other) noexcept : worker_(other.worker_), request_(other.request_) { other.request_ = nullptr; }
  Request& operator=(Request&&) = delete;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request() { abandon(); }
  // Takes what a *_nbx call returned: complete at once (NULL), in flight, or an error.
  void start(ucp_worker_h worker, ucs_status_ptr_t returned, const CollectiveDesc& desc, const char* what);
  // True once complete (also when never started); frees the request; throws on a failed transfer.
  bool complete(const CollectiveDesc& desc);
  bool in_flight() const { return request_ != nullptr; }
  // Cancels (receives) and hands the request back to UCX, which finishes it on its own.
  void abandon();

 private:
  ucp_worker_h worker_ = nullptr;
  void* request_ = nullptr;
};

// One communicator's worker, endpoints and staging buffers. Works hold it through a shared_ptr,
// so a handle that outlives its communicator never touches a destroyed worker.
class Worker {
 public:
  Worker(std::shared_ptr<Context> context, MPI_Comm comm, size_t slot_bytes);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  ucp_worker_h get() const { return worker_.get(); }
  ucp_ep_h ep(int rank) const { return eps_[rank]; }
  Context& context() const { return *context_; }
  bool closed() const { return closed_; }
  // The collective end of a communicator: flush-close every endpoint, then an MPI fence while
  // progressing (so no rank tears down a worker whose peers still flush toward it). Bounded by
  // `bound_s` at each stage; comm == MPI_COMM_NULL (MPI finalized) force-closes alone.
  void shutdown(MPI_Comm comm, double bound_s);

  // Staging buffers of slot_bytes each, reused across collectives (fresh multi-MiB buffers
  // would page-fault on every call). A buffer a transfer may still touch is never reused:
  // bury() keeps it until the worker is destroyed.
  size_t slot_bytes() const { return slot_bytes_; }
  std::unique_ptr<std::byte[]> take_slot();
  void give_slot(std::unique_ptr<std::byte[]> slot);
  void bury(std::unique_ptr<std::byte[]> slot) { graveyard_.push_back(std::move(slot)); }

 private:
  // Declaration order is destruction order reversed: the graveyard outlives the worker (an
  // abandoned transfer may touch it until the worker is destroyed), the context outlives all.
  std::shared_ptr<Context> context_;
  std::vector<std::unique_ptr<std::byte[]>> graveyard_;
  WorkerHandle worker_;
  Endpoints eps_;
  size_t slot_bytes_;
  std::vector<std::unique_ptr<std::byte[]>> pool_;
  bool closed_ = false;
};

}  // namespace fsdp::ucx
