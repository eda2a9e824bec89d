#include "mpi/mpi_comm.h"

#include <sched.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <functional>
#include <utility>

#include "mpi/mpi_cuda.h"
#include "mpi/mpi_reduce.h"

namespace fsdp {

namespace {

// Which algorithm runs where. Measured with harnesses outside the repo on the 2-core EPYC VM
// (OpenMPI 4.1.4, vader/CMA, f32, one node), raw MPI and ours interleaved call by call because
// the node was shared with other jobs (load 8-22 on 2 cores: absolute numbers are far below an
// idle node's, and medians of the same MPI call swing +-30%); ratio = raw median / our median:
//   reduce_scatter: the shared-memory pipeline wins at every size tried, 4 KiB .. 64 MiB, np 2
//     and 4; at 16 MiB 2.4-5.9x (np=2) and 3.8-16x (np=4) over six runs, at 4 KiB 1.9-5.8x. No
//     size threshold: MPI_Ireduce_scatter_block runs only when the ranks span nodes.
//   all_reduce: the pipeline with a result ring (each rank copies the peers' reduced slices out
//     of shared memory) against MPI_Iallreduce and against our reduce_scatter + MPI allgatherv:
//     ours both ~1.5-2x MPI at 16-64 MiB and tied with each other; the pure shared-memory one
//     wins small sizes on latency (4 KiB: 3.3x np=2, 1.5x np=4). No size threshold.
//   all_gather: MPI_Iallgather (vader's single-copy CMA) against a shared-memory staging copy:
//     ours 0.5-0.66x at 64 MiB, so all_gather stays MPI_Iallgather at every size.

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

// Drives MPI's progress engine (libnbc schedules, vader rendezvous) without touching a request.
void drive_mpi() {
  int flag = 0;
  MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_SELF, &flag, MPI_STATUS_IGNORE);
}

// Every wait of this backend (comm.h's poll_until_deadline): `step` says whether the collective
// is done and whether the shared-memory pipeline moved. Ranks with a core each poll like
// MPI_Wait does, without yielding, for up to kSpinIdle of no progress: PollingWork's default
// backoff gives the core away for a whole time slice when the node is busy, and measured that
// way (other jobs running) an all_gather ran at 0.1-0.9x the rate of MPI_Wait on the same
// request. The shared-memory pipeline on an oversubscribed node (more ranks than CPUs they may
// run on) yields on every idle poll: the peer it waits for may need this core. Long idle waits
// (a peer still computing) sleep so that they cost no CPU.
constexpr auto kSpinIdle = std::chrono::milliseconds(50);
constexpr auto kYieldIdle = std::chrono::seconds(1);

// On expiry sets `timed_out` before the CommTimeout leaves: the Work's destructor must then not
// wait again.
template <class Step>
void poll_until(const CollectiveDesc& desc, double timeout_s, bool oversubscribed, bool& timed_out, Step step) {
  WaitBackoff backoff{.spin_polls = 0, .yield_polls = 0, .yield_time = kYieldIdle};
  if (!oversubscribed) backoff.spin_time = kSpinIdle;
  uint64_t polls = 0;
  try {
    poll_until_deadline(desc, timeout_s, backoff, [&] {
      const PollResult r = step();
      // Idle polls drive MPI's progress engine now and then: a peer blocked in an MPI
      // collective issued after this one needs this rank's MPI progress.
      if (!r.done && !r.moved && (++polls & 31) == 0) drive_mpi();
      return r;
    });
  } catch (const CommTimeout&) {
    timed_out = true;
    throw;
  }
}

// One MPI request; `finish` runs once on completion (avg's division).
class MpiWork final : public PollingWork {
 public:
  MpiWork(CollectiveDesc desc, double timeout_s, std::shared_ptr<ShmProgress> progress,
          std::function<void()> finish = {})
      : PollingWork(std::move(desc), timeout_s), progress_(std::move(progress)), finish_(std::move(finish)) {}
  MpiWork(const MpiWork&) = delete;  // owns an MPI request
  MpiWork& operator=(const MpiWork&) = delete;
  ~MpiWork() override {
    // A handle dropped before completion must not leave MPI writing into freed memory silently:
    // wait for it (bounded by the timeout), swallowing errors in a destructor. Not after its wait
    // already timed out: the CommTimeout in flight ends the job (fsdp_app aborts on it), and a
    // second wait here, run while that exception unwinds, would hold the job another timeout_s.
    // (A collective's request can be neither cancelled nor freed.)
    if (!done_ && !timed_out_ && request_ != MPI_REQUEST_NULL) {
      try {
        MpiWork::wait();  // qualified: no virtual dispatch from a destructor
      } catch (...) {
      }
    }
  }
  bool test() override {
    if (done_) return true;
    // A peer may be waiting for this rank's part of a shared-memory collective queued earlier.
    if (progress_) progress_->progress_all();
    int flag = 0;
    check(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE), desc_);
    if (!flag) return false;
    done_ = true;
    if (finish_) finish_();
    return true;
  }
  void wait() override {
    // Polls like MPI_Wait even on an oversubscribed node: there Open MPI's progress engine, which
    // MPI_Test runs, yields by itself when idle (mpi_yield_when_idle), and yielding again on top
    // measured 0.37-0.84x MPI_Wait's all_gather rate at np=4 on 2 cores (0.94-0.98x without).
    poll_until(desc_, timeout_s_, /*oversubscribed=*/false, timed_out_, [this] {
      const bool moved = progress_ && progress_->progress_all();
      return PollResult{test(), moved};
    });
  }
  MPI_Request* request() { return &request_; }

