// Device buffers on the host backends (comm/device_comm.h) without a GPU: a fake DeviceRuntime
// whose "device" memory is host memory it allocated itself, and whose streams are deferred
// queues. A copy or a stream wait enqueued on a stream runs only when the host synchronises on
// that stream or on an event recorded after it, so a staged buffer handed to MPI before the host
// waited for its copy still holds its poison, and a device result read before the copy back ran
// is still the sentinel. The runtime counts copies by kind, host synchronisations and pinned
// allocations. Run under mpirun (tests/mpirun.sh NP test_device_comm ...); one rank works too.
//
// Every rank runs every case over every host backend built (mpi, ucx); only rank 0 logs. A
// failing rank names itself on stderr and exits non-zero, so mpirun does too.
#define BOOST_TEST_NO_MAIN
#include <mpi.h>
#include <boost/test/results_reporter.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "comm/device_comm.h"
#include "comm/mpi_env.h"
#include "mpi/mpi_cuda.h"
#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/error.h"

#include "mpi_test.h"

namespace ut = boost::unit_test;
using fsdp::Communicator;
using fsdp::CopyKind;
using fsdp::DType;
using fsdp::ReduceOp;
using fsdp::Stream;
using fsdp::testing::report;
using fsdp::testing::world_rank;
using fsdp::testing::world_size;

namespace {

constexpr double kTimeout_s = 30;

// ---- the fake device ----

class FakeRuntime;

class FakeEvent final : public fsdp::Event {
 public:
  FakeEvent(const FakeRuntime& rt, void* stream, size_t index) : rt_(rt), stream(stream), index(index) {}
  bool done() const override;
  const FakeRuntime& rt_;
  void* stream;
  size_t index;  // done once the stream has run this many operations
};

struct Counts {
  size_t d2h = 0, h2d = 0, other_copies = 0;
  size_t host_syncs = 0;    // synchronize(event) and synchronize(stream)
  size_t stream_waits = 0;  // wait(stream, event)
  size_t pinned_allocs = 0, pinned_frees = 0;
  size_t null_stream_ops = 0;  // anything enqueued on Stream{} (the wrapper resolves it first)
};

class FakeRuntime final : public fsdp::DeviceRuntime {
 public:
  FakeRuntime() = default;
  ~FakeRuntime() override {
    for (auto& [p, bytes] : device_) std::free(const_cast<char*>(p));
    for (void* p : pinned_) std::free(p);
  }
  FakeRuntime(const FakeRuntime&) = delete;
  FakeRuntime& operator=(const FakeRuntime&) = delete;

  fsdp::Device device() const override { return fsdp::Device::cuda; }
  std::string describe() const override { return "fake cuda"; }
  fsdp::MemoryTracker& tracker() override { return tracker_; }

  void* allocate(size_t bytes, fsdp::MemCategory, Stream) override {
    void* p = std::malloc(std::max<size_t>(bytes, 1));
    std::memset(p, 0xEE, std::max<size_t>(bytes, 1));
    device_[static_cast<const char*>(p)] = std::max<size_t>(bytes, 1);
    return p;
  }
  void deallocate(void* ptr, size_t, fsdp::MemCategory, Stream) override {
    device_.erase(static_cast<const char*>(ptr));
    std::free(ptr);
  }
  void* allocate_pinned(size_t bytes) override {
    ++counts.pinned_allocs;
    void* p = std::malloc(bytes);
    std::memset(p, 0xFF, bytes);  // poison: NaN in every float type, -1 in the integers
    pinned_.push_back(p);
    return p;
  }
  void free_pinned(void* ptr) override {
    ++counts.pinned_frees;
    pinned_.erase(std::find(pinned_.begin(), pinned_.end(), ptr));
    std::free(ptr);
  }
  bool is_device_pointer(const void* ptr) const override {
    const auto* a = static_cast<const char*>(ptr);
    auto it = device_.upper_bound(a);
    if (it == device_.begin()) return false;
    --it;
    return a < it->first + it->second;
  }

  void copy_async(void* dst, const void* src, size_t bytes, CopyKind kind, Stream stream) override {
    switch (kind) {
      case CopyKind::device_to_host:
        ++counts.d2h;
        check(is_device_pointer(src) && !is_device_pointer(dst), "device_to_host copy between wrong spaces");
        break;
      case CopyKind::host_to_device:
        ++counts.h2d;
        check(!is_device_pointer(src) && is_device_pointer(dst), "host_to_device copy between wrong spaces");
        break;
      default: ++counts.other_copies;
    }
    enqueue(stream, [dst, src, bytes] { std::memcpy(dst, src, bytes); });
  }
  void memset_async(void* dst, int value, size_t bytes, Stream stream) override {
    enqueue(stream, [=] { std::memset(dst, value, bytes); });
  }

