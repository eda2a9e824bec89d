// The collective layer against every backend this binary was built with, at any world size.
// Run under mpirun (tests/mpirun.sh NP test_comm ...); one rank works too.
//
// Each backend gets a suite of the same cases, registered at start-up from built_backends():
// every collective x every dtype x counts 0, 1, 7, 1021 (and one >= 4 MiB f32 case per op),
// in-place forms, uneven sub-communicators used concurrently with their parent, collectives
// completed out of order, and a timeout that fires (2 or more ranks; one rank reports it
// skipped). A backend that cannot start here (nccl without a GPU per rank) counts as one skipped
// case, <backend>/starts, with the reason; registry/backends_that_cannot_start_are_skipped fails
// when any other backend, or nccl for another reason, did not start.
//
// Every rank runs every case; only rank 0 logs and reports, so the report counts each case once.
// A case passes on rank 0 only if it passed on every rank (failing ranks are named; their
// messages go to stderr), and any failing rank exits non-zero, so mpirun does too.
// FSDP_TEST_ALL_RANKS=1 keeps every rank's Boost log.
#define BOOST_TEST_NO_MAIN
#include <mpi.h>
#include <boost/test/results_collector.hpp>
#include <boost/test/results_reporter.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <new>
#include <ostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/comm.h"
#include "comm/mpi_env.h"
#include "tensor/dtype.h"
#include "tensor/error.h"

#include "mpi_test.h"

namespace ut = boost::unit_test;
using fsdp::Communicator;
using fsdp::DType;
using fsdp::ReduceOp;
using fsdp::testing::report;
using fsdp::testing::world_rank;
using fsdp::testing::world_size;

namespace {

// Long enough for 4 MiB collectives on 8 ranks sharing 2 cores; short enough that a rank that
// fails mid-case releases the others soon.
constexpr double kTimeout_s = 30;

constexpr DType kDtypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8};
constexpr ReduceOp kReduceOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};
constexpr size_t kCounts[] = {0, 1, 7, 1021};  // empty, one, small prime, prime past a page

std::unique_ptr<Communicator> make(const std::string& backend, double timeout_s = kTimeout_s) {
  return fsdp::make_communicator(backend, MPI_COMM_WORLD, fsdp::CommOptions{timeout_s});
}

std::string name(DType d) { return std::string(fsdp::dtype_name(d)); }
std::string name(ReduceOp op) { return std::string(fsdp::reduce_op_name(op)); }
bool is_half(DType d) { return d == DType::bf16 || d == DType::f16; }
bool is_float(DType d) { return d == DType::f32 || d == DType::f64 || is_half(d); }

// ---- a host buffer of any dtype, read and written through double (exact for every value used) ----

class Buf {
 public:
  Buf(DType d, size_t count) : d_(d), count_(count), bytes_(count * fsdp::dtype_bytes(d)) {}
  DType dtype() const { return d_; }
  size_t count() const { return count_; }
  void* data() { return bytes_.data(); }
  char* at(size_t i) { return bytes_.data() + i * fsdp::dtype_bytes(d_); }
  double get(size_t i) const { return fsdp::load_element(bytes_.data(), d_, i); }
  void set(size_t i, double v) { fsdp::store_element(bytes_.data(), d_, i, v); }

 private:
  DType d_;
  size_t count_;
  std::vector<char> bytes_;
};

// ---- inputs: rank- and index-dependent values whose results are known exactly ----

// What no correct output holds (gathered values lie in [-120, 120], u8 in [0, 240]).
double sentinel(DType d) { return d == DType::u8 ? 255 : -1000; }

