#pragma once
// A communicator of one process that needs no MPI: the identity for every collective. It lets
// the FSDP engine run unchanged in single-process tools and tests, and stands in for the size-1
// groups of degenerate meshes.
#include <memory>

#include "comm/comm.h"

namespace fsdp {

std::unique_ptr<Communicator> make_local_communicator(const CommOptions& options = {});

}  // namespace fsdp
