// What rank 0 prints when a run starts: the model, strategy, backend, data and schedule, and the
// mesh line (the nodes MPI found, each named by its first rank's host, and the groups made of
// them). Collective: every rank calls it (the host names are gathered).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "data/data.h"
#include "data/tokenizer.h"
#include "train/trainer_state.h"

namespace fsdp {

void Trainer::print_banner() const {
  const State& s = *s_;
  const Config& c = s.c;
  const RunEnv& env = s.env;
  const FsdpEngine& engine = *s.engine;
  const bool leader = env.rank == 0;
  if (leader)
    std::printf(
        "fsdp_app: %s, %lld parameters, %s on %d rank%s (%s, %zu units), %s, %lld train / %lld eval samples, %lld "
        "steps (%lld per epoch)\n",
        c.model.kind.c_str(), static_cast<long long>(s.model->num_params()),
        std::string(enum_name(c.fsdp.sharding_strategy)).c_str(), env.world_size, env.world_size == 1 ? "" : "s",
        c.comm.backend.c_str(), engine.units().size(), std::string(enum_name(c.data.kind)).c_str(),
        static_cast<long long>(s.data.train->size()), static_cast<long long>(s.data.eval->size()),
        static_cast<long long>(s.total_steps), static_cast<long long>(s.steps_per_epoch));
  if (leader && !s.data.train->summary().empty())
    std::printf("fsdp_app: %s data, %s: train %s; eval %s\n", std::string(enum_name(c.data.kind)).c_str(),
                s.data.train->tokenizer() ? s.data.train->tokenizer()->describe().c_str() : "bytes",
                s.data.train->summary().c_str(), s.data.eval->summary().c_str());
  // A GEMM precision other than f32 changes every number of the run: say so where the run starts.
  if (leader && c.train.matmul_precision != MatmulPrecision::highest)
    std::printf("fsdp_app: train.matmul_precision %s: GEMM operands rounded to %s, f32 accumulation\n",
                std::string(matmul_precision_name(c.train.matmul_precision)).c_str(),
                std::string(rounded_operand_name(c.train.matmul_precision)).c_str());
  if (leader && !s.attention_note.empty())
    std::printf("fsdp_app: model.attention auto: %s\n", s.attention_note.c_str());
  // Computing in bf16/f16 changes every number of the run too (fsdp.mixed_precision.compute).
  if (leader && c.fsdp.mixed_precision.param_dtype != DType::f32)
    std::printf("fsdp_app: fsdp.mixed_precision: parameters gathered in %s, %s\n",
                std::string(dtype_name(c.fsdp.mixed_precision.param_dtype)).c_str(),
                compute_dtype(c.fsdp.mixed_precision) == DType::f32 ? "activations and arithmetic in f32 (compute: f32)"
                : saved_activation_dtype(c.fsdp.mixed_precision) == DType::f32
                    ? "each unit computing in it as PyTorch does (compute: param_dtype), its activations held "
                      "in f32 until backward (saved_activations: f32)"
                    : "each unit computing in it as PyTorch does (compute: param_dtype), its activations held "
                      "in it until backward (saved_activations: param_dtype)");
  // Device runs: how the backend takes device buffers, and why (comm.device_buffers).
  if (leader && s.comms.device)
    std::printf("fsdp_app: comm %s: %s\n", c.comm.backend.c_str(), s.comms.device->device_path().text.c_str());
  if (leader && !engine.node_shared_params_note().empty())
    std::printf("fsdp_app: fsdp.node_shared_params %s\n", engine.node_shared_params_note().c_str());
  if (env.world_size > 1) {
    // The nodes MPI found (MPI_COMM_TYPE_SHARED: node_color), each named by its first rank's
    // host name, and the mesh made of them: HYBRID's shard groups are those nodes, and a log
    // should show what was detected. Counted by node_color, not by name: containers or emulated
    // nodes may share a host name.
    constexpr size_t kHostBytes = 64;
    char host[kHostBytes] = {};
    gethostname(host, kHostBytes - 1);
    std::vector<char> hosts(kHostBytes * env.world_size);
    const std::vector<int>& colors = s.node_colors;
    env.world->all_gather(host, hosts.data(), kHostBytes, DType::u8)->wait();
    if (leader) {
      std::string nodes;
      std::vector<int> seen;
      for (int r = 0; r < env.world_size; ++r) {
        if (std::find(seen.begin(), seen.end(), colors[r]) != seen.end()) continue;
        seen.push_back(colors[r]);
        std::string ranks;
        for (int q = r; q < env.world_size; ++q)
          if (colors[q] == colors[r]) ranks.append(ranks.empty() ? "" : ",").append(std::to_string(q));
        nodes += (nodes.empty() ? "" : "; ") + std::string(hosts.data() + r * kHostBytes) + ": ranks " + ranks;
      }
      const char* how = !is_hybrid(engine.options().strategy) ? ""
                        : c.fsdp.shard_group_size == 0        ? " (one per node, detected)"
                                                              : " (configured)";
      std::printf("mesh: %zu node%s (%s); shard groups of %d%s, %d replica%s\n", seen.size(),
                  seen.size() == 1 ? "" : "s", nodes.c_str(), engine.mesh().shard->size(), how,
                  engine.mesh().replicate->size(), engine.mesh().replicate->size() == 1 ? "" : "s");
    }
  }
}

}  // namespace fsdp
