#pragma once
// Fault injection for the fault-tolerance and equivalence tests, from outside the code they
// test: a Communicator decorator (the device_comm pattern) that leaves collectives out as a rank
// that skipped one, or a bug that lost one, would. fsdp_app installs it from FSDP_TEST_FAULT
// (apps/test_faults.cpp); nothing else in the library knows about it.
#include <cstdint>
#include <memory>

#include "comm/comm.h"

namespace fsdp {

struct CommFaults {
  // On rank `rank` of the world: leave out the N-th all_reduce of one f64 summed over the world
  // (1-based). The trainer's only such reduction is the step's loss, one per step, so in a
  // fresh run N is the step. -1: none.
  int rank = -1;
  int64_t skip_scalar_all_reduce = -1;
  // On every rank: all_reduces of f32 on the groups split from the world do nothing. FSDP's only
  // such reduction is the replicate group's gradient sum (HYBRID, NO_SHARD): the bug the
  // equivalence test must catch.
  bool drop_group_f32_all_reduce = false;
};

// Announces each injected fault on stderr ("fsdp_app: rank R: FSDP_TEST_FAULT: ...").
std::unique_ptr<Communicator> make_faulty_communicator(std::unique_ptr<Communicator> inner, const CommFaults& faults);

}  // namespace fsdp
