#pragma once
// TEST HOOKS for the fault-injection and crash-safety tests, read by fsdp_app from the
// environment and installed from outside the code they test. Unset (always, outside the tests):
// nothing is installed.
//   FSDP_TEST_FAULT=skip_collective:RANK:STEP
//     rank RANK leaves out the loss all_reduce of step STEP (1-based, a fresh run) and goes on.
//     The other ranks then wait in it for a peer that never arrives, and the skipping rank waits
//     in its next collective for peers that never get there: each side must end by comm.timeout_s.
//   FSDP_TEST_FAULT=drop_replicate_reduce
//     every rank leaves out FSDP's replicate-group gradient all_reduce (HYBRID, NO_SHARD): the bug
//     the equivalence test must catch.
//   FSDP_TEST_KILL_RANK_DURING_SAVE=RANK[:STEP]
//     rank RANK SIGKILLs itself in the middle of every save (after writing its pieces, before the
//     file is complete), or only of the save after STEP.
#include <cstdint>
#include <functional>

#include "comm/fault_comm.h"

namespace fsdp_app {

struct TestFaults {
  fsdp::CommFaults comm;
  bool comm_faults = false;                             // install the decorator
  std::function<void(int64_t steps_done)> during_save;  // empty: none
};

// Throws fsdp::Error naming the variable on a malformed value.
TestFaults test_faults_from_env(int world_rank);

}  // namespace fsdp_app
