#include "train/checkpointing.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "config/config.h"
#include "fsdp/fsdp.h"
#include "optim/optim.h"
#include "tensor/device.h"
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

HostCheckpointState::HostCheckpointState(FsdpEngine& engine, Optimizer& optimizer, MemoryTracker& tracker)
    : runtime_(engine.shard_runtime()), device_(checkpoint_state(engine, optimizer)), host_(device_) {
  if (runtime_.device() == Device::cpu) return;  // host shards: written and read in place
  std::vector<int64_t> buffer_numel{static_cast<int64_t>(engine.param_shards().size())};
  for (auto& [name, tensor] : optimizer.state()) buffer_numel.push_back(tensor->numel());
  for (size_t b = 0; b < device_.buffers.size(); ++b) {
    staging_.push_back(Tensor::empty({buffer_numel[b]}, DType::f32, MemCategory::other, &tracker));
    host_.buffers[b] = staging_.back().f32();
  }
}

void HostCheckpointState::copy_from_device() {
  if (staging_.empty()) return;
  // The compute stream: the optimizer's kernels write the shards and their state there, so these
  // copies read the values of the last step, not a half-written one.
  const Stream s = runtime_.compute_stream();
  for (size_t b = 0; b < staging_.size(); ++b)
    runtime_.copy_async(host_.buffers[b], device_.buffers[b], staging_[b].bytes(), CopyKind::device_to_host, s);
  runtime_.synchronize(s);  // the writer reads the staging next
}

void HostCheckpointState::copy_to_device(bool optimizer_state) {
  if (staging_.empty()) return;
  // The loader fills the parameter buffer always, the optimizer's only when asked to: a buffer it
  // did not fill must not overwrite the device's values.
  const size_t buffers = optimizer_state ? staging_.size() : 1;
  const Stream s = runtime_.compute_stream();
  for (size_t b = 0; b < buffers; ++b)
    runtime_.copy_async(device_.buffers[b], host_.buffers[b], staging_[b].bytes(), CopyKind::host_to_device, s);
  // Before the staging is freed; and kernels enqueued later on this stream see the loaded values,
  // as does the comm stream, which waits for compute before it reads a shard (FsdpEngine::unshard).
  runtime_.synchronize(s);
}

std::vector<std::string> resolve_resume(const CheckpointConfig& config, MPI_Comm comm, std::string* note) {
  if (config.resume.empty()) return {};
  if (config.resume != "auto") return {config.resume};
  int rank = 0;
  if (comm != MPI_COMM_NULL) MPI_Comm_rank(comm, &rank);
  std::string joined, text;  // the paths, each followed by a NUL (which no path holds)
  if (rank == 0) {
    std::vector<std::string> skipped;
    for (const std::string& p : complete_checkpoints(config.dir, &skipped)) joined += p + '\0';
    for (const std::string& s : skipped) text += "checkpoint: skipping " + s + "\n";
    text += joined.empty() ? "checkpoint: no complete checkpoint in " + config.dir + ", starting fresh\n" : "";
  }
  if (comm != MPI_COMM_NULL) {
    int len = static_cast<int>(joined.size());
    MPI_Bcast(&len, 1, MPI_INT, 0, comm);
    joined.resize(len);
    MPI_Bcast(joined.data(), len, MPI_CHAR, 0, comm);
  }
  if (note) *note = text;
  std::vector<std::string> paths;
  for (size_t begin = 0, end = joined.find('\0'); end != std::string::npos;
       begin = end + 1, end = joined.find('\0', begin))
    paths.push_back(joined.substr(begin, end - begin));
  return paths;
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
