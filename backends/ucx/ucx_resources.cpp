#include "ucx/ucx_resources.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <climits>

namespace fsdp::ucx {

namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point deadline_after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

}  // namespace

void fail(const std::string& what, ucs_status_t status) {
  throw Error("ucx: " + what + ": " + ucs_status_string(status));
}

Context::Context() {
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);  // UCX_TLS and friends
  if (status != UCS_OK) fail("ucp_config_read", status);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG;  // rings are tagged messages; no RMA, no AM
  params.mt_workers_shared = 0;       // one thread drives a family (see progress_all)
  status = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (status != UCS_OK) fail("ucp_init (check UCX_TLS)", status);
}

Context::~Context() { ucp_cleanup(context_); }

LibraryDeviceSupport Context::device_support() const {
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  const std::string name = std::string("UCX ") + ucp_get_version_string();
  LibraryDeviceSupport s;
  s.library = name + " with CUDA memory";
  if (ucp_context_query(context_, &attr) != UCS_OK) {
    s.why_not = name + " did not say which memory types it moves (ucp_context_query)";
    return s;
  }
  s.reads_device_memory = (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  s.why_not = name +
              " moves no CUDA memory (no cuda transports: built without CUDA, as Debian's is, or no "
              "CUDA driver; jobs/cuda-aware-mpi.sh's prefix has a UCX with them)";
  return s;
}

void Context::detach(ucp_worker_h worker) { std::erase(workers_, worker); }

void Context::dismiss(Pollable* pollable) {
  for (Pollable*& p : pollables_)
    if (p == pollable) p = nullptr;
  if (!progressing_) std::erase(pollables_, nullptr);
}

unsigned Context::progress_all() {
  unsigned events = 0;
  for (ucp_worker_h w : workers_) {
    // Drain what is ready, bounded so a flood of events cannot hold one caller forever.
    for (int i = 0; i < 64; ++i) {
      const unsigned n = ucp_worker_progress(w);
      if (n == 0) break;
      events += n;
    }
  }
  // Index loop: a pass may enlist (a callback never does today, but push_back is safe here) and
  // dismisses only null out entries.
  progressing_ = true;
  // NOLINTNEXTLINE(modernize-loop-convert): a range-for's iterators would not survive an enlist
  for (size_t i = 0; i < pollables_.size(); ++i)
    if (Pollable* p = pollables_[i]) p->poll_quietly();
  progressing_ = false;
  std::erase(pollables_, nullptr);
  return events;
}

WorkerAddress::WorkerAddress(ucp_worker_h worker) : worker_(worker) {
  ucs_status_t status = ucp_worker_get_address(worker, &address_, &bytes_);
  if (status != UCS_OK) fail("ucp_worker_get_address", status);
}

WorkerAddress::~WorkerAddress() { ucp_worker_release_address(worker_, address_); }

WorkerHandle::WorkerHandle(ucp_context_h context) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucs_status_t status = ucp_worker_create(context, &params, &worker_);
  if (status != UCS_OK) fail("ucp_worker_create", status);
}

WorkerHandle::~WorkerHandle() { ucp_worker_destroy(worker_); }

void Endpoints::connect(ucp_worker_h worker, MPI_Comm comm) {
  worker_ = worker;
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  WorkerAddress address(worker);
  if (address.bytes() > static_cast<size_t>(INT_MAX)) throw Error("ucx: worker address too large for MPI");
  int bytes = static_cast<int>(address.bytes());
  std::vector<int> lengths(static_cast<size_t>(size)), offsets(static_cast<size_t>(size));
  MPI_Allgather(&bytes, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm);
  long total = 0;
  for (int p = 0; p < size; ++p) {
    offsets[p] = static_cast<int>(total);
    total += lengths[p];
  }
  if (total > INT_MAX) throw Error("ucx: worker addresses exceed MPI's int range");
  std::vector<char> all(static_cast<size_t>(total));
  MPI_Allgatherv(address.data(), bytes, MPI_BYTE, all.data(), lengths.data(), offsets.data(), MPI_BYTE, comm);
  eps_.assign(static_cast<size_t>(size), nullptr);
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;  // rings never send to self
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    params.address = reinterpret_cast<const ucp_address_t*>(all.data() + offsets[p]);
    ucs_status_t status = ucp_ep_create(worker, &params, &eps_[p]);
    if (status != UCS_OK) fail("ucp_ep_create to rank " + std::to_string(p), status);
  }
}

