#define BOOST_TEST_MODULE wait
#include <boost/test/unit_test.hpp>
// Waits and their timeouts, without MPI: the collective layer's one poll loop
// (comm.h poll_until_deadline).
#include <chrono>
#include <ctime>
#include <string>

#include "comm/comm.h"
#include "tensor/error.h"

namespace {

using fsdp::CollectiveDesc;
using fsdp::CommTimeout;
using fsdp::DType;
using fsdp::PollResult;
using Clock = std::chrono::steady_clock;

constexpr double kTimeout_s = 0.2;
const std::string kTail =
    " did not complete within comm.timeout_s = 0.2 s (a rank may have failed or skipped this collective)";

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The message of the CommTimeout `fn` throws ("" when it returns or throws something else).
template <class F>
std::string timeout_message(F&& fn) {
  try {
    fn();
  } catch (const CommTimeout& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not a CommTimeout: ") + e.what();
  }
  return "";
}

}  // namespace

BOOST_AUTO_TEST_SUITE(poll_until_deadline)

BOOST_AUTO_TEST_CASE(returns_once_the_poll_says_done) {
  int polls = 0;
  fsdp::poll_until_deadline(CollectiveDesc{"fake", "all_gather", 80, DType::f32, 7}, kTimeout_s, {}, [&] {
    return PollResult{++polls == 1000, false};
  });
  BOOST_TEST(polls == 1000);
}

BOOST_AUTO_TEST_CASE(times_out_with_the_collective_named) {
  const auto t0 = Clock::now();
  const std::string message = timeout_message([] {
    fsdp::poll_until_deadline(CollectiveDesc{"fake", "all_gather", 80, DType::f32, 7}, kTimeout_s, {},
                              [] { return PollResult{}; });
  });
  const double waited_s = seconds_since(t0);
  BOOST_TEST(message == "fake all_gather #7 (count 80, f32)" + kTail);
  BOOST_TEST(waited_s >= kTimeout_s);
  BOOST_TEST(waited_s < kTimeout_s + 1.0);
}

// A collective that keeps reporting progress is still bounded by comm.timeout_s: progress may
// come from other collectives of the family (UCX, MPI's shared-memory pipeline) while this one
// hangs.
BOOST_AUTO_TEST_CASE(moving_polls_still_time_out) {
  const std::string message = timeout_message([] {
    fsdp::poll_until_deadline(CollectiveDesc{"fake", "all_reduce", 5, DType::bf16, 2}, kTimeout_s, {}, [] {
      return PollResult{false, true};
    });
  });
  BOOST_TEST(message == "fake all_reduce #2 (count 5, bf16)" + kTail);
}

// Past the backoff's yield phase an idle wait sleeps: waiting for a peer still computing must
// leave the core to it (oversubscribed nodes).
BOOST_AUTO_TEST_CASE(long_idle_waits_sleep) {
  const std::clock_t cpu0 = std::clock();
  const auto t0 = Clock::now();
  const double timeout_s = 0.5;
  timeout_message([&] {
    fsdp::poll_until_deadline(CollectiveDesc{"fake", "barrier", 0, DType::u8, 0}, timeout_s,
                              {.spin_polls = 64, .yield_polls = 256}, [] { return PollResult{}; });
  });
  const double cpu_s = static_cast<double>(std::clock() - cpu0) / CLOCKS_PER_SEC, wall_s = seconds_since(t0);
  BOOST_TEST_MESSAGE("idle wait of " << wall_s << " s used " << cpu_s << " s of CPU");
  BOOST_TEST(cpu_s < 0.5 * wall_s);
}

BOOST_AUTO_TEST_CASE(for_purpose_names_what_the_collective_was_for) {
  const CommTimeout e(CollectiveDesc{"mpi", "all_gather", 80, DType::f32, 84}, 20);
  BOOST_TEST(std::string(e.for_purpose("of unit blocks.3 (backward prefetch)").what()) ==
             "mpi all_gather of unit blocks.3 (backward prefetch) #84 (count 80, f32) did not complete within "
             "comm.timeout_s = 20 s (a rank may have failed or skipped this collective)");
  // A timeout worded by its thrower (a device event) keeps its words, the purpose in front.
  const CommTimeout device("cuda event: not done after 20 s");
  BOOST_TEST(std::string(device.for_purpose("of unit root (forward)").what()) ==
             "of unit root (forward): cuda event: not done after 20 s");
}

BOOST_AUTO_TEST_SUITE_END()
