#pragma once
// The training loop's side of checkpoints: the engine and optimizer state as ckpt sees it, and
// which file a run resumes from.
#include <mpi.h>

#include <string>

#include "ckpt/checkpoint.h"

namespace fsdp {

class FsdpEngine;
class Optimizer;
struct CheckpointConfig;

// This rank's shards of every unit (params and optimizer state) with the ranges it holds and
// the part it writes: replicas of a shard (HYBRID's replicate group, every rank under NO_SHARD)
// split it evenly, so all ranks write at once and no byte is written twice.
ShardedState checkpoint_state(FsdpEngine& engine, Optimizer& optimizer);

// checkpoint.resume as a file: "" (start fresh), the given path, or for `auto` the newest
// complete ckpt_*.h5 in checkpoint.dir. Rank 0 looks, every rank gets its answer; `note` tells
// what was chosen or skipped (for rank 0 to print).
std::string resolve_resume(const CheckpointConfig& config, MPI_Comm comm, std::string* note);

// Makes checkpoint.dir (every rank, idempotent) and checks it is a writable folder.
void prepare_checkpoint_dir(const std::string& dir);

}  // namespace fsdp