// all_gather and broadcast: any value, exact in every dtype (bf16 holds integers to 256).
double gather_value(DType d, int r, size_t j) {
  double v = static_cast<double>((static_cast<uint64_t>(r) * 131 + j * 7) % 241);
  return d == DType::u8 ? v : v - 120;
}
// max and min: ties and sign changes across ranks.
double minmax_value(DType d, int r, size_t j) {
  double v = static_cast<double>((static_cast<uint64_t>(r) * 37 + j * 11) % 97);
  return d == DType::u8 ? v : v - 48;
}
// sum and avg. Exact types get small integers, so sums are exact (f32 to 2^24). bf16/f16 get
// dense mantissas in (-1, 1), already rounded to the format, so the backend's roundings show.
double sum_value(DType d, int r, size_t j) {
  if (is_half(d)) {
    uint64_t h = static_cast<uint64_t>(r) * 0x9E3779B97F4A7C15ull ^ (j + 1) * 0xC2B2AE3D27D4EB4Full;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    float x = static_cast<float>((static_cast<double>(h % 2001) - 1000) / 1024);
    return d == DType::bf16 ? fsdp::bf16_to_f32(fsdp::f32_to_bf16(x)) : fsdp::f16_to_f32(fsdp::f32_to_f16(x));
  }
  double v = static_cast<double>((static_cast<uint64_t>(r) * 5 + j * 3) % 7);
  return d == DType::u8 ? v : v - 3;
}
double input_value(ReduceOp op, DType d, int r, size_t j) {
  return op == ReduceOp::max || op == ReduceOp::min ? minmax_value(d, r, j) : sum_value(d, r, j);
}

struct Expect {
  double value;
  double tol;  // 0: bitwise-exact value
};

// Unit roundoff u = 2^-p for a p-bit significand, and the least normal's half-ulp eta (the
// absolute error of one rounding into the subnormal range).
double unit_roundoff(DType d) {
  switch (d) {
    case DType::bf16: return std::ldexp(1.0, -8);
    case DType::f16: return std::ldexp(1.0, -11);
    case DType::f32: return std::ldexp(1.0, -24);
    default: return std::ldexp(1.0, -53);
  }
}
double eta(DType d) { return d == DType::f16 ? std::ldexp(1.0, -25) : d == DType::bf16 ? std::ldexp(1.0, -134) : 0; }
double gamma(int k, double u) { return k * u / (1 - k * u); }

// The reduction over n ranks of input element j.
//
// Floating-point sums and averages are compared with an f64 reference (the inputs are exact in
// f64 and n of them sum exactly there). How far a backend may be from it: a sum of n terms by
// any order and any grouping (a ring, a tree, or accumulate-in-f32-then-round-once) is n-1
// additions, each rounded at most once to the format, plus possibly one final rounding from a
// wider accumulator: at most n roundings, and the classic bound (Higham, Accuracy and
// Stability, 4.2) gives |fl(S) - S| <= gamma_n * sum_r |x_r| with gamma_k = k u / (1 - k u).
// avg adds one rounding (S/n rounded, or each x_r * (1/n) rounded before the sum as NCCL does
// for floats: the same count), so |avg - S/n| <= gamma_{n+1} * sum_r |x_r| / n. An f16 partial
// sum that cancels into the subnormal range rounds with absolute error up to eta, so each
// rounding may add eta. bf16 shares f32's exponent range (eta negligible). f32/f64 sums of
// small integers are exact (tol 0); their averages get the same bound with their own u.
// Integer avg truncates toward zero after a wrapping (u8) sum, as NCCL and the MPI backend do.
Expect expect_reduce(ReduceOp op, DType d, int n, size_t j) {
  if (op == ReduceOp::max || op == ReduceOp::min) {
    double v = minmax_value(d, 0, j);
    for (int r = 1; r < n; ++r)
      v = op == ReduceOp::max ? std::max(v, minmax_value(d, r, j)) : std::min(v, minmax_value(d, r, j));
    return {v, 0};
  }
  double s = 0, abs_sum = 0;
  for (int r = 0; r < n; ++r) {
    s += sum_value(d, r, j);
    abs_sum += std::fabs(sum_value(d, r, j));
  }
  const double u = unit_roundoff(d);
  if (!is_float(d)) {
    int64_t si = static_cast<int64_t>(s);
    if (d == DType::u8) si &= 0xff;
    return {static_cast<double>(op == ReduceOp::avg ? si / n : si), 0};
  }
  if (op == ReduceOp::sum) return {s, is_half(d) ? gamma(n, u) * abs_sum + n * eta(d) : 0};
  return {s / n, gamma(n + 1, u) * abs_sum / n + (n + 1) * eta(d)};
}