 private:
  MPI_Request request_ = MPI_REQUEST_NULL;
  std::shared_ptr<ShmProgress> progress_;
  std::function<void()> finish_;
  bool done_ = false;
  bool timed_out_ = false;  // wait() threw CommTimeout: the destructor must not wait again
};

// A collective run by the shared-memory pipeline (mpi_shm.h). Its wait's idle clock restarts
// whenever the pipeline moves (a 64 MiB op is many chunks, each a short wait for a peer), and
// idle polls drive MPI's progress engine: a peer blocked in an MPI collective issued after this
// one needs this rank's MPI progress.
class ShmWork final : public PollingWork {
 public:
  ShmWork(CollectiveDesc desc, double timeout_s, std::shared_ptr<ShmProgress> progress)
      : PollingWork(std::move(desc), timeout_s), progress_(std::move(progress)) {}
  void attach(std::shared_ptr<ShmOp> op) { op_ = std::move(op); }
  ShmWork(const ShmWork&) = delete;  // owns its part of a shared-memory ring step
  ShmWork& operator=(const ShmWork&) = delete;
  ~ShmWork() override {
    if (done_ || !op_) return;
    try {
      // After a timed-out wait, no second one (see ~MpiWork); poisoning drops the op, so nothing
      // writes into the caller's buffers afterwards.
      if (timed_out_) {
        if (op_->channel) op_->channel->poison(desc_.text() + " timed out");
        return;
      }
      ShmWork::wait();  // qualified: no virtual dispatch from a destructor
    } catch (...) {
      // Our part of the ring is now out of step with the peers for good: fail later collectives
      // on this channel rather than reduce garbage into a freed buffer.
      if (op_->channel) op_->channel->poison(desc_.text() + " was abandoned incomplete");
    }
  }
  bool test() override {
    if (done_) return true;
    progress_->progress_all();
    return finished();
  }
  void wait() override {
    poll_until(desc_, timeout_s_, progress_->oversubscribed(), timed_out_, [this] {
      const bool moved = progress_->progress_all();
      return PollResult{finished(), moved};
    });
  }

 private:
  bool finished() {
    if (done_) return true;
    done_ = op_->done;
    return done_;
  }
  std::shared_ptr<ShmProgress> progress_;
  std::shared_ptr<ShmOp> op_;
  bool done_ = false;
  bool timed_out_ = false;  // wait() threw CommTimeout: the destructor must not wait again
};

