#pragma once
// Agreeing on an error across ranks. A step that may fail on some ranks only (reading a file,
// starting a backend, a set-up) must end the same way on all of them: a rank that failed and
// ranks that went on would otherwise wait for each other in the next collective forever. Every
// rank passes its own outcome; every rank gets the lowest failing rank's message and how many
// failed. Bounded by the transport's own timeout (the Communicator's comm.timeout_s, or MPI's).
#include <mpi.h>

#include <string>

namespace fsdp {

class Communicator;

struct Agreement {
  int first_failed = -1;  // lowest failing rank; -1: none failed
  int failed_ranks = 0;
  int ranks = 1;
  std::string message;  // first_failed's error ("" when none failed)
  bool ok() const { return first_failed < 0; }
  bool all_failed() const { return failed_ranks == ranks; }
  // The message, naming the rank when it matters: when some ranks got through.
  std::string text() const;
  // Throws Error(text()) unless ok().
  void throw_if_failed() const;
};

// Collective over `comm`; error "" = this rank succeeded. MPI_COMM_NULL: this process alone.
Agreement agree_on_error(MPI_Comm comm, const std::string& error);
// The same over a Communicator's host values (the trainer's world, which may be UCX or, in a
// plan, the meta communicator: there this rank decides alone, as the plan is rank 0's).
Agreement agree_on_error(Communicator& comm, const std::string& error);

}  // namespace fsdp