// ---- checks: every element; one message per buffer; failing ranks other than 0 say so on
// stderr, since their Boost log is silenced ----

void check_buffer(const Buf& out, const std::function<Expect(size_t)>& expect, const std::string& what) {
  size_t wrong = 0, first = 0;
  Expect first_expect{0, 0};
  for (size_t i = 0; i < out.count(); ++i) {
    Expect e = expect(i);
    double got = out.get(i);
    bool ok = e.tol == 0 ? got == e.value : std::fabs(got - e.value) <= e.tol;
    if (!ok && wrong++ == 0) {
      first = i;
      first_expect = e;
    }
  }
  if (wrong == 0) {
    BOOST_CHECK(true);
    return;
  }
  char msg[256];
  std::snprintf(msg, sizeof msg, ": %zu of %zu elements wrong; first [%zu] = %.9g, expected %.9g (tol %.3g)", wrong,
                out.count(), first, out.get(first), first_expect.value, first_expect.tol);
  report(false, what + msg);
}

std::string where(const Communicator& c, const std::string& what) {
  return std::string(c.backend()) + " " + what + " on rank " + std::to_string(c.rank()) + "/" +
         std::to_string(c.size());
}

// ---- the cases' building blocks (used alone and concurrently) ----

struct Pending {
  std::unique_ptr<fsdp::Work> work;
  std::function<void()> check;  // after the wait
};

// Inputs in `in`, sentinels in `out`; the returned check looks at every element of `out`.
Pending start_all_gather(Communicator& c, DType d, size_t count, std::shared_ptr<Buf> in = {},
                         std::shared_ptr<Buf> out = {}) {
  const int n = c.size(), r = c.rank();
  if (!in) in = std::make_shared<Buf>(d, count);
  if (!out) out = std::make_shared<Buf>(d, count * static_cast<size_t>(n));
  for (size_t i = 0; i < count; ++i) in->set(i, gather_value(d, r, i));
  for (size_t i = 0; i < out->count(); ++i) out->set(i, sentinel(d));
  Pending p;
  p.work = c.all_gather(in->data(), out->data(), count, d);
  std::string what = where(c, "all_gather " + name(d) + " count " + std::to_string(count));
  p.check = [in, out, d, count, what] {
    check_buffer(
        *out,
        [&](size_t j) {
          return Expect{gather_value(d, static_cast<int>(j / count), j % count), 0};
        },
        what);
  };
  return p;
}

Pending start_reduce_scatter(Communicator& c, DType d, ReduceOp op, size_t count) {
  const int n = c.size(), r = c.rank();
  auto in = std::make_shared<Buf>(d, count * static_cast<size_t>(n));
  auto out = std::make_shared<Buf>(d, count);
  for (size_t j = 0; j < in->count(); ++j) in->set(j, input_value(op, d, r, j));
  for (size_t i = 0; i < count; ++i) out->set(i, sentinel(d));
  Pending p;
  p.work = c.reduce_scatter(in->data(), out->data(), count, d, op);
  std::string what = where(c, "reduce_scatter " + name(op) + " " + name(d) + " count " + std::to_string(count));
  p.check = [in, out, d, op, count, n, r, what] {
    check_buffer(
        *out, [&](size_t i) { return expect_reduce(op, d, n, static_cast<size_t>(r) * count + i); }, what);
  };
  return p;
}

Pending start_all_reduce(Communicator& c, DType d, ReduceOp op, size_t count, bool in_place = false) {
  const int n = c.size(), r = c.rank();
  auto in = std::make_shared<Buf>(d, count);
  auto out = in_place ? in : std::make_shared<Buf>(d, count);
  for (size_t j = 0; j < count; ++j) in->set(j, input_value(op, d, r, j));
  if (!in_place)
    for (size_t i = 0; i < count; ++i) out->set(i, sentinel(d));
  Pending p;
  p.work = c.all_reduce(in->data(), out->data(), count, d, op);
  std::string what = where(c, std::string(in_place ? "in-place " : "") + "all_reduce " + name(op) + " " + name(d) +
                                  " count " + std::to_string(count));
  p.check = [in, out, d, op, n, what] {
    check_buffer(
        *out, [&](size_t j) { return expect_reduce(op, d, n, j); }, what);
  };
  return p;
}

