#pragma once
// What a collective costs on a planned cluster (train/plan.h's timed plan; comm/meta_comm.h
// charges it). The formulas, written down once, are nccl-tests' (doc/PERFORMANCE.md):
//
//   size     the whole array in bytes: all_gather's output, reduce_scatter's input, all_reduce's
//            and broadcast's buffer (count x ranks x element for the first two).
//   busbw    the bandwidth a link shows whatever the group size: algbw x factor, where
//            factor = (n-1)/n for all_gather and reduce_scatter, 2(n-1)/n for all_reduce, 1 for
//            broadcast. A ring's time is size x factor / busbw.
//   latency  a ring's steps each pay it: n-1 (all_gather, reduce_scatter), 2(n-1) (all_reduce);
//            broadcast is a pipelined tree: ceil(log2 n). A ring over several nodes visits each
//            node's ranks in turn (NCCL's and a node-ordered MPI ring): `nodes` of its n hops pay
//            the inter-node latency, the other n - nodes the intra-node one.
//   tree     all_reduce where the backend has one (FabricSpec::all_reduce_tree: NCCL's double
//            binary tree, Open MPI's recursive doubling for small buffers): the same busbw term;
//            latency 2 x (ceil(log2 nodes) inter-node steps + (ranks per node - 1) intra-node
//            ones: NCCL's tree of nodes with a chain inside each), on one node 2 ceil(log2 n)
//            steps; the collective takes the faster of ring and tree, as NCCL's tuner does.
//
// The link: a group on one node takes the intra-node link, a group spanning nodes the inter-node
// link (a ring across nodes runs at the slowest link it crosses: NCCL's rings over one NIC per
// GPU, MPI's over the node's NICs). HYBRID's two groups are each costed this way: its shard group
// inside a node, its replicate group across nodes. Not modelled: NVLS (NVLink SHARP), NCCL's
// PAT all_gather, congestion between jobs, rail topology.
#include <utility>
#include <vector>

#include "tensor/timeline.h"  // CollectiveKind

namespace fsdp {

struct LinkSpec {
  double bus_bytes_per_s = 0;
  double latency_s = 0;
};

// One backend's links on a cluster.
struct FabricSpec {
  LinkSpec intra, inter;
  // Measured within one node by group size (jobs/calibrate-cluster.sh: fsdp_bench at np 2..8),
  // sorted by ranks: a one-node group of n ranks takes the bandwidth and latency interpolated
  // linearly in n between the nearest measured sizes (the nearest end beyond them). CPU ranks
  // sharing cores get slower per rank as n grows; a GPU node's NVLink does not, and lists none.
  std::vector<std::pair<int, LinkSpec>> intra_by_ranks;
  // Whether collectives progress while the rank computes (NCCL on its stream: yes; MPI and UCX
  // on the CPU: a nonblocking collective moves when its rank polls, so no).
  bool overlaps_compute = true;
  // Whether all_reduce may run as a tree (see above): NCCL and MPI yes, our UCX ring no.
  bool all_reduce_tree = false;
};

double bus_factor(CollectiveKind kind, int ranks);
// The link a group of `ranks` ranks over `nodes` nodes runs at.
LinkSpec link_for(const FabricSpec& fabric, int ranks, int nodes);
double collective_seconds(CollectiveKind kind, double size_bytes, int ranks, int nodes, const FabricSpec& fabric);

}  // namespace fsdp
