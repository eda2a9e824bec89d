#include "comm/device_comm.h"

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fsdp {

namespace {

// Staging regions start on this boundary (element alignment for every dtype, and whole cache
// lines for the host collective).
constexpr size_t kAlign = 256;
constexpr size_t kMinStagingBytes = size_t{4} << 10;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
size_t staging_capacity(size_t bytes) {
  size_t cap = kMinStagingBytes;
  while (cap < bytes) cap *= 2;
  return cap;
}

// "mpi all_reduce (count 5, f32)": what a failed device wait was for. The wrapped
// communicator's sequence number is its own, so it is not named here.
std::string what_for(std::string_view backend, const char* collective, size_t count, DType dtype) {
  return std::string(backend) + " " + collective + " (count " + std::to_string(count) + ", " +
         std::string(dtype_name(dtype)) + ")";
}

// The host waits for `event` with the comm timeout; a failure names the collective it was for,
// and keeps its type (a timeout stays a CommTimeout).
void synchronize_for(DeviceRuntime& rt, const Event& event, double timeout_s, const std::string& what) {
  try {
    rt.synchronize(event, timeout_s);
  } catch (const CommTimeout& e) {
    throw CommTimeout(what + ": " + e.what());
  } catch (const Error& e) {
    throw Error(what + ": " + e.what());
  }
}

// The Work of a call with device pointers (and, on such a path, of every call: a UCX family's
// progress moves any ring in flight): the library's tests and waits, and a wait in its
// destructor, run inside runtime.library_access (nothing on a GPU; the fake device opens its
// memory).
class LibraryWork final : public Work {
 public:
  LibraryWork(std::unique_ptr<Work> inner, DeviceRuntime& rt) : inner_(std::move(inner)), rt_(rt) {}
  ~LibraryWork() override {
    try {
      rt_.library_access([&] { inner_.reset(); });
    } catch (...) {  // a destructor's wait that failed: the error was the caller's to see
    }
  }
  LibraryWork(const LibraryWork&) = delete;
  LibraryWork& operator=(const LibraryWork&) = delete;
  bool test() override {
    bool done = false;
    rt_.library_access([&] { done = inner_->test(); });
    return done;
  }
  void wait() override {
    rt_.library_access([&] { inner_->wait(); });
  }
  void wait_on(Stream stream) override {
    rt_.library_access([&] { inner_->wait_on(stream); });
  }

 private:
  std::unique_ptr<Work> inner_;
  DeviceRuntime& rt_;
};

// ---- the staging cache ----

struct StagingSlot {
  void* ptr = nullptr;
  size_t bytes = 0;
  bool busy = false;
  bool abandoned = false;                // a collective that never completed may still write here
  std::shared_ptr<const Event> pending;  // the last host->device copy out of it
};

// Pinned host buffers of one communicator. Shared with its Works (a Work may outlive it).
class StagingPool {
 public:
  StagingPool(DeviceRuntime& rt, double timeout_s) : rt_(rt), timeout_s_(timeout_s) {}
  ~StagingPool() {
    for (const auto& s : slots_) {
      if (s->abandoned || !s->ptr) continue;  // leaked on purpose (see StagingSlot::abandoned)
      try {
        if (s->pending && !s->pending->done()) rt_.synchronize(*s->pending, timeout_s_);
        rt_.free_pinned(s->ptr);
      } catch (...) {
        // A copy that cannot be waited for may still read the buffer: leak it.
      }
    }
  }
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // A free slot of at least `bytes`, its previous copy complete. The smallest that fits; else a
  // free one grown; else a new one.
  StagingSlot* acquire(size_t bytes, const std::string& what) {
    StagingSlot* best = nullptr;
    StagingSlot* any_free = nullptr;
    for (const auto& s : slots_) {
      if (s->busy || s->abandoned) continue;
      if (!any_free || s->bytes > any_free->bytes) any_free = s.get();
      if (s->bytes >= bytes && (!best || s->bytes < best->bytes)) best = s.get();
    }
    StagingSlot* slot = best ? best : any_free;
    if (!slot) {
      slots_.push_back(std::make_unique<StagingSlot>());
      slot = slots_.back().get();
    }
    if (slot->pending) {
      // The host is about to write this buffer (the copy in, or the collective's result).
      if (!slot->pending->done()) synchronize_for(rt_, *slot->pending, timeout_s_, what + ": staging buffer reuse");
      slot->pending.reset();
    }
    if (slot->bytes < bytes) {
      if (slot->ptr) rt_.free_pinned(slot->ptr);
      slot->ptr = nullptr;
      slot->bytes = 0;
      const size_t cap = staging_capacity(bytes);
      slot->ptr = rt_.allocate_pinned(cap);
      slot->bytes = cap;
    }
    slot->busy = true;
    return slot;
  }

 private:
  DeviceRuntime& rt_;
  double timeout_s_;
  std::vector<std::unique_ptr<StagingSlot>> slots_;
};

// One slot of a pool, held by one collective; back to the pool on destruction.
class StagingLease {
 public:
  StagingLease() = default;
  StagingLease(std::shared_ptr<StagingPool> pool, StagingSlot* slot) : pool_(std::move(pool)), slot_(slot) {}
  StagingLease(StagingLease&& o) noexcept : pool_(std::move(o.pool_)), slot_(std::exchange(o.slot_, nullptr)) {}
  StagingLease& operator=(StagingLease&&) = delete;
  StagingLease(const StagingLease&) = delete;
  StagingLease& operator=(const StagingLease&) = delete;
  ~StagingLease() { release(nullptr); }

  char* base() const { return static_cast<char*>(slot_->ptr); }
  // Free for reuse once `pending` (the copy out of it; null: none) has completed.
  void release(std::shared_ptr<const Event> pending) {
    if (!slot_) return;
    slot_->pending = std::move(pending);
    slot_->busy = false;
    slot_ = nullptr;
  }
  // Never reused nor freed: something may still write to it.
  void abandon() {
    if (!slot_) return;
    slot_->abandoned = true;
    slot_->busy = false;
    slot_ = nullptr;
  }

 private:
  std::shared_ptr<StagingPool> pool_;  // keeps the slot alive
  StagingSlot* slot_ = nullptr;
};

// A device input and where it goes in the staging buffer.
struct CopyIn {
  size_t offset = 0;
  const void* device = nullptr;
  size_t bytes = 0;
};
// A device output and where it comes from in the staging buffer.
struct CopyOut {
  size_t offset = 0;
  void* device = nullptr;
  size_t bytes = 0;
};

// What one staged collective moves: its staging size, the device->host copy before the wrapped
// collective and the host->device copy after it (either may be absent).
struct StagePlan {
  size_t bytes = 0;
  std::optional<CopyIn> in;
  std::optional<CopyOut> out;
};

// The Work of a staged collective: copies the result to the device at the first wait/wait_on.
class StagedWork final : public Work {
 public:
  StagedWork(std::unique_ptr<Work> inner, StagingLease lease, std::optional<CopyOut> out, DeviceRuntime& rt,
             Stream stream, double timeout_s, std::string what)
      : rt_(rt),
        stream_(stream),
        timeout_s_(timeout_s),
        what_(std::move(what)),
        out_(out),
        lease_(std::move(lease)),
        inner_(std::move(inner)) {}
  StagedWork(const StagedWork&) = delete;
  StagedWork& operator=(const StagedWork&) = delete;
  ~StagedWork() override {
    if (copied_) return;
    // Dropped before the result was copied back: the wrapped collective may still write the
    // staging buffer. Finish it (its own wait is bounded by the timeout; not again after a
    // timeout) before the buffer goes back; abandon the buffer if it never finished.
    bool done = false;
    try {
      done = inner_->test();
      if (!done && !failed_) {
        inner_->wait();
        done = true;
      }
    } catch (...) {
    }
    if (!done) lease_.abandon();
    inner_.reset();  // before the lease goes back to the pool
  }

  bool test() override { return inner_->test(); }

  void wait() override {
    if (!copied_) complete(stream_);
    if (event_ && !event_->done()) synchronize_for(rt_, *event_, timeout_s_, what_ + ": copying the result back");
  }

  void wait_on(Stream stream) override {
    const Stream s = stream.native ? stream : rt_.compute_stream();
    if (!copied_) {
      complete(s);
    } else if (event_ && s != copy_stream_) {
      rt_.wait(s, *event_);
    }
  }

 private:
  // The wrapped wait, then the host->device copy on `s`; the staging buffer goes back to the
  // pool, reusable once that copy has completed.
  void complete(Stream s) {
    try {
      inner_->wait();
    } catch (...) {
      failed_ = true;
      throw;
    }
    failed_ = false;
    if (out_) {
      rt_.copy_async(out_->device, lease_.base() + out_->offset, out_->bytes, CopyKind::host_to_device, s);
      event_ = rt_.record(s);
    }
    copied_ = true;
    copy_stream_ = s;
    lease_.release(event_);
  }

  DeviceRuntime& rt_;
  Stream stream_;  // the call's stream (resolved)
  double timeout_s_;
  std::string what_;
  std::optional<CopyOut> out_;
  StagingLease lease_;  // declared before inner_: the wrapped Work goes first
  std::unique_ptr<Work> inner_;
  std::shared_ptr<const Event> event_;  // the host->device copy
  Stream copy_stream_;
  bool copied_ = false;
  bool failed_ = false;  // the last wrapped wait threw (a timeout): do not wait again on destruction
};

class DeviceCommunicator final : public Communicator {
 public:
  DeviceCommunicator(std::unique_ptr<Communicator> host, DeviceRuntime& rt, DevicePath path)
      : Communicator(host->options()),
        host_(std::move(host)),
        rt_(rt),
        path_(std::move(path)),
        pool_(std::make_shared<StagingPool>(rt, options().timeout_s)) {}

  std::string_view backend() const override { return host_->backend(); }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::unique_ptr<Communicator> split(int color, int key) const override {
    return wrap_for_device(host_->split(color, key), rt_, path_);
  }
  DevicePath device_path() const override { return path_; }
  void barrier() override {
    if (path_.direct_moves) {
      rt_.library_access([&] { host_->barrier(); });  // progresses the family's rings, as guarded()
    } else {
      host_->barrier();
    }
  }

  std::unique_ptr<Work> all_gather(const void* in, void* out, size_t count, DType dtype, Stream stream) override {
    const size_t ib = count * dtype_bytes(dtype), ob = ib * static_cast<size_t>(size());
    const bool din = on_device(in), dout = on_device(out);
    auto host_call = [&](const void* hin, void* hout) { return host_->all_gather(hin, hout, count, dtype, stream); };
    if (count == 0 || (!din && !dout)) return guarded([&] { return host_call(in, out); });
    const std::string what = what_for(backend(), "all_gather", count, dtype);
    if (path_.direct_moves && din && dout) {
      // In place on the device first: no backend then copies the input on the host.
      char* slot = static_cast<char*>(out) + static_cast<size_t>(rank()) * ib;
      if (slot != in) rt_.copy_async(slot, in, ib, CopyKind::device_to_device, resolve(stream));
      return direct(stream, what, [&] { return host_call(slot, out); });
    }
    StagePlan p;
    if (dout) {
      // The whole output; a device input goes to its own slot of it, so the wrapped collective
      // runs in place (whether or not the call was).
      p.bytes = ob;
      p.out = CopyOut{0, out, ob};
      if (din) p.in = CopyIn{static_cast<size_t>(rank()) * ib, in, ib};
    } else {
      p.bytes = ib;
      p.in = CopyIn{0, in, ib};
    }
    return staged(p, stream, what, [&](char* s) { return host_call(din ? s + p.in->offset : in, dout ? s : out); });
  }

  std::unique_ptr<Work> reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                                       Stream stream) override {
    const size_t ob = count * dtype_bytes(dtype), ib = ob * static_cast<size_t>(size());
    const bool din = on_device(in), dout = on_device(out);
    auto host_call = [&](const void* hin, void* hout) {
      return host_->reduce_scatter(hin, hout, count, dtype, op, stream);
    };
    if (count == 0 || (!din && !dout)) return guarded([&] { return host_call(in, out); });
    const std::string what = what_for(backend(), "reduce_scatter", count, dtype);
    // Direct when the backend hands device pointers to a library that reduces them (a CUDA-aware
    // MPI's blocking reductions); avg is staged: its division runs on the host.
    if (path_.direct_reductions && op != ReduceOp::avg && din && dout)
      return direct(stream, what, [&] { return host_call(in, out); });
    StagePlan p;
    if (din) {
      p.in = CopyIn{0, in, ib};
      p.bytes = align_up(ib);
    }
    if (dout) {
      p.out = CopyOut{p.bytes, out, ob};
      p.bytes += ob;
    }
    return staged(p, stream, what,
                  [&](char* s) { return host_call(din ? s + p.in->offset : in, dout ? s + p.out->offset : out); });
  }

  std::unique_ptr<Work> all_reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                                   Stream stream) override {
    const size_t b = count * dtype_bytes(dtype);
    const bool din = on_device(in), dout = on_device(out);
    auto host_call = [&](const void* hin, void* hout) {
      return host_->all_reduce(hin, hout, count, dtype, op, stream);
    };
    if (count == 0 || (!din && !dout)) return guarded([&] { return host_call(in, out); });
    const std::string what = what_for(backend(), "all_reduce", count, dtype);
    if (path_.direct_reductions && op != ReduceOp::avg && din && dout)
      return direct(stream, what, [&] { return host_call(in, out); });  // as reduce_scatter
    // One region: with both sides on the device the wrapped collective runs in place in it.
    StagePlan p;
    p.bytes = b;
    if (din) p.in = CopyIn{0, in, b};
    if (dout) p.out = CopyOut{0, out, b};
    return staged(p, stream, what, [&](char* s) { return host_call(din ? s : in, dout ? s : out); });
  }

  std::unique_ptr<Work> broadcast(void* buf, size_t count, DType dtype, int root, Stream stream) override {
    const size_t b = count * dtype_bytes(dtype);
    auto host_call = [&](void* hbuf) { return host_->broadcast(hbuf, count, dtype, root, stream); };
    if (count == 0 || !on_device(buf)) return guarded([&] { return host_call(buf); });
    const std::string what = what_for(backend(), "broadcast", count, dtype);
    if (path_.direct_moves) return direct(stream, what, [&] { return host_call(buf); });
    // The root's buffer is only read, the others' only written.
    StagePlan p;
    p.bytes = b;
    if (rank() == root) {
      p.in = CopyIn{0, buf, b};
    } else {
      p.out = CopyOut{0, buf, b};
    }
    return staged(p, stream, what, [&](char* s) { return host_call(s); });
  }

 private:
  bool on_device(const void* p) const { return p && rt_.is_device_pointer(p); }
  Stream resolve(Stream s) const { return s.native ? s : rt_.compute_stream(); }

  // On a path with device pointers, any call may progress a device-pointer collective in flight
  // (a UCX family's progress moves every ring): its call and its Work's waits run inside
  // library_access too.
  template <class Call>
  std::unique_ptr<Work> guarded(Call call) {
    if (!path_.direct_moves) return call();
    std::unique_ptr<Work> work;
    rt_.library_access([&] { work = call(); });
    return std::make_unique<LibraryWork>(std::move(work), rt_);
  }

  // Device pointers: the library reads the device buffers once the stream's work so far is done.
  template <class Call>
  std::unique_ptr<Work> direct(Stream stream, const std::string& what, Call call) {
    const std::unique_ptr<Event> ready = rt_.record(resolve(stream));
    synchronize_for(rt_, *ready, options().timeout_s, what + ": waiting for the stream before the collective");
    return guarded(call);  // a direct path: always inside library_access
  }

  // Staged: the device input into the staging buffer (the host waits for it), the wrapped
  // collective on host memory, the result copied back by the returned Work.
  template <class Call>
  std::unique_ptr<Work> staged(const StagePlan& p, Stream stream, const std::string& what, Call call) {
    const Stream s = resolve(stream);
    StagingLease lease(pool_, pool_->acquire(p.bytes, what));
    if (p.in) {
      rt_.copy_async(lease.base() + p.in->offset, p.in->device, p.in->bytes, CopyKind::device_to_host, s);
      try {
        const std::unique_ptr<Event> copied = rt_.record(s);
        synchronize_for(rt_, *copied, options().timeout_s, what + ": copying the input to host memory");
      } catch (...) {
        lease.abandon();  // the copy may still write to it
        throw;
      }
    }
    std::unique_ptr<Work> inner = guarded([&] { return call(lease.base()); });
    return std::make_unique<StagedWork>(std::move(inner), std::move(lease), p.out, rt_, s, options().timeout_s, what);
  }

  std::unique_ptr<Communicator> host_;
  DeviceRuntime& rt_;
  DevicePath path_;
  std::shared_ptr<StagingPool> pool_;
};

}  // namespace

std::unique_ptr<Communicator> wrap_for_device(std::unique_ptr<Communicator> host, DeviceRuntime& runtime,
                                              DevicePath path) {
  if (!host) return host;
  return std::make_unique<DeviceCommunicator>(std::move(host), runtime, std::move(path));
}

}  // namespace fsdp
