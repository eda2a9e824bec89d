#pragma once
// What every Boost.Test executable run under mpirun (tests/mpirun.sh NP EXE) shares: the rank and
// size of MPI_COMM_WORLD, checks that a failing rank other than 0 also names on stderr (its Boost
// log is silenced), and the silencing itself — only rank 0 logs and reports, unless
// FSDP_TEST_ALL_RANKS is set. Each rank runs every case; a failing rank exits non-zero, and so
// does mpirun.
#include <mpi.h>
#include <boost/test/results_reporter.hpp>
#include <boost/test/unit_test.hpp>

#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <string>

namespace fsdp::testing {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// A precondition for a case that needs at least n ranks (`*boost::unit_test::precondition(
// at_least_ranks(2))`, or test_unit::add_precondition): at a smaller world size Boost.Test reports
// the case as skipped, with this reason, instead of a pass that checked nothing. Every rank
// evaluates it alike, so no rank enters the case's collectives alone.
inline boost::unit_test::test_unit::precondition_t at_least_ranks(int n) {
  return [n](boost::unit_test::test_unit_id) {
    boost::test_tools::assertion_result ok(world_size() >= n);
    if (!ok) ok.message() << "needs " << n << " or more ranks, this job has " << world_size();
    return ok;
  };
}

inline void report(bool ok, const std::string& what) {
  BOOST_CHECK_MESSAGE(ok, what);
  if (!ok && world_rank() != 0) std::fprintf(stderr, "[rank %d] check failed: %s\n", world_rank(), what.c_str());
}

// Names the master suite; on ranks other than 0 drops the log and the report.
inline void init_mpi_suite(const char* name) {
  namespace ut = boost::unit_test;
  ut::framework::master_test_suite().p_name.value = name;
  if (world_rank() == 0 || std::getenv("FSDP_TEST_ALL_RANKS")) return;
  static std::ostream null_stream(nullptr);  // badbit: every write is dropped
  ut::unit_test_log.set_threshold_level(ut::log_nothing);
  ut::unit_test_log.set_stream(null_stream);
  ut::results_reporter::set_level(ut::NO_REPORT);
  ut::results_reporter::set_stream(null_stream);
}

}  // namespace fsdp::testing
