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