Pending start_broadcast(Communicator& c, DType d, size_t count, int root) {
  auto buf = std::make_shared<Buf>(d, count);
  for (size_t i = 0; i < count; ++i) buf->set(i, c.rank() == root ? gather_value(d, root, i) : sentinel(d));
  Pending p;
  p.work = c.broadcast(buf->data(), count, d, root);
  std::string what =
      where(c, "broadcast " + name(d) + " count " + std::to_string(count) + " root " + std::to_string(root));
  p.check = [buf, d, root, what] {
    check_buffer(
        *buf,
        [&](size_t i) {
          return Expect{gather_value(d, root, i), 0};
        },
        what);
  };
  return p;
}

void finish(Pending p) {
  p.work->wait();
  p.check();
}

// The large case: >= 4 MiB of f32 in the whole array at any world size.
size_t large_count_per_rank(int n) {
  return ((size_t{1} << 20) + static_cast<size_t>(n) - 1) / static_cast<size_t>(n) + 3;
}
constexpr size_t kLargeCount = (size_t{1} << 20) + 3;

std::vector<size_t> counts_for(DType d, size_t large) {
  std::vector<size_t> v(std::begin(kCounts), std::end(kCounts));
  if (d == DType::f32) v.push_back(large);
  return v;
}

// ---- running one case on every rank and agreeing on the verdict ----