// A shared window every rank maps (share_node_memory). Its waits poll like the shared-memory
// pipeline's: a peer may be waiting for this rank's part of a queued reduction meanwhile.
class MpiNodeMemory final : public NodeSharedMemory {
 public:
  MpiNodeMemory(MPI_Win win, char* data, size_t bytes, CollectiveDesc desc, double timeout_s,
                std::shared_ptr<ShmProgress> progress)
      : win_(win),
        data_(data),
        bytes_(bytes),
        desc_(std::move(desc)),
        timeout_s_(timeout_s),
        progress_(std::move(progress)) {}
  MpiNodeMemory(const MpiNodeMemory&) = delete;  // owns an MPI window
  MpiNodeMemory& operator=(const MpiNodeMemory&) = delete;
  ~MpiNodeMemory() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    MPI_Win_unlock_all(win_);
    MPI_Win_free(&win_);  // collective, as the allocation was
  }
  char* data() override { return data_; }
  size_t bytes() const override { return bytes_; }
  void wait(const std::function<bool()>& ready, const std::string& what) override {
    bool timed_out = false;
    try {
      poll_until(desc_, timeout_s_, progress_->oversubscribed(), timed_out, [&] {
        const bool moved = progress_->progress_all();
        return PollResult{ready(), moved};
      });
    } catch (const CommTimeout& e) {
      throw e.for_purpose(what);
    }
  }

 private:
  MPI_Win win_;
  char* data_;
  size_t bytes_;
  CollectiveDesc desc_;
  double timeout_s_;
  std::shared_ptr<ShmProgress> progress_;
};

}  // namespace

std::unique_ptr<NodeSharedMemory> MpiCommunicator::share_node_memory(size_t bytes) {
  if (size_ < 2 || bytes == 0 || !all_on_one_node(comm_.get())) return nullptr;
  // Room in /dev/shm for it and as much again (the rest of the node's users), agreed by all.
  int ok = rank_ != 0 || dev_shm_free_bytes() / 2 >= bytes ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm_.get());
  if (!all_ok) return nullptr;
  constexpr size_t kAlign = 64;
  char* base = nullptr;
  MPI_Win win = MPI_WIN_NULL;
  const MPI_Aint mine = rank_ == 0 ? static_cast<MPI_Aint>(bytes + kAlign) : 0;
  int rc = MPI_Win_allocate_shared(mine, 1, MPI_INFO_NULL, comm_.get(), &base, &win);
  ok = rc == MPI_SUCCESS ? 1 : 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm_.get());
  if (!all_ok) return nullptr;  // MPI_Win_free is collective and some ranks have no window: leak it
  MPI_Aint size0 = 0;
  int disp = 0;
  void* ptr = nullptr;
  MPI_Win_shared_query(win, 0, &size0, &disp, &ptr);
  // Open MPI 4.1 gives segments 8-byte alignment; a mapping's offset in its page is the same in
  // every process, so every rank aligns alike.
  const auto at = reinterpret_cast<uintptr_t>(ptr);
  char* data = static_cast<char*>(ptr) + (kAlign - at % kAlign) % kAlign;
  // A passive-target epoch for the window's lifetime: accesses are plain loads and stores
  // ordered by C++ atomics in the memory (the unified model of a shared window).
  MPI_Win_lock_all(MPI_MODE_NOCHECK, win);
  return std::make_unique<MpiNodeMemory>(win, data, bytes, CollectiveDesc{"mpi", "node-shared wait", 0, DType::f32, 0},
                                         options().timeout_s, progress_);
}

MpiCommunicator::MpiCommunicator(MPI_Comm owned, std::shared_ptr<MpiHalfTypes> types,
                                 std::shared_ptr<ShmProgress> progress, std::shared_ptr<Watchdog> watchdog,
                                 const CommOptions& options, DevicePath path)
    : Communicator(options),
      comm_(owned),
      types_(std::move(types)),
      progress_(std::move(progress)),
      watchdog_(std::move(watchdog)),
      path_(std::move(path)),
      device_pointers_(path_.direct_moves) {
  MPI_Comm_rank(owned, &rank_);
  MPI_Comm_size(owned, &size_);
  // Errors come back as codes and become exceptions with the collective's name.
  MPI_Comm_set_errhandler(owned, MPI_ERRORS_RETURN);
  // Collective, like the constructor's callers; equal on every rank (the path is).
  if (!device_pointers_) shm_ = ShmChannel::create(owned, progress_);
}

