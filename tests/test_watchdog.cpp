// comm/watchdog: the deadline of blocking collectives. Each case runs in a forked child, since
// an expired watchdog ends its process.
#define BOOST_TEST_MODULE watchdog
#include <sys/wait.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "comm/watchdog.h"

namespace {

struct Child {
  int exit_code = -1;
  std::string err;
};

// Runs body in a child process; returns its exit code and what it wrote to stderr.
template <class F>
Child in_child(F body) {
  int fds[2];
  BOOST_REQUIRE(pipe(fds) == 0);
  pid_t pid = fork();
  BOOST_REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 2);
    body();
    std::_Exit(0);
  }
  close(fds[1]);
  Child c;
  char buf[512];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) c.err.append(buf, n);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return c;
}

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

}  // namespace

BOOST_AUTO_TEST_CASE(a_call_past_its_deadline_ends_the_process_naming_it) {
  Child c = in_child([] {
    fsdp::Watchdog w;
    auto armed = w.arm("mpi all_gather #7 (count 65536, f32)", 0.2);
    sleep_s(5.0);  // the "hung" collective
  });
  BOOST_TEST(c.exit_code == 1);
  BOOST_TEST(
      c.err ==
      "fsdp_app: mpi all_gather #7 (count 65536, f32) did not complete within comm.timeout_s = 0.2 s (a rank may "
      "have failed, hung or skipped this collective); ending this rank\n");
}

BOOST_AUTO_TEST_CASE(calls_that_return_in_time_disarm_it) {
  Child c = in_child([] {
    fsdp::Watchdog w;
    for (int i = 0; i < 1000; ++i) auto armed = w.arm("call " + std::to_string(i), 0.3);  // armed and disarmed
    {
      auto armed = w.arm("last", 0.2);
      sleep_s(0.05);
    }
    sleep_s(0.6);  // well past every deadline, with nothing armed
  });
  BOOST_TEST(c.exit_code == 0);
  BOOST_TEST(c.err == "");
}

BOOST_AUTO_TEST_CASE(re_arming_moves_the_deadline) {
  // Each arming gets its own deadline: a later, longer one is not cut short by an earlier one.
  Child c = in_child([] {
    fsdp::Watchdog w;
    { auto armed = w.arm("short", 0.2); }
    auto armed = w.arm("long", 2.0);
    sleep_s(0.6);
  });
  BOOST_TEST(c.exit_code == 0);
  BOOST_TEST(c.err == "");
}
