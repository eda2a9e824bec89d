#pragma once
// The meta communicator: rank `rank` of a world of any size that does not exist. Every
// collective completes at once and moves no data (a host value keeps this rank's own); split_by
// forms the groups the partition describes. With the meta device (tensor/meta_runtime.h) it
// lets fsdp_app --plan run the real trainer for a world size it is not launched with.
#include <memory>
#include <vector>

#include "comm/collective_cost.h"
#include "comm/comm.h"

namespace fsdp {

// A timed plan's communicator (tensor/timeline.h): each collective costs collective_seconds on
// the fabric, for its group's ranks and the nodes they span, and its Work's waits move the
// waiting lane to its end. Groups split from it inherit it.
struct MetaTiming {
  Timeline* timeline = nullptr;
  FabricSpec fabric;
  std::vector<int> node_of_rank;  // the world's ranks' nodes
};

// maps_node_memory: whether share_node_memory gives memory (address space only), as the planned
// backend's would (BackendEntry::maps_node_memory); groups split from it inherit it.
// timing: null for a memory plan (collectives take no time).
std::unique_ptr<Communicator> make_meta_communicator(int size, int rank = 0, const CommOptions& options = {},
                                                     bool maps_node_memory = true,
                                                     std::shared_ptr<const MetaTiming> timing = nullptr);

}  // namespace fsdp