  Stream compute_stream() override { return Stream{&compute_}; }
  Stream comm_stream() override { return Stream{&comm_}; }
  Stream user_stream() { return Stream{&user_}; }
  std::unique_ptr<fsdp::Event> record(Stream stream) override {
    if (!stream.native) ++counts.null_stream_ops;
    return std::make_unique<FakeEvent>(*this, stream.native, queues_[stream.native].ops.size());
  }
  void wait(Stream stream, const fsdp::Event& event) override {
    ++counts.stream_waits;
    const auto& e = dynamic_cast<const FakeEvent&>(event);
    enqueue(stream, [this, s = e.stream, i = e.index] { run_until(s, i); });
  }
  void synchronize(const fsdp::Event& event, double timeout_s) override {
    ++counts.host_syncs;
    last_timeout_s = timeout_s;
    const auto& e = dynamic_cast<const FakeEvent&>(event);
    run_until(e.stream, e.index);
  }
  void synchronize(Stream stream) override {
    ++counts.host_syncs;
    run_until(stream.native, queues_[stream.native].ops.size());
  }
  fsdp::Kernels& kernels() override { throw fsdp::Error("the fake runtime has no kernels"); }

  // Operations enqueued on `stream` and not yet run.
  size_t pending(Stream stream) {
    const Queue& q = queues_[stream.native];
    return q.ops.size() - q.done;
  }
  size_t ran(void* stream) const {
    auto it = queues_.find(stream);
    return it == queues_.end() ? 0 : it->second.done;
  }

  Counts counts;
  double last_timeout_s = -1;
  std::vector<std::string> errors;

 private:
  struct Queue {
    std::vector<std::function<void()>> ops;
    size_t done = 0;
  };
  void check(bool ok, const std::string& what) {
    if (!ok) errors.push_back(what);
  }
  void enqueue(Stream stream, std::function<void()> op) {
    if (!stream.native) ++counts.null_stream_ops;
    queues_[stream.native].ops.push_back(std::move(op));
  }
  void run_until(void* stream, size_t index) {
    Queue& q = queues_[stream];
    while (q.done < index) {
      auto op = q.ops[q.done++];  // a copy: the op may enqueue onto another stream's vector
      op();
    }
  }