void agree_on_verdict(const std::exception_ptr& error) {
  const ut::test_unit_id id = ut::framework::current_test_case().p_id;
  int failed = error || ut::results_collector.results(id).p_assertions_failed > 0 ? 1 : 0;
  const int rank = world_rank(), n = world_size();
  std::vector<int> all(static_cast<size_t>(n));
  MPI_Gather(&failed, 1, MPI_INT, all.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (rank != 0) return;
  std::string ranks;
  for (int r = 1; r < n; ++r)
    if (all[static_cast<size_t>(r)]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  BOOST_CHECK_MESSAGE(ranks.empty(), "failed on rank(s) " + ranks + " (their messages are on stderr)");
}

// Runs body on this rank; an exception still reaches the agreement, so no rank is left waiting
// in MPI_Gather for one that left the case early.
void run_case(const std::function<void()>& body) {
  std::exception_ptr error;
  try {
    body();
  } catch (const std::exception& e) {
    if (world_rank() != 0) std::fprintf(stderr, "[rank %d] exception: %s\n", world_rank(), e.what());
    error = std::current_exception();
  } catch (...) {
    error = std::current_exception();  // BOOST_REQUIRE's abort: already logged
  }
  agree_on_verdict(error);
  if (error) std::rethrow_exception(error);
}

// ---- the cases ----

void case_all_gather(const std::string& backend, DType d) {
  auto c = make(backend);
  for (size_t count : counts_for(d, large_count_per_rank(c->size()))) finish(start_all_gather(*c, d, count));
}

void case_reduce_scatter(const std::string& backend, DType d) {
  auto c = make(backend);
  for (ReduceOp op : kReduceOps)
    for (size_t count : counts_for(d, large_count_per_rank(c->size()))) finish(start_reduce_scatter(*c, d, op, count));
}

void case_all_reduce(const std::string& backend, DType d) {
  auto c = make(backend);
  for (ReduceOp op : kReduceOps)
    for (size_t count : counts_for(d, kLargeCount)) finish(start_all_reduce(*c, d, op, count));
}

void case_broadcast(const std::string& backend, DType d) {
  auto c = make(backend);
  for (int root : {0, c->size() - 1})
    for (size_t count : counts_for(d, kLargeCount)) finish(start_broadcast(*c, d, count, root));
}

void case_in_place(const std::string& backend) {
  auto c = make(backend);
  const int n = c->size(), r = c->rank();
  for (DType d : {DType::f32, DType::bf16, DType::i64, DType::u8}) {
    for (size_t count : {size_t{1}, size_t{7}, size_t{1021}}) {
      // all_gather with in == out + rank*count: this rank's block is already in place.
      auto out = std::make_shared<Buf>(d, count * static_cast<size_t>(n));
      Pending p = start_all_gather(*c, d, count, std::make_shared<Buf>(d, count), out);
      p.work->wait();  // (that call used a separate input; now the in-place form)
      p.check();
      for (size_t i = 0; i < out->count(); ++i)
        out->set(i, i / count == static_cast<size_t>(r) ? gather_value(d, r, i % count) : sentinel(d));
      c->all_gather(out->at(static_cast<size_t>(r) * count), out->data(), count, d)->wait();
      check_buffer(
          *out,
          [&](size_t j) {
            return Expect{gather_value(d, static_cast<int>(j / count), j % count), 0};
          },
          where(*c, "in-place all_gather " + name(d) + " count " + std::to_string(count)));
      for (ReduceOp op : kReduceOps) finish(start_all_reduce(*c, d, op, count, /*in_place=*/true));
    }
  }
}

void case_barrier(const std::string& backend) {
  auto c = make(backend);
  for (int i = 0; i < 10; ++i) c->barrier();
  // No rank leaves a barrier before the last one enters. Checked through one clock, so only
  // when every rank shares a host (steady_clock is CLOCK_MONOTONIC, one per host).
  MPI_Comm host = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host);
  int host_size = 0;
  MPI_Comm_size(host, &host_size);
  MPI_Comm_free(&host);
  if (host_size != c->size()) {
    BOOST_TEST_MESSAGE("barrier ordering not checked: ranks span several hosts");
    return;
  }
  using Clock = std::chrono::steady_clock;
  for (int late : {0, c->size() - 1}) {
    MPI_Barrier(MPI_COMM_WORLD);
    double stamp_ns = 0;
    if (c->rank() == late) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      stamp_ns = static_cast<double>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
      c->barrier();
    } else {
      c->barrier();
      stamp_ns = static_cast<double>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
    }
    std::vector<double> all(static_cast<size_t>(c->size()));
    MPI_Allgather(&stamp_ns, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
    for (int r = 0; r < c->size(); ++r)
      if (r != late)
        report(
            all[static_cast<size_t>(r)] >= all[static_cast<size_t>(late)],
            where(*c, "barrier: rank " + std::to_string(r) + " left before rank " + std::to_string(late) + " entered"));
  }
}

// Uneven groups (5 ranks -> 3 + 2), reversed key order, used while the parent has a collective
// in flight; completed in the reverse order of issue.
void case_split_concurrent(const std::string& backend) {
  auto parent = make(backend);
  const int n = parent->size(), r = parent->rank();
  const int first = (n + 1) / 2;
  const int color = r < first ? 0 : 1;
  const int group_begin = color == 0 ? 0 : first, group_size = color == 0 ? first : n - first;
  auto child = parent->split(color, n - r);  // higher world rank first
  BOOST_REQUIRE(child);
  report(child->size() == group_size, where(*child, "split size, expected " + std::to_string(group_size)));
  report(child->rank() == group_size - 1 - (r - group_begin), where(*child, "split rank (key order)"));
  report(child->backend() == backend, where(*child, "split backend"));

  Pending on_parent = start_all_reduce(*parent, DType::f32, ReduceOp::sum, 1021);
  Pending on_child = start_all_gather(*child, DType::i32, 7);
  finish(std::move(on_child));
  finish(std::move(on_parent));

  // Both parity groups and the parent, each with two collectives in flight.
  auto parity = parent->split(r % 2, r);
  report(parity->size() == (n + 1 - r % 2) / 2, where(*parity, "parity split size"));
  Pending a = start_reduce_scatter(*parity, DType::bf16, ReduceOp::sum, 1021);
  Pending b = start_all_gather(*parent, DType::f16, 7);
  Pending c = start_broadcast(*parity, DType::u8, 1021, parity->size() - 1);
  Pending d = start_all_reduce(*child, DType::i64, ReduceOp::max, 7);
  finish(std::move(b));
  finish(std::move(c));
  finish(std::move(d));
  finish(std::move(a));

  // A child of a child still works and is independent of its ancestors.
  auto grandchild = child->split(0, child->rank());
  finish(start_all_reduce(*grandchild, DType::f64, ReduceOp::avg, 1021));
  grandchild->barrier();
  child->barrier();
  parent->barrier();
}

// Several collectives in flight on one communicator, completed out of order; test() polls.
void case_out_of_order(const std::string& backend) {
  auto c = make(backend);
  Pending a = start_all_reduce(*c, DType::f32, ReduceOp::sum, 1021);
  Pending b = start_all_gather(*c, DType::i32, 7);
  Pending d = start_broadcast(*c, DType::u8, 1021, c->size() - 1);
  Pending e = start_reduce_scatter(*c, DType::f64, ReduceOp::max, 7);
  (void)a.work->test();
  finish(std::move(e));
  finish(std::move(b));
  finish(std::move(a));
  finish(std::move(d));

  std::vector<Pending> many;
  for (size_t k = 0; k < 16; ++k) many.push_back(start_all_reduce(*c, DType::f32, ReduceOp::sum, 1 + 97 * k));
  for (size_t k = many.size(); k-- > 0;) finish(std::move(many[k]));
  // A completed handle stays complete.
  Pending f = start_all_gather(*c, DType::bf16, 7);
  f.work->wait();
  BOOST_CHECK(f.work->test());
  f.work->wait();
  f.check();
}

// Polls a handle to completion with a generous deadline of its own: the comm's 0.5 s is for the
// wait under test, not for a late collective on 8 ranks sharing 2 cores.
bool poll_until_done(fsdp::Work& work, double limit_s) {
  auto t0 = std::chrono::steady_clock::now();
  while (!work.test()) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > limit_s) return false;
    std::this_thread::yield();
  }
  return true;
}