bool Endpoints::close(bool force, double bound_s) {
  std::vector<void*> pending;
  for (ucp_ep_h& ep : eps_) {
    if (ep == nullptr) continue;
    ucp_request_param_t params{};
    params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    params.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;  // 0: flush what is queued, then close
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &params);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) pending.push_back(r);
    ep = nullptr;
  }
  const auto deadline = deadline_after(bound_s);
  bool finished = true;
  while (!pending.empty()) {
    if (ucp_worker_progress(worker_) == 0) sched_yield();
    std::erase_if(pending, [](void* r) {
      if (ucp_request_check_status(r) == UCS_INPROGRESS) return false;
      ucp_request_free(r);
      return true;
    });
    if (!pending.empty() && Clock::now() > deadline) {
      for (void* r : pending) ucp_request_free(r);  // UCX finishes them when the worker goes
      finished = false;
      break;
    }
  }
  eps_.clear();
  return finished;
}

Endpoints::~Endpoints() {
  if (!eps_.empty()) close(true, 1.0);
}

void Request::start(ucp_worker_h worker, ucs_status_ptr_t returned, const CollectiveDesc& desc, const char* what) {
  if (UCS_PTR_IS_ERR(returned)) {
    throw Error(desc.text() + ": " + what + ": " + ucs_status_string(UCS_PTR_STATUS(returned)));
  }
  worker_ = worker;
  request_ = returned;  // NULL: completed at once
}

bool Request::complete(const CollectiveDesc& desc) {
  if (request_ == nullptr) return true;
  ucs_status_t status = ucp_request_check_status(request_);
  if (status == UCS_INPROGRESS) return false;
  ucp_request_free(request_);
  request_ = nullptr;
  if (status != UCS_OK) throw Error(desc.text() + ": transfer failed: " + ucs_status_string(status));
  return true;
}

void Request::abandon() {
  if (request_ == nullptr) return;
  ucp_request_cancel(worker_, request_);
  ucp_request_free(request_);
  request_ = nullptr;
}

Worker::Worker(std::shared_ptr<Context> context, MPI_Comm comm, size_t slot_bytes)
    : context_(std::move(context)), worker_(context_->get()), slot_bytes_(slot_bytes) {
  eps_.connect(worker_.get(), comm);
  context_->attach(worker_.get());
}

Worker::~Worker() {
  context_->detach(worker_.get());
  if (!closed_) eps_.close(true, 1.0);
}

void Worker::shutdown(MPI_Comm comm, double bound_s) {
  if (closed_) return;
  closed_ = true;
  const bool mpi_alive = comm != MPI_COMM_NULL;
  eps_.close(!mpi_alive, bound_s);
  if (!mpi_alive) return;
  // Fence: keep serving peers' flushes until every rank has closed its endpoints.
  MPI_Request fence = MPI_REQUEST_NULL;
  MPI_Ibarrier(comm, &fence);
  const auto deadline = deadline_after(bound_s);
  for (int done = 0; !done;) {
    ucp_worker_progress(worker_.get());
    MPI_Test(&fence, &done, MPI_STATUS_IGNORE);
    if (!done && Clock::now() > deadline) {
      // A peer never arrived (it failed, or skipped destroying the communicator). MPI forbids
      // freeing or cancelling a collective's request; leave it pending rather than block here.
      break;
    }
    if (!done) sched_yield();  // oversubscribed ranks: let the peers we wait for run
  }
}

std::unique_ptr<std::byte[]> Worker::take_slot() {
  if (pool_.empty()) return std::unique_ptr<std::byte[]>(new std::byte[slot_bytes_]);
  auto slot = std::move(pool_.back());
  pool_.pop_back();
  return slot;
}

void Worker::give_slot(std::unique_ptr<std::byte[]> slot) {
  constexpr size_t kKeep = 32;  // two concurrent reduce_scatters' windows at the default tuning
  if (pool_.size() < kKeep) pool_.push_back(std::move(slot));
}

}  // namespace fsdp::ucx
