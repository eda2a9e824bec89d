// multihost_probe [STRATEGY] [SHARD_GROUP_SIZE]: what fsdp_app's set-up detects about the hosts,
// through the same code (MpiSession's MPI_COMM_TYPE_SHARED split, make_communicator, make_mesh).
// Rank 0 prints one line per rank, in rank order:
//   probe rank=R size=N host=H node_color=C local_rank=L local_size=S shard=[a,b] replicate=[c,d]
// where shard/replicate list the world ranks of this rank's FSDP shard and replicate groups for
// STRATEGY (default HYBRID_SHARD) with fsdp.hybrid.shard_group_size SHARD_GROUP_SIZE (default 0:
// the detected node), collected with the groups' own all_gather. The gathers cross the hosts, so
// a line per rank also shows that MPI traffic flows between them.
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/mpi_env.h"
#include "fsdp/fsdp.h"

namespace {

std::string members(fsdp::Communicator& group, int rank) {
  std::vector<int32_t> all(group.size());
  int32_t me = rank;
  group.all_gather(&me, all.data(), 1, fsdp::DType::i32)->wait();
  std::string s = "[";
  for (size_t i = 0; i < all.size(); ++i) s += (i ? "," : "") + std::to_string(all[i]);
  return s + "]";
}

}  // namespace

int main(int argc, char** argv) {
  fsdp::MpiSession mpi(&argc, &argv);
  const std::string strategy = argc > 1 ? argv[1] : "HYBRID_SHARD";
  const int group_size = argc > 2 ? std::atoi(argv[2]) : 0;
  std::string line;
  int rc = 0;
  try {
    auto world = fsdp::make_communicator("mpi", MPI_COMM_WORLD, {60.0});
    fsdp::ProcessMesh mesh = fsdp::make_mesh(*world, fsdp::parse_name(fsdp::kStrategies, strategy).value(), group_size,
                                             mpi.node_color_of_rank());
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    line = "probe rank=" + std::to_string(mpi.rank()) + " size=" + std::to_string(mpi.size()) + " host=" + host +
           " node_color=" + std::to_string(mpi.node_color()) + " local_rank=" + std::to_string(mpi.local_rank()) +
           " local_size=" + std::to_string(mpi.local_size()) + " shard=" + members(*mesh.shard, mpi.rank()) +
           " replicate=" + members(*mesh.replicate, mpi.rank());
  } catch (const std::exception& e) {
    line = "probe rank=" + std::to_string(mpi.rank()) + " error: " + e.what();
    rc = 1;
  }
  // Rank 0 prints every rank's line, so the order is the rank order.
  constexpr int kLen = 512;
  line.resize(kLen - 1, ' ');
  std::vector<char> all(mpi.rank() == 0 ? static_cast<size_t>(kLen) * mpi.size() : 0);
  MPI_Gather(line.c_str(), kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (mpi.rank() == 0) {
    for (int r = 0; r < mpi.size(); ++r) {
      std::string l(&all[static_cast<size_t>(r) * kLen]);
      l.erase(l.find_last_not_of(' ') + 1);
      std::printf("%s\n", l.c_str());
    }
    std::fflush(stdout);
  }
  int any = 0;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any;
}