// A collective that only some ranks enter: their waits end in CommTimeout naming the backend,
// collective, count, dtype and sequence number. It runs on a communicator of its own. Simply
// abandoning the pending collective is not clean: Open MPI's non-blocking collectives keep
// progressing on a communicator freed under them and crash the process later. So, once every
// waiting rank has seen its timeout, rank 0 joins late: the timed-out handles then complete
// with the right sum (a timeout reports, it does not cancel) and everything is freed normally.
// Needs 2 or more ranks: registered with at_least_ranks(2), so one rank reports it skipped.
void case_timeout(const std::string& backend) {
  const int n = world_size();
  auto parent = make(backend, 0.5);
  auto doomed = parent->split(0, parent->rank());
  doomed->barrier();  // #0
  doomed->barrier();  // #1
  std::unique_ptr<fsdp::Work> work;
  std::vector<float> in(5, 1.0f), out(5, 0.0f);
  if (doomed->rank() != 0) {
    work = doomed->all_reduce(in.data(), out.data(), 5, DType::f32, ReduceOp::sum);  // #2; rank 0 is not there
    auto t0 = std::chrono::steady_clock::now();
    std::string message;
    try {
      work->wait();
    } catch (const fsdp::CommTimeout& e) {
      message = e.what();
    }
    double waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    report(!message.empty(), backend + " timeout: wait returned although rank 0 never joined");
    for (const std::string& part :
         {backend, std::string("all_reduce"), std::string("count 5"), std::string("f32"), std::string("#2")})
      report(message.find(part) != std::string::npos, backend + " timeout message lacks '" + part + "': " + message);
    report(waited_s >= 0.45,
           backend + " timeout fired after " + std::to_string(waited_s) + " s, before the 0.5 s limit");
  }
  MPI_Barrier(MPI_COMM_WORLD);  // every waiting rank has timed out
  if (doomed->rank() == 0) work = doomed->all_reduce(in.data(), out.data(), 5, DType::f32, ReduceOp::sum);
  report(poll_until_done(*work, kTimeout_s),
         backend + " timeout: the collective did not complete after rank 0 joined late");
  for (float v : out)
    report(v == static_cast<float>(n), backend + " timeout: late all_reduce gave " + std::to_string(v));
  work.reset();
  doomed.reset();
  parent->barrier();  // the parent is unaffected
}

