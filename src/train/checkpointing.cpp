#include "train/checkpointing.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "config/config.h"
#include "fsdp/fsdp.h"
#include "optim/optim.h"
#include "tensor/error.h"

namespace fsdp {

ShardedState checkpoint_state(FsdpEngine& engine, Optimizer& optimizer) {
  const Communicator& shard = *engine.mesh().shard;
  const Communicator* replicate = engine.mesh().replicate.get();
  const int64_t r = shard.rank(), replicas = replicate ? replicate->size() : 1, j = replicate ? replicate->rank() : 0;
  ShardedState st;
  for (const auto& u : engine.units()) {
    UnitShard us;
    us.layout = &u->layout;
    us.padded_numel = u->padded_numel;
    us.held_begin = r * u->shard_numel;
    us.held_count = u->shard_numel;
    us.local_offset = u->shard_offset;
    const int64_t from = u->shard_numel * j / replicas, to = u->shard_numel * (j + 1) / replicas;
    us.write_begin = us.held_begin + from;
    us.write_count = to - from;
    st.units.push_back(us);
  }
  st.buffers.push_back(engine.param_shards().data());
  for (auto& [name, tensor] : optimizer.state()) {
    st.state_names.push_back(name);
    st.buffers.push_back(tensor->f32());
  }
  return st;
}

std::string resolve_resume(const CheckpointConfig& config, MPI_Comm comm, std::string* note) {
  if (config.resume != "auto") return config.resume;
  int rank = 0;
  if (comm != MPI_COMM_NULL) MPI_Comm_rank(comm, &rank);
  std::string path, text;
  if (rank == 0) {
    std::vector<std::string> skipped;
    path = latest_checkpoint(config.dir, &skipped);
    for (const std::string& s : skipped) text += "checkpoint: skipping " + s + "\n";
    text += path.empty() ? "checkpoint: no complete checkpoint in " + config.dir + ", starting fresh\n" : "";
  }
  if (comm != MPI_COMM_NULL) {
    int len = static_cast<int>(path.size());
    MPI_Bcast(&len, 1, MPI_INT, 0, comm);
    path.resize(len);
    MPI_Bcast(path.data(), len, MPI_CHAR, 0, comm);
  }
  if (note) *note = text;
  return path;
}

void prepare_checkpoint_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (!std::filesystem::is_directory(dir))
    throw Error("checkpoint.dir " + dir + ": cannot create the folder" + (ec ? " (" + ec.message() + ")" : ""));
  if (access(dir.c_str(), W_OK | X_OK) != 0)
    throw Error("checkpoint.dir " + dir + ": not writable (" + std::strerror(errno) + ")");
}

}  // namespace fsdp