// Device pointers: MPI's blocking collective `call` (the library takes device memory only there),
// its deadline kept by the watchdog; avg's division on the host is never asked for here (the
// device wrapper stages avg), and on host buffers it runs after the call.
template <class Call>
std::unique_ptr<Work> MpiCommunicator::blocking(const CollectiveDesc& desc, Call call,
                                                const std::function<void()>& finish) {
  Watchdog::Armed armed = watchdog_->arm(desc.text(), options().timeout_s);
  check(call(), desc);
  if (finish) finish();
  return std::make_unique<DoneWork>();
}

MpiCommunicator::~MpiCommunicator() {
  // Freeing the window is collective; finish what the peers may still wait on first.
  if (!shm_ || shm_->idle()) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(options().timeout_s);
  while (!shm_->idle() && std::chrono::steady_clock::now() < deadline) {
    if (!shm_->progress()) sched_yield();
  }
}

CollectiveDesc MpiCommunicator::describe(const char* collective, size_t count, DType dtype) {
  return {"mpi", collective, count, dtype, next_seq()};
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) const {
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_Comm_split(comm_.get(), color, key, &sub);
  return std::make_unique<MpiCommunicator>(sub, types_, progress_, watchdog_, options(), path_);
}

// From this many bytes (the whole gathered array) all_gather uses the blocking MPI_Allgather.
constexpr size_t kBlockingAllGatherBytes = size_t{64} * 1024;

std::unique_ptr<Work> MpiCommunicator::all_gather(const void* in, void* out, size_t count, DType dtype, Stream) {
  auto work = std::make_unique<MpiWork>(describe("all_gather", count, dtype), options().timeout_s, progress_);
  int n = checked_count(count, "all_gather");
  MPI_Datatype t = types_->datatype(dtype);
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-cstyle-cast): Open MPI's MPI_IN_PLACE is ((void*)1)
  const void* send = static_cast<const char*>(out) + rank_ * count * dtype_bytes(dtype) == in ? MPI_IN_PLACE : in;
  if (device_pointers_ || count * dtype_bytes(dtype) * static_cast<size_t>(size_) >= kBlockingAllGatherBytes) {
    // OpenMPI's non-blocking all_gather (libnbc) runs far below its blocking one (coll/tuned)
    // here: fsdp_bench f32 at np=2, 1-16 MiB, 1.8-2.4 GB/s busbw against 5.4-9.5. Host MPI makes
    // no progress outside MPI calls anyway, so the blocking call loses no overlap; it completes
    // before returning. Safe with our queued shared-memory collectives because every rank issues
    // collectives in the same order.
    // A blocking call cannot poll its deadline: the watchdog keeps comm.timeout_s for it.
    Watchdog::Armed armed = watchdog_->arm(work->desc().text(), options().timeout_s);
    check(MPI_Allgather(send, n, t, out, n, t, comm_.get()), work->desc());
    return std::make_unique<DoneWork>();
  }
  check(MPI_Iallgather(send, n, t, out, n, t, comm_.get(), work->request()), work->desc());
  return work;
}

std::unique_ptr<Work> MpiCommunicator::reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                                                      Stream) {
  if (shm_ && count > 0) {
    auto work = std::make_unique<ShmWork>(describe("reduce_scatter", count, dtype), options().timeout_s, progress_);
    std::vector<size_t> offsets(static_cast<size_t>(size_) + 1);
    for (size_t r = 0; r < offsets.size(); ++r) offsets[r] = r * count;
    work->attach(shm_->enqueue(ShmOp::Kind::reduce_scatter, in, out, nullptr, std::move(offsets), dtype, op));
    progress_->progress_all();  // stage what fits now: peers can start reducing before our next poll
    return work;
  }
  std::function<void()> finish;
  if (op == ReduceOp::avg) finish = [out, count, dtype, n = size_] { mpi_scale_for_avg(out, count, dtype, n); };
  int n = checked_count(count, "reduce_scatter");
  if (device_pointers_)
    return blocking(
        describe("reduce_scatter", count, dtype),
        [&] {
          return MPI_Reduce_scatter_block(in, out, n, types_->datatype(dtype), types_->op(dtype, op), comm_.get());
        },
        finish);
  auto work = std::make_unique<MpiWork>(describe("reduce_scatter", count, dtype), options().timeout_s, progress_,
                                        std::move(finish));
  check(MPI_Ireduce_scatter_block(in, out, n, types_->datatype(dtype), types_->op(dtype, op), comm_.get(),
                                  work->request()),
        work->desc());
  return work;
}