  fsdp::MemoryTracker tracker_;
  std::map<const char*, size_t> device_;  // std::less orders any pointers
  std::vector<void*> pinned_;
  std::map<void*, Queue> queues_;
  char compute_ = 0, comm_ = 0, user_ = 0;  // their addresses are the streams
};

bool FakeEvent::done() const { return rt_.ran(stream) >= index; }

// ---- buffers on the host or the fake device, read and written through double ----

class Buf {
 public:
  Buf(FakeRuntime& rt, bool device, DType d, size_t count) : rt_(rt), device_(device), d_(d), count_(count) {
    const size_t bytes = count * fsdp::dtype_bytes(d);
    ptr_ = device ? rt.allocate(bytes, fsdp::MemCategory::comm, rt.compute_stream()) : std::malloc(bytes + 1);
  }
  ~Buf() {
    if (device_)
      rt_.deallocate(ptr_, count_ * fsdp::dtype_bytes(d_), fsdp::MemCategory::comm, rt_.compute_stream());
    else
      std::free(ptr_);
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  void* data() const { return ptr_; }
  char* at(size_t i) const { return static_cast<char*>(ptr_) + i * fsdp::dtype_bytes(d_); }
  size_t count() const { return count_; }
  double get(size_t i) const { return fsdp::load_element(ptr_, d_, i); }
  void set(size_t i, double v) { fsdp::store_element(ptr_, d_, i, v); }

 private:
  FakeRuntime& rt_;
  bool device_;
  DType d_;
  size_t count_;
  void* ptr_;
};

// Values exact in every dtype used (bf16 holds integers to 256), as in test_comm.
constexpr double kSentinel = -1000;
double gather_value(int r, size_t j) {
  return static_cast<double>((static_cast<uint64_t>(r) * 131 + j * 7) % 241) - 120;
}
double sum_value(int r, size_t j) { return static_cast<double>((static_cast<uint64_t>(r) * 5 + j * 3) % 7) - 3; }
double expected_sum(int n, size_t j) {
  double s = 0;
  for (int r = 0; r < n; ++r) s += sum_value(r, j);
  return s;
}

// Counts every element that differs; one message per buffer.
void check_values(const Buf& b, size_t begin, size_t end, const std::function<double(size_t)>& expect,
                  const std::string& what) {
  size_t wrong = 0, first = 0;
  for (size_t i = begin; i < end; ++i)
    if (b.get(i) != expect(i) && wrong++ == 0) first = i;
  if (wrong == 0) {
    BOOST_CHECK(true);
    return;
  }
  report(false, what + ": " + std::to_string(wrong) + " wrong elements; first [" + std::to_string(first) +
                    "] = " + std::to_string(b.get(first)) + ", expected " + std::to_string(expect(first)));
}

// ---- the wrapped communicators under test ----

// staged: every device buffer through pinned staging; aware: device pointers for every
// collective (a CUDA-aware MPI); movers: device pointers for all_gather and broadcast only, the
// reductions staged (a UCX with CUDA memory: its rings reduce on the host).
enum class Mode { staged, aware, movers };

fsdp::DevicePath path_of(Mode mode) { return {mode != Mode::staged, mode == Mode::aware, "test"}; }
Mode mode_of(const fsdp::DevicePath& p) {
  return !p.direct_moves ? Mode::staged : p.direct_reductions ? Mode::aware : Mode::movers;
}
// Whether the wrapper hands this call's device pointers to the library (comm/device_comm.h):
// both sides on the device, and for a reduction (sum) a path that reduces on the device.
bool direct_call(Mode mode, bool reduction, bool din, bool dout) {
  if (mode == Mode::staged || !din || !dout) return false;
  return !reduction || mode == Mode::aware;
}

std::vector<std::string> host_backends() {
  std::vector<std::string> out;
  for (const std::string& b : fsdp::built_backends())
    if (b != "nccl") out.push_back(b);
  return out;
}

// Through the registry, as the trainer gets it (comm.device_buffers auto: device pointers where
// the library says it reads device memory, staged otherwise).
std::unique_ptr<Communicator> registry_comm(const std::string& backend, FakeRuntime& rt) {
  fsdp::CommOptions o{kTimeout_s};
  o.runtime = &rt;
  return fsdp::make_communicator(backend, MPI_COMM_WORLD, o);
}
Mode registry_mode(const Communicator& c) { return mode_of(c.device_path()); }
// Explicitly staged or device-aware, whatever the library.
std::unique_ptr<Communicator> wrapped_comm(const std::string& backend, FakeRuntime& rt, Mode mode) {
  return fsdp::wrap_for_device(fsdp::make_communicator(backend, MPI_COMM_WORLD, fsdp::CommOptions{kTimeout_s}), rt,
                               path_of(mode));
}

std::string where(const Communicator& c, Mode mode, const std::string& what) {
  const char* how = mode == Mode::aware    ? " (device pointers) "
                    : mode == Mode::movers ? " (movers direct) "
                                           : " (staged) ";
  return std::string(c.backend()) + how + what + " on rank " + std::to_string(c.rank()) + "/" +
         std::to_string(c.size());
}

// What one collective must have cost: staged, one device->host copy when a device buffer is read
// and one host->device copy when a device buffer is written; direct (device pointers), nothing but
// a host wait for the stream and `want_d2d` device copies (an all_gather made in place); nothing
// at all for host buffers.
void check_costs(FakeRuntime& rt, const Counts& before, bool direct, bool reads_device, bool writes_device,
                 const std::string& what, size_t want_d2d = 0) {
  const Counts& now = rt.counts;
  const bool any_device = reads_device || writes_device;
  const size_t want_d2h = !direct && reads_device ? 1 : 0;
  const size_t want_h2d = !direct && writes_device ? 1 : 0;
  report(now.d2h - before.d2h == want_d2h, what + ": " + std::to_string(now.d2h - before.d2h) +
                                               " device->host copies, expected " + std::to_string(want_d2h));
  report(now.h2d - before.h2d == want_h2d, what + ": " + std::to_string(now.h2d - before.h2d) +
                                               " host->device copies, expected " + std::to_string(want_h2d));
  report(now.other_copies - before.other_copies == want_d2d,
         what + ": " + std::to_string(now.other_copies - before.other_copies) +
             " device/host-to-same-space copies, expected " + std::to_string(want_d2d));
  if (!any_device) report(now.host_syncs == before.host_syncs, what + ": host buffers made the host synchronise");
  if (direct && any_device)
    report(now.host_syncs > before.host_syncs, what + ": a device-pointer call did not synchronise the stream first");
  if (direct) report(now.pinned_allocs == before.pinned_allocs, what + ": a device-pointer call staged");
  report(now.null_stream_ops == 0, what + ": something was enqueued on the null stream");
  report(rt.errors.empty(), what + ": " + (rt.errors.empty() ? "" : rt.errors.front()));
}

// Fills `b` the way device work would: a host->device copy enqueued on `stream` and not yet run.
// A collective that reads `b` before the host synchronised the stream reads the fill pattern.
std::shared_ptr<std::vector<char>> fill_on_stream(FakeRuntime& rt, Buf& b, DType d, Stream stream,
                                                  const std::function<double(size_t)>& value) {
  auto host = std::make_shared<std::vector<char>>(b.count() * fsdp::dtype_bytes(d));
  for (size_t i = 0; i < b.count(); ++i) fsdp::store_element(host->data(), d, i, value(i));
  rt.copy_async(b.data(), host->data(), host->size(), CopyKind::host_to_device, stream);
  return host;  // alive until the stream ran the copy
}

// One collective of each kind with the given placement; `in_place` where the collective has
// that form. Inputs on the device are written by a pending stream copy (see fill_on_stream).
void run_all_gather(Communicator& c, FakeRuntime& rt, Mode mode, DType d, size_t count, bool din, bool dout,
                    bool in_place, Stream stream) {
  const int n = c.size(), r = c.rank();
  const std::string what = where(c, mode,
                                 "all_gather " + std::string(fsdp::dtype_name(d)) + " count " + std::to_string(count) +
                                     (in_place ? " in place" : "") + (din ? " din" : "") + (dout ? " dout" : ""));
  Buf out(rt, dout, d, count * static_cast<size_t>(n));
  for (size_t i = 0; i < out.count(); ++i) out.set(i, kSentinel);
  std::unique_ptr<Buf> in_buf;
  const void* in = nullptr;
  std::shared_ptr<std::vector<char>> keep;
  if (in_place) {
    for (size_t i = 0; i < count; ++i) out.set(static_cast<size_t>(r) * count + i, gather_value(r, i));
    in = out.at(static_cast<size_t>(r) * count);
  } else {
    in_buf = std::make_unique<Buf>(rt, din, d, count);
    if (din) {
      keep = fill_on_stream(rt, *in_buf, d, stream.native ? stream : rt.compute_stream(),
                            [&](size_t i) { return gather_value(r, i); });
    } else {
      for (size_t i = 0; i < count; ++i) in_buf->set(i, gather_value(r, i));
    }
    in = in_buf->data();
  }
  const Counts base = rt.counts;  // after the fill: its copy is the test's own
  auto work = c.all_gather(in, out.data(), count, d, stream);
  work->wait();
  const bool direct = direct_call(mode, false, din, dout);
  check_costs(rt, base, direct, din, dout, what, direct && !in_place ? 1 : 0);
  check_values(
      out, 0, out.count(), [&](size_t j) { return gather_value(static_cast<int>(j / count), j % count); }, what);
}

void run_reduce_scatter(Communicator& c, FakeRuntime& rt, Mode mode, DType d, size_t count, bool din, bool dout,
                        Stream stream) {
  const int n = c.size(), r = c.rank();
  const std::string what = where(c, mode,
                                 "reduce_scatter " + std::string(fsdp::dtype_name(d)) + " count " +
                                     std::to_string(count) + (din ? " din" : "") + (dout ? " dout" : ""));
  Buf in(rt, din, d, count * static_cast<size_t>(n)), out(rt, dout, d, count);
  for (size_t i = 0; i < count; ++i) out.set(i, kSentinel);
  std::shared_ptr<std::vector<char>> keep;
  if (din) {
    keep = fill_on_stream(rt, in, d, stream.native ? stream : rt.compute_stream(),
                          [&](size_t j) { return sum_value(r, j); });
  } else {
    for (size_t j = 0; j < in.count(); ++j) in.set(j, sum_value(r, j));
  }
  const Counts base = rt.counts;
  auto work = c.reduce_scatter(in.data(), out.data(), count, d, ReduceOp::sum, stream);
  work->wait();
  check_costs(rt, base, direct_call(mode, true, din, dout), din, dout, what);
  check_values(
      out, 0, count, [&](size_t i) { return expected_sum(n, static_cast<size_t>(r) * count + i); }, what);
}

void run_all_reduce(Communicator& c, FakeRuntime& rt, Mode mode, DType d, size_t count, bool din, bool dout,
                    bool in_place, Stream stream) {
  const int n = c.size(), r = c.rank();
  const std::string what = where(c, mode,
                                 "all_reduce " + std::string(fsdp::dtype_name(d)) + " count " + std::to_string(count) +
                                     (in_place ? " in place" : "") + (din ? " din" : "") + (dout ? " dout" : ""));
  Buf out(rt, dout, d, count);
  std::unique_ptr<Buf> in_buf;
  Buf* in = &out;
  if (!in_place) {
    in_buf = std::make_unique<Buf>(rt, din, d, count);
    in = in_buf.get();
    for (size_t i = 0; i < count; ++i) out.set(i, kSentinel);
  }
  std::shared_ptr<std::vector<char>> keep;
  if (din) {
    keep = fill_on_stream(rt, *in, d, stream.native ? stream : rt.compute_stream(),
                          [&](size_t j) { return sum_value(r, j); });
  } else {
    for (size_t j = 0; j < count; ++j) in->set(j, sum_value(r, j));
  }
  const Counts base = rt.counts;
  auto work = c.all_reduce(in->data(), out.data(), count, d, ReduceOp::sum, stream);
  work->wait();
  check_costs(rt, base, direct_call(mode, true, din, dout), din, dout, what);
  check_values(
      out, 0, count, [&](size_t i) { return expected_sum(n, i); }, what);
}

void run_broadcast(Communicator& c, FakeRuntime& rt, Mode mode, DType d, size_t count, bool dev, int root,
                   Stream stream) {
  const int r = c.rank();
  const std::string what = where(c, mode,
                                 "broadcast " + std::string(fsdp::dtype_name(d)) + " count " + std::to_string(count) +
                                     " root " + std::to_string(root) + (dev ? " dev" : ""));
  Buf buf(rt, dev, d, count);
  for (size_t i = 0; i < count; ++i) buf.set(i, kSentinel);
  std::shared_ptr<std::vector<char>> keep;
  if (r == root) {
    if (dev) {
      keep = fill_on_stream(rt, buf, d, stream.native ? stream : rt.compute_stream(),
                            [&](size_t j) { return gather_value(root, j); });
    } else {
      for (size_t j = 0; j < count; ++j) buf.set(j, gather_value(root, j));
    }
  }
  const Counts base = rt.counts;
  auto work = c.broadcast(buf.data(), count, d, root, stream);
  work->wait();
  // The root's buffer is only read, the others' only written.
  check_costs(rt, base, direct_call(mode, false, dev, dev), dev && r == root, dev && r != root, what);
  check_values(
      buf, 0, count, [&](size_t j) { return gather_value(root, j); }, what);
}

void every_collective(Communicator& c, FakeRuntime& rt, Mode mode, bool din, bool dout, Stream stream) {
  for (DType d : {DType::f32, DType::bf16, DType::i32}) {
    for (size_t count : {size_t{1}, size_t{7}, size_t{1021}}) {
      run_all_gather(c, rt, mode, d, count, din, dout, false, stream);
      run_reduce_scatter(c, rt, mode, d, count, din, dout, stream);
      run_all_reduce(c, rt, mode, d, count, din, dout, false, stream);
      if (din == dout) {
        run_all_gather(c, rt, mode, d, count, din, dout, true, stream);
        run_all_reduce(c, rt, mode, d, count, din, dout, true, stream);
        run_broadcast(c, rt, mode, d, count, din, c.size() - 1, stream);
      }
    }
  }
}

// ---- cases ----

BOOST_AUTO_TEST_CASE(registry_wraps_host_backends_and_keeps_their_names) {
  for (const std::string& b : host_backends()) {
    FakeRuntime rt;
    auto c = registry_comm(b, rt);
    report(c->backend() == b, b + ": wrapped backend() is '" + std::string(c->backend()) + "'");
    auto child = c->split(c->rank() % 2, c->rank());
    report(child->backend() == b, b + ": wrapped split's backend() is '" + std::string(child->backend()) + "'");
    report(child->device_path().text == c->device_path().text, b + ": the split took another device path");
    // The split is wrapped too: device buffers work on it.
    run_all_reduce(*child, rt, registry_mode(*c), DType::f32, 7, true, true, false, Stream{});
    c->barrier();
  }
}

BOOST_AUTO_TEST_CASE(staged_device_buffers_exact) {
  for (const std::string& b : host_backends()) {
    FakeRuntime rt;
    auto c = wrapped_comm(b, rt, Mode::staged);
    every_collective(*c, rt, Mode::staged, true, true, Stream{});
    every_collective(*c, rt, Mode::staged, true, true, rt.comm_stream());
    report(rt.last_timeout_s == kTimeout_s, b + ": the host waited with another timeout than comm.timeout_s");
  }
}

BOOST_AUTO_TEST_CASE(registry_device_buffers_exact) {
  for (const std::string& b : host_backends()) {
    FakeRuntime rt;
    auto c = registry_comm(b, rt);
    every_collective(*c, rt, registry_mode(*c), true, true, Stream{});
  }
}

// Every collective on device buffers, on the call's default stream and on another one.
void on_both_streams(Communicator& c, FakeRuntime& rt, Mode mode) {
  every_collective(c, rt, mode, true, true, Stream{});
  every_collective(c, rt, mode, true, true, rt.user_stream());
}

BOOST_AUTO_TEST_CASE(device_aware_passes_pointers_after_synchronising) {
  for (const std::string& b : host_backends()) {
    FakeRuntime rt;
    auto c = wrapped_comm(b, rt, Mode::aware);
    on_both_streams(*c, rt, Mode::aware);
    report(rt.counts.pinned_allocs == 0, b + ": the device-pointer path staged");
    // avg divides on the host: staged even here, and still right.
    Buf x(rt, true, DType::f32, 5);
    for (size_t i = 0; i < 5; ++i) x.set(i, 2.0 * (c->rank() + 1));
    c->all_reduce(x.data(), x.data(), 5, DType::f32, ReduceOp::avg)->wait();
    report(rt.counts.pinned_allocs == 1, b + ": avg on device pointers was not staged");
    report(x.get(4) == c->size() + 1.0, b + ": avg gave " + std::to_string(x.get(4)));
  }
}

// A UCX with CUDA memory: all_gather and broadcast pass device pointers, the reductions stage.
BOOST_AUTO_TEST_CASE(movers_direct_reductions_staged) {
  for (const std::string& b : host_backends()) {
    FakeRuntime rt;
    auto c = wrapped_comm(b, rt, Mode::movers);
    on_both_streams(*c, rt, Mode::movers);
    report(rt.counts.pinned_allocs > 0, b + ": the movers-only path staged no reduction");
  }
}

// The path a backend chose is the rule of comm.h, word for word, the same on every rank.
BOOST_AUTO_TEST_CASE(device_path_rule_and_messages) {
  using fsdp::DeviceBuffers;
  const fsdp::LibraryDeviceSupport yes{true, "CUDA-aware Open MPI v4.1.4", "-"};
  const fsdp::LibraryDeviceSupport no{false, "Open MPI v4.1.4", "Open MPI v4.1.4 has no CUDA support at run time"};
  auto expect = [](const fsdp::DevicePath& p, bool moves, bool reductions, const std::string& text) {
    report(p.direct_moves == moves && p.direct_reductions == reductions && p.text == text,
           "device path '" + p.text + "' (" + std::to_string(p.direct_moves) + std::to_string(p.direct_reductions) +
               "), expected '" + text + "'");
  };
  expect(fsdp::choose_device_path(DeviceBuffers::automatic, yes), true, true,
         "device pointers (CUDA-aware Open MPI v4.1.4)");
  expect(fsdp::choose_device_path(DeviceBuffers::automatic, no), false, false,
         "pinned staging: Open MPI v4.1.4 has no CUDA support at run time");
  expect(fsdp::choose_device_path(DeviceBuffers::staged, yes), false, false,
         "pinned staging: comm.device_buffers is staged");
  expect(fsdp::choose_device_path(DeviceBuffers::direct, no), true, true,
         "device pointers (comm.device_buffers is direct; Open MPI v4.1.4 has no CUDA support at run time: passed as "
         "asked)");
  expect(fsdp::choose_device_path(DeviceBuffers::direct, yes), true, true,
         "device pointers (comm.device_buffers is direct; CUDA-aware Open MPI v4.1.4)");
  expect(fsdp::choose_device_path(DeviceBuffers::automatic, yes, "the ucx rings reduce on the host"), true, false,
         "device pointers (CUDA-aware Open MPI v4.1.4); reductions through pinned staging: the ucx rings reduce on "
         "the host");
  // Agreement: rank 0 alone would pass device pointers; every rank stages.
  const int r = world_rank();
  const fsdp::DevicePath agreed = fsdp::agree_device_path(
      fsdp::choose_device_path(r == 0 ? DeviceBuffers::automatic : DeviceBuffers::staged, yes), MPI_COMM_WORLD);
  if (world_size() == 1)
    expect(agreed, true, true, "device pointers (CUDA-aware Open MPI v4.1.4)");
  else if (r == 0)
    expect(agreed, false, false, "pinned staging: another rank's library takes no device memory");
  else
    expect(agreed, false, false, "pinned staging: comm.device_buffers is staged");
  // Through the registry: this build's libraries, each backend's own words; direct always passes
  // device pointers for the movers.
  for (const std::string& b : host_backends()) {
    FakeRuntime rt;
    for (DeviceBuffers setting : {DeviceBuffers::automatic, DeviceBuffers::staged, DeviceBuffers::direct}) {
      fsdp::CommOptions o{kTimeout_s};
      o.runtime = &rt;
      o.device_buffers = setting;
      auto c = fsdp::make_communicator(b, MPI_COMM_WORLD, o);
      const fsdp::DevicePath p = c->device_path();
      const std::string said = b + " " + std::string(fsdp::name_of(fsdp::kDeviceBuffers, setting)) + ": " + p.text;
      if (setting == DeviceBuffers::staged) expect(p, false, false, "pinned staging: comm.device_buffers is staged");
      if (setting == DeviceBuffers::direct) {
        report(p.direct_moves && p.text.rfind("device pointers (comm.device_buffers is direct; ", 0) == 0, said);
        report(p.direct_reductions == (b == "mpi"), said + ": reductions direct only on mpi");
      }
      if (setting == DeviceBuffers::automatic)
        report(p.direct_moves ? p.text.rfind("device pointers (", 0) == 0 : p.text.rfind("pinned staging: ", 0) == 0,
               said);
      if (b == "ucx" && setting != DeviceBuffers::staged && p.direct_moves)
        report(
            p.text.find("; reductions through pinned staging: the ucx rings reduce on the host") != std::string::npos,
            said);
      // Whatever the path, every collective's result is right and costs what the path says.
      every_collective(*c, rt, mode_of(p), true, true, Stream{});
      if (world_rank() == 0 && setting == DeviceBuffers::automatic) BOOST_TEST_MESSAGE(said);
    }
  }
}

BOOST_AUTO_TEST_CASE(host_pointers_pass_through) {
  for (const std::string& b : host_backends()) {
    for (Mode mode : {Mode::staged, Mode::aware, Mode::movers}) {
      FakeRuntime rt;
      auto c = wrapped_comm(b, rt, mode);
      every_collective(*c, rt, mode, false, false, Stream{});
      report(rt.counts.pinned_allocs == 0 && rt.counts.host_syncs == 0,
             b + ": host buffers allocated staging memory or synchronised");
    }
  }
}

BOOST_AUTO_TEST_CASE(mixed_host_and_device_stage_only_the_device_side) {
  for (const std::string& b : host_backends()) {
    FakeRuntime rt;
    auto c = wrapped_comm(b, rt, Mode::staged);
    every_collective(*c, rt, Mode::staged, true, false, Stream{});
    every_collective(*c, rt, Mode::staged, false, true, Stream{});
  }
}

// wait_on(s): the host waits for the collective (it runs on the host) but not for the copy back,
// which is enqueued on s; the next collective may start at once, reusing the staging buffer only
// after that copy ran.
BOOST_AUTO_TEST_CASE(wait_on_enqueues_the_copy_back) {
  for (const std::string& b : host_backends()) {
    FakeRuntime rt;
    auto c = wrapped_comm(b, rt, Mode::staged);
    const int n = c->size();
    const size_t count = 1021;
    const Stream s = rt.user_stream();
    constexpr int kRounds = 4;
    std::vector<std::unique_ptr<Buf>> bufs;
    for (int k = 0; k < kRounds; ++k) {
      bufs.push_back(std::make_unique<Buf>(rt, true, DType::f32, count));
      for (size_t i = 0; i < count; ++i) bufs.back()->set(i, sum_value(c->rank() + k, i));
      const Counts before = rt.counts;
      auto work = c->all_reduce(bufs.back()->data(), bufs.back()->data(), count, DType::f32, ReduceOp::sum);
      const size_t syncs = rt.counts.host_syncs;
      const size_t pending = rt.pending(s);
      work->wait_on(s);
      report(rt.counts.h2d - before.h2d == 1, b + " wait_on: no host->device copy");
      report(rt.pending(s) > pending, b + " wait_on: nothing enqueued on the given stream");
      report(rt.counts.host_syncs == syncs, b + " wait_on: the host waited for the device");
      report(rt.pending(rt.compute_stream()) == 0, b + " wait_on: the copy back went to the call's stream");
      // Not copied yet: the in-place buffer still holds this rank's input.
      report(bufs.back()->get(1) == sum_value(c->rank() + k, 1), b + " wait_on: the copy back ran without a sync");
      work->wait_on(s);  // again: nothing more
      report(rt.counts.h2d - before.h2d == 1, b + " second wait_on copied again");
    }
    rt.synchronize(s);
    for (int k = 0; k < kRounds; ++k) {
      check_values(
          *bufs[static_cast<size_t>(k)], 0, count,
          [&](size_t i) {
            double sum = 0;
            for (int r = 0; r < n; ++r) sum += sum_value(r + k, i);
            return sum;
          },
          b + " wait_on round " + std::to_string(k));
    }
    report(rt.counts.pinned_allocs == 1, b + " wait_on: " + std::to_string(rt.counts.pinned_allocs) +
                                             " staging allocations for four equal collectives in turn");

    // wait_on another stream after wait(): that stream waits for the copy's event; a wait after
    // wait_on makes the host wait for the copy.
    Buf x(rt, true, DType::f32, count);
    for (size_t i = 0; i < count; ++i) x.set(i, 1);
    auto w1 = c->all_reduce(x.data(), x.data(), count, DType::f32, ReduceOp::sum, rt.comm_stream());
    w1->wait_on(s);
    w1->wait();
    report(x.get(0) == n, b + " wait after wait_on: the host did not wait for the copy back");
    const size_t waits = rt.counts.stream_waits;
    w1->wait_on(rt.compute_stream());
    report(rt.counts.stream_waits == waits + 1, b + " wait_on another stream after the copy: no stream wait");
  }
}

BOOST_AUTO_TEST_CASE(test_is_true_once_the_collective_is_done) {
  for (const std::string& b : host_backends()) {
    FakeRuntime rt;
    auto c = wrapped_comm(b, rt, Mode::staged);
    Buf x(rt, true, DType::f32, 7);
    for (size_t i = 0; i < 7; ++i) x.set(i, 2);
    auto w = c->all_reduce(x.data(), x.data(), 7, DType::f32, ReduceOp::sum);
    const auto t0 = std::chrono::steady_clock::now();
    while (!w->test() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) std::this_thread::yield();
    report(w->test(), b + ": test() never became true");
    report(x.get(0) == 2, b + ": test() copied the result back (documented: the first wait does)");
    w->wait();
    report(x.get(0) == 2.0 * c->size(), b + ": wait after test gave " + std::to_string(x.get(0)));
    // A handle dropped without a wait: the collective still completes, the buffer is reused.
    auto dropped = c->all_reduce(x.data(), x.data(), 7, DType::f32, ReduceOp::sum);
    dropped.reset();
    run_all_reduce(*c, rt, Mode::staged, DType::f32, 7, true, true, true, Stream{});
    report(rt.counts.pinned_allocs == 1, b + ": a dropped handle's staging buffer was not reused");
  }
}

// Steady state allocates nothing; growth is by powers of two.
BOOST_AUTO_TEST_CASE(staging_buffers_reused) {
  for (const std::string& b : host_backends()) {
    FakeRuntime rt;
    auto c = wrapped_comm(b, rt, Mode::staged);
    for (int k = 0; k < 10; ++k) run_all_reduce(*c, rt, Mode::staged, DType::f32, 1021, true, true, false, Stream{});
    report(rt.counts.pinned_allocs == 1,
           b + ": " + std::to_string(rt.counts.pinned_allocs) + " staging allocations for ten equal collectives");
    for (size_t count = 1; count <= (size_t{1} << 18); count = count * 3 + 1)
      run_all_gather(*c, rt, Mode::staged, DType::f32, count, true, true, false, Stream{});
    const size_t largest = (size_t{1} << 18) * 4 * static_cast<size_t>(c->size());
    size_t bound = 1;
    for (size_t cap = 4096; cap < largest * 2; cap *= 2) ++bound;
    report(rt.counts.pinned_allocs <= bound, b + ": " + std::to_string(rt.counts.pinned_allocs) +
                                                 " staging allocations for growing sizes, bound " +
                                                 std::to_string(bound));
    report(rt.counts.pinned_allocs - rt.counts.pinned_frees == 1,
           b + ": grown staging buffers were not freed (" + std::to_string(rt.counts.pinned_frees) + " frees)");
    // Two in flight at once need two buffers, and keep them.
    const size_t allocs = rt.counts.pinned_allocs;
    for (int k = 0; k < 3; ++k) {
      Buf x(rt, true, DType::f32, 64), y(rt, true, DType::f32, 64);
      for (size_t i = 0; i < 64; ++i) {
        x.set(i, 1);
        y.set(i, 3);
      }
      auto wx = c->all_reduce(x.data(), x.data(), 64, DType::f32, ReduceOp::sum);
      auto wy = c->all_reduce(y.data(), y.data(), 64, DType::f32, ReduceOp::sum);
      wy->wait();
      wx->wait();
      report(x.get(63) == c->size() && y.get(63) == 3.0 * c->size(), b + ": concurrent staged collectives mixed up");
    }
    report(rt.counts.pinned_allocs - allocs <= 1, b + ": concurrent collectives kept allocating");
    c.reset();
    report(rt.counts.pinned_allocs == rt.counts.pinned_frees, b + ": staging memory leaked at destruction");
  }
}

// The wrapped backend's timeout, word for word: backend, collective, count, dtype, sequence
// number. Then rank 0 joins late and the result still reaches the device (as in test_comm).
// Needs 2 or more ranks: at one, Boost.Test reports it skipped.
BOOST_AUTO_TEST_CASE(timeout_message_unchanged, *ut::precondition(fsdp::testing::at_least_ranks(2))) {
  const int n = world_size();
  for (const std::string& b : host_backends()) {
    FakeRuntime rt;
    // Staged: with device pointers (a CUDA-aware Open MPI's auto) mpi's collectives are MPI's
    // blocking ones, whose deadline is the watchdog's: it ends the rank (test_watchdog).
    fsdp::CommOptions o{0.5};
    o.runtime = &rt;
    o.device_buffers = fsdp::DeviceBuffers::staged;
    auto parent = fsdp::make_communicator(b, MPI_COMM_WORLD, o);
    auto doomed = parent->split(0, parent->rank());
    doomed->barrier();  // #0
    doomed->barrier();  // #1
    Buf in(rt, true, DType::f32, 5), out(rt, true, DType::f32, 5);
    for (size_t i = 0; i < 5; ++i) {
      in.set(i, 1);
      out.set(i, 0);
    }
    std::unique_ptr<fsdp::Work> work;
    if (doomed->rank() != 0) {
      work = doomed->all_reduce(in.data(), out.data(), 5, DType::f32, ReduceOp::sum);  // #2
      std::string message;
      try {
        work->wait();
      } catch (const fsdp::CommTimeout& e) {
        message = e.what();
      }
      report(!message.empty(), b + " timeout: wait returned although rank 0 never joined");
      const std::string want = b + " all_reduce #2 (count 5, f32) did not complete within comm.timeout_s = 0.5 s";
      report(message.rfind(want, 0) == 0, std::string(b).append(" timeout message changed: ").append(message));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (doomed->rank() == 0) work = doomed->all_reduce(in.data(), out.data(), 5, DType::f32, ReduceOp::sum);
    const auto t0 = std::chrono::steady_clock::now();
    while (!work->test() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) std::this_thread::yield();
    work->wait();
    for (size_t i = 0; i < 5; ++i)
      report(out.get(i) == n, b + " timeout: late all_reduce gave " + std::to_string(out.get(i)));
    work.reset();
    doomed.reset();
    parent->barrier();
  }
}

}  // namespace

int main(int argc, char** argv) {
  fsdp::MpiSession mpi(&argc, &argv);
  return ut::unit_test_main(
      [] {
        fsdp::testing::init_mpi_suite("device_comm");
        return true;
      },
      argc, argv);
}
