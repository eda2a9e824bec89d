#include "comm/collective_cost.h"

#include <algorithm>
#include <cmath>

namespace fsdp {

double bus_factor(CollectiveKind kind, int ranks) {
  const double n = ranks;
  switch (kind) {
    case CollectiveKind::all_gather:
    case CollectiveKind::reduce_scatter: return (n - 1) / n;
    case CollectiveKind::all_reduce: return 2 * (n - 1) / n;
    case CollectiveKind::broadcast: return 1;
  }
  return 1;
}

LinkSpec link_for(const FabricSpec& fabric, int ranks, int nodes) {
  if (nodes > 1) return fabric.inter;
  const auto& m = fabric.intra_by_ranks;
  if (m.empty()) return fabric.intra;
  if (ranks <= m.front().first) return m.front().second;
  if (ranks >= m.back().first) return m.back().second;
  for (size_t i = 1; i < m.size(); ++i) {
    if (ranks > m[i].first) continue;
    const auto& [n0, a] = m[i - 1];
    const auto& [n1, b] = m[i];
    const double w = static_cast<double>(ranks - n0) / (n1 - n0);
    return {a.bus_bytes_per_s + w * (b.bus_bytes_per_s - a.bus_bytes_per_s),
            a.latency_s + w * (b.latency_s - a.latency_s)};
  }
  return m.back().second;
}

double collective_seconds(CollectiveKind kind, double size_bytes, int ranks, int nodes, const FabricSpec& fabric) {
  if (ranks <= 1 || size_bytes <= 0) return 0;
  const LinkSpec link = link_for(fabric, ranks, nodes);
  // A ring's step latency: on one node the link's; across nodes the ring visits each node's
  // ranks in turn, so `nodes` of its hops cross the network and the rest stay inside a node.
  const double n = ranks, hops_out = nodes > 1 ? nodes : 0;
  const double intra_latency_s = link_for(fabric, std::max(2, ranks / std::max(1, nodes)), 1).latency_s;
  const double ring_step_s =
      nodes > 1 ? (hops_out * link.latency_s + (n - hops_out) * intra_latency_s) / n : link.latency_s;
  double latency_s = (n - 1) * ring_step_s;
  if (kind == CollectiveKind::all_reduce) latency_s = 2 * (n - 1) * ring_step_s;
  if (kind == CollectiveKind::broadcast) latency_s = std::ceil(std::log2(n)) * link.latency_s;
  if (kind == CollectiveKind::all_reduce && fabric.all_reduce_tree) {
    // Up and down a tree: across nodes a binary tree of the nodes plus a chain inside each node
    // (NCCL's); on one node, recursive doubling's log2 steps.
    const double tree_s = nodes > 1 ? 2 * (std::ceil(std::log2(static_cast<double>(nodes))) * link.latency_s +
                                           (n / nodes - 1) * intra_latency_s)
                                    : 2 * std::ceil(std::log2(n)) * link.latency_s;
    latency_s = std::min(latency_s, tree_s);
  }
  return size_bytes * bus_factor(kind, ranks) / link.bus_bytes_per_s + latency_s;
}

}  // namespace fsdp