std::unique_ptr<Work> MpiCommunicator::all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                                                  Stream) {
  if (shm_ && count > 0) {
    // Slices rounded to 64 bytes keep every rank's chunks cache-line aligned.
    const size_t esize = dtype_bytes(dtype);
    const size_t align = 64 / esize;
    const size_t per = ((count + size_ - 1) / size_ + align - 1) / align * align;
    std::vector<size_t> offsets(static_cast<size_t>(size_) + 1);
    for (size_t r = 0; r < offsets.size(); ++r) offsets[r] = std::min(count, r * per);
    auto work = std::make_unique<ShmWork>(describe("all_reduce", count, dtype), options().timeout_s, progress_);
    char* mine = static_cast<char*>(out) + offsets[static_cast<size_t>(rank_)] * esize;
    work->attach(shm_->enqueue(ShmOp::Kind::all_reduce, in, mine, out, std::move(offsets), dtype, op));
    progress_->progress_all();
    return work;
  }
  std::function<void()> finish;
  if (op == ReduceOp::avg) finish = [out, count, dtype, n = size_] { mpi_scale_for_avg(out, count, dtype, n); };
  int n = checked_count(count, "all_reduce");
  const void* send = in == out ? MPI_IN_PLACE : in;  // NOLINT(cppcoreguidelines-pro-type-cstyle-cast): as above
  if (device_pointers_)
    return blocking(
        describe("all_reduce", count, dtype),
        [&] { return MPI_Allreduce(send, out, n, types_->datatype(dtype), types_->op(dtype, op), comm_.get()); },
        finish);
  auto work = std::make_unique<MpiWork>(describe("all_reduce", count, dtype), options().timeout_s, progress_,
                                        std::move(finish));
  check(MPI_Iallreduce(send, out, n, types_->datatype(dtype), types_->op(dtype, op), comm_.get(), work->request()),
        work->desc());
  return work;
}

std::unique_ptr<Work> MpiCommunicator::broadcast(void* buf, size_t count, DType dtype, int root, Stream) {
  auto work = std::make_unique<MpiWork>(describe("broadcast", count, dtype), options().timeout_s, progress_);
  if (root < 0 || root >= size_)
    throw Error(work->desc().text() + ": root " + std::to_string(root) + " outside [0, " + std::to_string(size_) + ")");
  if (device_pointers_)
    return blocking(work->desc(), [&] {
      return MPI_Bcast(buf, checked_count(count, "broadcast"), types_->datatype(dtype), root, comm_.get());
    });
  check(MPI_Ibcast(buf, checked_count(count, "broadcast"), types_->datatype(dtype), root, comm_.get(), work->request()),
        work->desc());
  return work;
}

void MpiCommunicator::barrier() {
  MpiWork work(describe("barrier", 0, DType::u8), options().timeout_s, progress_);
  check(MPI_Ibarrier(comm_.get(), work.request()), work.desc());
  work.wait();
}

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm bootstrap, const CommOptions& options) {
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Comm_dup(bootstrap, &dup);  // our traffic never matches the application's
  auto progress = std::make_shared<ShmProgress>(node_oversubscribed(dup));
  // Only a device run asks the library: a host run's buffers are all host memory.
  DevicePath path;
  if (options.runtime && options.runtime->device() == Device::cuda)
    path = agree_device_path(choose_device_path(options.device_buffers, mpi_device_support()), dup);
  return std::make_unique<MpiCommunicator>(dup, std::make_shared<MpiHalfTypes>(), std::move(progress),
                                           std::make_shared<Watchdog>(), options, std::move(path));
}

}  // namespace fsdp
