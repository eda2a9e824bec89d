#include "comm/collective_cost.h"

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
  double steps = ranks - 1;
  if (kind == CollectiveKind::all_reduce) steps = 2.0 * (ranks - 1);
  if (kind == CollectiveKind::broadcast) steps = std::ceil(std::log2(ranks));
  return size_bytes * bus_factor(kind, ranks) / link.bus_bytes_per_s + steps * link.latency_s;
}

}  // namespace fsdp
