// The process mesh: which ranks share shards (the shard group) and which hold replicas of the
// same shard (the replicate group). Every rank computes the whole partition from the node colors
// of all ranks, so a mesh that cannot be formed fails on every rank alike before any split, and
// the meta communicator of a plan knows its groups' sizes.
#include <algorithm>

#include "fsdp/fsdp.h"
#include "tensor/error.h"

namespace fsdp {

MeshColors mesh_colors(Strategy strategy, int shard_group_size, const std::vector<int>& node_color_of_rank) {
  const int n = static_cast<int>(node_color_of_rank.size());
  MeshColors m;
  m.shard.resize(static_cast<size_t>(n));
  m.replicate.resize(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const auto i = static_cast<size_t>(r);
    switch (strategy) {
      case Strategy::full_shard:
      case Strategy::shard_grad_op: m.shard[i] = 0, m.replicate[i] = r; break;
      case Strategy::no_shard: m.shard[i] = r, m.replicate[i] = 0; break;
      case Strategy::hybrid_shard:
      case Strategy::hybrid_shard_zero2:
        if (shard_group_size > 0) {
          m.shard[i] = r / shard_group_size, m.replicate[i] = r % shard_group_size;
        } else {  // one shard group per node; replicas pair the ranks of equal place on their nodes
          const auto first = node_color_of_rank.begin();
          m.shard[i] = node_color_of_rank[i];
          m.replicate[i] = static_cast<int>(std::count(first, first + r, node_color_of_rank[i]));
        }
        break;
    }
  }
  if (!is_hybrid(strategy)) return m;
  if (shard_group_size > 0 && n % shard_group_size != 0)
    throw Error("fsdp.hybrid.shard_group_size " + std::to_string(shard_group_size) + " does not divide the " +
                std::to_string(n) + " ranks");
  // Every node must hold the same number of ranks, or shards would not line up across replicas.
  const auto group_size = [&](int r) {
    return static_cast<int>(std::count(m.shard.begin(), m.shard.end(), m.shard[static_cast<size_t>(r)]));
  };
  for (int r = 1; r < n; ++r)
    if (group_size(r) != group_size(0))
      throw Error("HYBRID sharding needs the same number of ranks on every node (rank 0's node has " +
                  std::to_string(group_size(0)) + ", rank " + std::to_string(r) + "'s has " +
                  std::to_string(group_size(r)) + ")");
  return m;
}

ProcessMesh make_mesh(Communicator& world, Strategy strategy, int shard_group_size,
                      const std::vector<int>& node_color_of_rank) {
  if (node_color_of_rank.size() != static_cast<size_t>(world.size()))
    throw Error("make_mesh: node colors of " + std::to_string(node_color_of_rank.size()) + " ranks for a world of " +
                std::to_string(world.size()));
  const MeshColors colors = mesh_colors(strategy, shard_group_size, node_color_of_rank);
  ProcessMesh mesh;
  mesh.shard = world.split_by(colors.shard);
  mesh.replicate = world.split_by(colors.replicate);
  const auto me = static_cast<size_t>(world.rank());
  mesh.shard_group_on_one_node = true;
  for (size_t r = 0; r < colors.shard.size(); ++r)
    if (colors.shard[r] == colors.shard[me] && node_color_of_rank[r] != node_color_of_rank[me])
      mesh.shard_group_on_one_node = false;
  return mesh;
}

}  // namespace fsdp