// share_node_memory: on mpi (every rank of this job on this node) one mapping every rank sees,
// written by each and read by all; a wait on it ends when a peer's store makes it true, and times
// out naming what it waited for. Other backends map none, on every rank. One rank: none.
void case_node_shared_memory(const std::string& backend) {
  const int n = world_size(), r = world_rank();
  auto comm = make(backend, 0.5);
  auto memory = comm->share_node_memory(4096);
  const bool expected = backend == "mpi" && n > 1;
  report((memory != nullptr) == expected,
         backend + " share_node_memory: " + (memory ? "mapped" : "none") + " at np " + std::to_string(n));
  if (!memory) return;
  report(memory->bytes() == 4096 && reinterpret_cast<uintptr_t>(memory->data()) % 64 == 0,
         backend + " share_node_memory: size or alignment");
  auto* flags = reinterpret_cast<std::atomic<uint64_t>*>(memory->data());  // one per rank, then values
  auto* values = reinterpret_cast<int32_t*>(memory->data() + 64 * sizeof(std::atomic<uint64_t>));
  new (&flags[r]) std::atomic<uint64_t>(0);
  comm->barrier();
  values[r] = 1000 + r;
  flags[r].store(1, std::memory_order_release);
  memory->wait(
      [&] {
        for (int p = 0; p < n; ++p)
          if (flags[p].load(std::memory_order_acquire) < 1) return false;
        return true;
      },
      "for every rank's flag");
  for (int p = 0; p < n; ++p)
    report(values[p] == 1000 + p,
           backend + " share_node_memory: rank " + std::to_string(p) + "'s value reads " + std::to_string(values[p]));
  std::string message;
  try {
    memory->wait([&] { return flags[(r + 1) % n].load(std::memory_order_acquire) >= 2; }, "for a flag never set");
  } catch (const fsdp::CommTimeout& e) {
    message = e.what();
  }
  report(message.find("mpi node-shared wait for a flag never set") != std::string::npos &&
             message.find("comm.timeout_s = 0.5 s") != std::string::npos,
         backend + " share_node_memory: the wait's timeout says '" + message + "'");
  comm->barrier();  // nobody frees the window while a peer still reads it
}

void case_registry() {
  std::vector<std::string> built = fsdp::built_backends();
  BOOST_CHECK(std::find(built.begin(), built.end(), "mpi") != built.end());
  try {
    fsdp::make_communicator("nope", MPI_COMM_WORLD, fsdp::CommOptions{});
    BOOST_ERROR("make_communicator(\"nope\") did not throw");
  } catch (const fsdp::Error& e) {
    std::string m = e.what();
    BOOST_CHECK_MESSAGE(m.find("nope") != std::string::npos, m);
    for (const std::string& b : built)
      BOOST_CHECK_MESSAGE(m.find(b) != std::string::npos, "'" + b + "' missing from: " + m);
  }
}

// ---- registration ----

// Whether a backend starts on every rank of this job (nccl needs a GPU per rank). Every rank
// takes part, so a backend that fails on one rank is skipped on all.
std::string unavailable_reason(const std::string& backend) {
  std::string reason;
  try {
    auto c = make(backend);
    c->barrier();
  } catch (const std::exception& e) {
    reason = e.what();
  }
  int ok = reason.empty(), all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (all_ok) return "";
  return reason.empty() ? "it did not start on another rank" : reason;
}

ut::test_case* add(ut::test_suite* suite, const std::string& case_name, std::function<void()> body) {
  ut::test_case* tc = ut::make_test_case([body] { run_case(body); }, case_name, __FILE__, __LINE__);
  suite->add(tc);
  return tc;
}

