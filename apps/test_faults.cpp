#include "test_faults.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tensor/error.h"

namespace fsdp_app {

TestFaults test_faults_from_env(int world_rank) {
  TestFaults f;
  if (const char* text = std::getenv("FSDP_TEST_FAULT"); text && *text) {
    int rank = -1;
    long long step = -1;
    if (std::strcmp(text, "drop_replicate_reduce") == 0) {
      f.comm.drop_group_f32_all_reduce = true;
      // NOLINTNEXTLINE(cert-err34-c): a test hook's value, written by tests/fault; checked below
    } else if (std::sscanf(text, "skip_collective:%d:%lld", &rank, &step) == 2 && rank >= 0 && step >= 1) {
      f.comm.rank = rank;
      f.comm.skip_scalar_all_reduce = step;
    } else {
      throw fsdp::Error(std::string("FSDP_TEST_FAULT '") + text +
                        "': expected skip_collective:RANK:STEP or drop_replicate_reduce (a test hook)");
    }
    f.comm_faults = true;
  }
  if (const char* kill = std::getenv("FSDP_TEST_KILL_RANK_DURING_SAVE"); kill && *kill) {
    // NOLINTNEXTLINE(cert-err34-c): a test hook's value, written by the crash-safety tests
    const int rank = std::atoi(kill);
    const char* colon = std::strchr(kill, ':');
    // NOLINTNEXTLINE(cert-err34-c): as above
    const long long only_step = colon ? std::atoll(colon + 1) : -1;
    if (rank == world_rank)
      f.during_save = [only_step](int64_t steps_done) {
        if (only_step < 0 || only_step == steps_done) (void)std::raise(SIGKILL);  // no flush: it is collective
      };
  }
  return f;
}

}  // namespace fsdp_app
