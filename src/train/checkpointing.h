#pragma once
// The training loop's side of checkpoints: the engine and optimizer state as ckpt sees it, and
// which file a run resumes from.
#include <mpi.h>

#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "tensor/tensor.h"

namespace fsdp {

class DeviceRuntime;
class FsdpEngine;
class MemoryTracker;
class Optimizer;
struct CheckpointConfig;

// This rank's shards of every unit (params and optimizer state) with the ranges it holds and
// the part it writes: replicas of a shard (HYBRID's replicate group, every rank under NO_SHARD)
// split it evenly, so all ranks write at once and no byte is written twice. The buffers are in
// engine.shard_runtime()'s memory: device memory on a device run without cpu_offload.
ShardedState checkpoint_state(FsdpEngine& engine, Optimizer& optimizer);

// checkpoint_state as save_checkpoint and load_checkpoint need it: host pointers (the HDF5
// writer and loader read and write them on the host).
//  - Shards in host memory (train.device cpu, or fsdp.cpu_offload): the buffers are the shards
//    and optimizer state themselves; the copies below do nothing, and no memory is taken.
//  - Device shards: one host staging tensor per buffer (params, then each optimizer state),
//    charged to `tracker` as `other` while this object lives. Copies run on the shard runtime's
//    compute stream, where the optimizer's kernels run, and the host waits for them.
class HostCheckpointState {
 public:
  HostCheckpointState(FsdpEngine& engine, Optimizer& optimizer, MemoryTracker& tracker);
  const ShardedState& state() const { return host_; }
  // Before a save: the device values into the staging, ordered after every kernel enqueued so
  // far (the last optimizer step included).
  void copy_from_device();
  // After a successful load: the staging into the device shards; the optimizer state too when
  // the load filled it (LoadOptions::optimizer_state). Returns once the copies are done.
  void copy_to_device(bool optimizer_state);

 private:
  DeviceRuntime& runtime_;
  ShardedState device_;          // checkpoint_state: where the values live
  ShardedState host_;            // the same with host buffers
  std::vector<Tensor> staging_;  // device runs: behind host_.buffers, one per buffer; empty on the host
};

// checkpoint.resume as the files to try, in order: none (start fresh), the given path, or for
// `auto` every complete ckpt_*.h5 in checkpoint.dir, newest first (the caller passes over files
// holding non-finite values). Rank 0 looks, every rank gets its answer; `note` tells what was
// skipped (for rank 0 to print).
std::vector<std::string> resolve_resume(const CheckpointConfig& config, MPI_Comm comm, std::string* note);

// Makes checkpoint.dir (every rank, idempotent) and checks it is a writable folder.
void prepare_checkpoint_dir(const std::string& dir);

}  // namespace fsdp