// Why a built backend may fail to start with the test still passing: nccl needs a CUDA device of
// its own for every rank, and a machine may have none, or fewer than the job's ranks (NCCL
// refuses ranks that share one: "Duplicate GPU detected", docs/gpu.md). Anything else is a
// failure, not a skip: mpi launched this job, ucx needs nothing the machine may lack, and nccl
// failing on a GPU of its own is a bug to see.
bool known_unavailable(const std::string& backend, const std::string& reason) {
  if (backend != "nccl") return false;
  for (const char* known :
       {"nccl backend: no CUDA device found", "Duplicate GPU detected", "it did not start on another rank"})
    if (reason.find(known) != std::string::npos) return true;
  return false;
}

bool init_suites() {
  fsdp::testing::init_mpi_suite("comm");

  std::vector<std::string> tested;
  std::vector<std::pair<std::string, std::string>> skipped;  // backend, why it did not start
  for (const std::string& backend : fsdp::built_backends()) {
    std::string reason = unavailable_reason(backend);
    auto* suite = BOOST_TEST_SUITE(backend);
    ut::framework::master_test_suite().add(suite);
    if (!reason.empty()) {
      // Counted as a skipped case of the backend's own suite, its reason in the log, and judged
      // by registry/backends_that_cannot_start_are_skipped.
      skipped.emplace_back(backend, reason);
      ut::test_case* starts = add(suite, "starts", [] {});
      starts->add_precondition([backend, reason](ut::test_unit_id) {
        boost::test_tools::assertion_result ok(false);
        ok.message() << backend << " did not start here: " << reason;
        return ok;
      });
      continue;
    }
    tested.push_back(backend);
    for (DType d : kDtypes) {
      add(suite, "all_gather_" + name(d), [=] { case_all_gather(backend, d); });
      add(suite, "reduce_scatter_" + name(d), [=] { case_reduce_scatter(backend, d); });
      add(suite, "all_reduce_" + name(d), [=] { case_all_reduce(backend, d); });
      add(suite, "broadcast_" + name(d), [=] { case_broadcast(backend, d); });
    }
    add(suite, "in_place", [=] { case_in_place(backend); });
    add(suite, "barrier", [=] { case_barrier(backend); });
    add(suite, "split_concurrent", [=] { case_split_concurrent(backend); });
    add(suite, "out_of_order", [=] { case_out_of_order(backend); });
    add(suite, "timeout", [=] { case_timeout(backend); })->add_precondition(fsdp::testing::at_least_ranks(2));
    add(suite, "node_shared_memory", [=] { case_node_shared_memory(backend); });
  }
  auto* registry = BOOST_TEST_SUITE("registry");
  add(registry, "unknown_backend_names_built_ones", [] { case_registry(); });
  // Every built backend is either tested or skipped for a known reason (nccl without a GPU of its
  // own per rank); mpi, which runs this job, is always tested.
  add(registry, "backends_that_cannot_start_are_skipped", [tested, skipped] {
    const std::vector<std::string> built = fsdp::built_backends();
    BOOST_CHECK_MESSAGE(tested.size() + skipped.size() == built.size(),
                        std::to_string(built.size()) + " backends built, " + std::to_string(tested.size()) +
                            " tested and " + std::to_string(skipped.size()) + " skipped");
    BOOST_CHECK_MESSAGE(std::find(tested.begin(), tested.end(), "mpi") != tested.end(),
                        "the mpi backend, which runs this job, is not tested");
    for (const auto& [backend, reason] : skipped) {
      BOOST_TEST_MESSAGE("skipped backend " << backend << ": " << reason);
      BOOST_CHECK_MESSAGE(std::find(built.begin(), built.end(), backend) != built.end(),
                          "skipped backend " + backend + " is not one this build has");
      BOOST_CHECK_MESSAGE(known_unavailable(backend, reason),
                          backend +
                              " did not start, and not for a known reason (nccl without a CUDA device per "
                              "rank): " +
                              reason);
    }
  });
  ut::framework::master_test_suite().add(registry);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  fsdp::MpiSession mpi(&argc, &argv);  // MPI_Init first; MPI_Finalize when it goes out of scope
  // Each rank's exit code is its own verdict; mpirun exits non-zero if any rank does.
  return ut::unit_test_main(&init_suites, argc, argv);
}
