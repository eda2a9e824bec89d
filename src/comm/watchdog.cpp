#include "comm/watchdog.h"

#include <cstdio>
#include <cstdlib>

namespace fsdp {

Watchdog::Watchdog() : thread_([this] { run(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Watchdog::Armed Watchdog::arm(std::string what, double timeout_s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = true;
    ++generation_;
    what_ = std::move(what);
    timeout_s_ = timeout_s;
    deadline_ = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                       std::chrono::duration<double>(timeout_s));
  }
  cv_.notify_all();
  return Armed(*this);
}

void Watchdog::disarm() {
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = false;
  // No notify: the thread finds the arming gone when it wakes, at the latest at the deadline.
}

void Watchdog::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (!armed_) {
      cv_.wait(lock);
      continue;
    }
    const uint64_t generation = generation_;
    const auto deadline = deadline_;
    cv_.wait_until(lock, deadline, [&] { return stop_ || !armed_ || generation_ != generation; });
    if (stop_ || !armed_ || generation_ != generation) continue;
    if (std::chrono::steady_clock::now() < deadline) continue;
    // Same wording as the polled waits' CommTimeout: one line naming the collective.
    std::fprintf(stderr,
                 "fsdp_app: %s did not complete within comm.timeout_s = %g s (a rank may have failed, hung "
                 "or skipped this collective); ending this rank\n",
                 what_.c_str(), timeout_s_);
    std::fflush(stderr);
    std::_Exit(1);  // not exit(): the main thread is inside MPI; run no destructors under it
  }
}

}  // namespace fsdp
