#include "train/banner.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "config/config.h"
#include "fsdp/fsdp.h"
#include "models/model.h"
#include "train/trainer.h"

namespace fsdp {

void print_banner(const RunDescription& run) {
  const Config& c = run.config;
  const RunEnv& env = run.env;
  Model& model = run.model;
  const FsdpEngine& engine = run.engine;
  const bool leader = env.rank == 0;
  if (leader)
    std::printf(
        "fsdp_app: %s, %lld parameters, %s on %d rank%s (%s, %zu units), %s, %lld train / %lld eval samples, %lld "
        "steps (%lld per epoch)\n",
        std::string(enum_name(c.model.kind)).c_str(), static_cast<long long>(model.num_params()),
        std::string(enum_name(c.fsdp.sharding_strategy)).c_str(), env.world_size, env.world_size == 1 ? "" : "s",
        c.comm.backend.c_str(), engine.units().size(), std::string(enum_name(c.data.kind)).c_str(),
        static_cast<long long>(run.train_samples), static_cast<long long>(run.eval_samples),
        static_cast<long long>(run.total_steps), static_cast<long long>(run.steps_per_epoch));
  if (env.world_size > 1) {
    // The nodes MPI found (MPI_COMM_TYPE_SHARED: node_color), each named by its first rank's
    // host name, and the mesh made of them: HYBRID's shard groups are those nodes, and a log
    // should show what was detected. Counted by node_color, not by name: containers or emulated
    // nodes may share a host name.
    constexpr size_t kHostBytes = 64;
    char host[kHostBytes] = {};
    gethostname(host, kHostBytes - 1);
    std::vector<char> hosts(kHostBytes * env.world_size);
    const std::vector<int>& colors = run.node_colors;
    env.world->all_gather(host, hosts.data(), kHostBytes, DType::u8)->wait();
    if (leader) {
      std::string nodes;
      std::vector<int> seen;
      for (int r = 0; r < env.world_size; ++r) {
        if (std::find(seen.begin(), seen.end(), colors[r]) != seen.end()) continue;
        seen.push_back(colors[r]);
        std::string ranks;
        for (int q = r; q < env.world_size; ++q)
          if (colors[q] == colors[r]) ranks += (ranks.empty() ? "" : ",") + std::to_string(q);
        nodes += (nodes.empty() ? "" : "; ") + std::string(hosts.data() + r * kHostBytes) + ": ranks " + ranks;
      }
      const bool hybrid = engine.options().strategy == Strategy::hybrid_shard ||
                          engine.options().strategy == Strategy::hybrid_shard_zero2;
      const char* how = !hybrid ? "" : c.fsdp.shard_group_size == 0 ? " (one per node, detected)" : " (configured)";
      std::printf("mesh: %zu node%s (%s); shard groups of %d%s, %d replica%s\n", seen.size(),
                  seen.size() == 1 ? "" : "s", nodes.c_str(), engine.mesh().shard->size(), how,
                  engine.mesh().replicate->size(), engine.mesh().replicate->size() == 1 ? "" : "s");
    }
  }
}

// mpirun hands its ranks a pseudo-terminal even when its own output goes to a file (a Slurm log),
// so under a launcher the rank's isatty says nothing: what counts is where the launcher's own
// output goes, its stdout as /proc shows it (mpirun, or the orted/prted daemon on this node, is
// the rank's parent). A terminal there: bars; a file or a pipe: plain lines. Remote ranks'
// daemons have no terminal, and srun's slurmstepd writes to the job's log.
bool interactive_terminal() {
  if (!isatty(fileno(stdout))) return false;
  bool launched = false;
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID"})
    launched = launched || std::getenv(var) != nullptr;
  if (!launched) return true;
  char target[256] = {};
  const std::string fd = "/proc/" + std::to_string(getppid()) + "/fd/1";
  const ssize_t n = readlink(fd.c_str(), target, sizeof target - 1);
  if (n <= 0) return false;
  const std::string out(target, static_cast<size_t>(n));
  return out.starts_with("/dev/pts/") || out.starts_with("/dev/tty");
}

}  // namespace fsdp
