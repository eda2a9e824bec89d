#pragma once
// Training checkpoints as parallel HDF5 files (MPI-IO). Two formats, both complete for resume:
//
//   consolidated  /model/<name>            full PyTorch shape, f32
//                 /optim/<name>/<state>    same shape (exp_avg, square_avg, momentum_buffer, ...)
//   sharded       /shards/<k>/params       unit k's padded flat buffer (padded_numel), each rank's
//                 /shards/<k>/optim/<state>  shard written in place at its offset
//                 /index/...               per parameter: unit, offset, numel, shape, crc32
//
// Root attributes hold the run's position (CheckpointMeta); every tensor dataset has a `crc32`
// attribute (zlib CRC-32 of its little-endian f32 bytes in row-major order: h5py users check it
// with zlib.crc32(ds[...].astype('<f4').tobytes())).
//
// Every rank writes only the pieces of its own shard (replicas split a shard between them) and
// reads only the pieces its new shard needs, so no rank ever holds the whole model, and a file
// written at one world size, strategy or wrap policy loads at any other: the loader maps by
// parameter name. A file appears under its final name only when complete and verified.
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/formats.h"
#include "fsdp/strategy.h"
#include "nn/flat.h"
#include "optim/kinds.h"
#include "tensor/error.h"

namespace fsdp {

constexpr int64_t kCheckpointFormatVersion = 1;

CheckpointFormat parse_checkpoint_format(const std::string& name);

// The root attributes: what the run was and where it stands. Everything resume needs besides
// the tensors: the sampler position and the dropout streams are functions of (seed, step), the
// learning rate of (step, epoch), so these numbers restore them exactly.
struct CheckpointMeta {
  CheckpointFormat format = CheckpointFormat::consolidated;
  int64_t format_version = kCheckpointFormatVersion;
  int64_t step = 0;           // optimizer steps done; training resumes with step `step`
  int64_t epoch = 0;          // 0-based epoch of the next step
  int64_t step_in_epoch = 0;  // sampler position of the next step inside that epoch
  int64_t steps_per_epoch = 0;
  int64_t world_size = 1;
  int64_t shard_group_size = 1;
  int64_t global_batch_size = 0;
  int64_t seed = 0;  // Philox key of init, shuffles and dropout
  Strategy strategy = Strategy::full_shard;
  std::string backend;  // comm.backend: a name, since the backends are those a build has
  WrapPolicy wrap_policy = WrapPolicy::size_based;
  std::string model_kind = "mnist_cnn";  // model.kind: a family's name, as the families are those registered
  OptimizerKind optimizer = OptimizerKind::sgd;
  std::vector<std::string> optimizer_states;  // names stored per parameter, e.g. exp_avg
  int64_t optimizer_step = 0;
  SchedulerKind scheduler = SchedulerKind::none;  // the schedule itself is a function of step and epoch
  double lr = 0.0;                                // learning rate of the last step
  double loss_scale = 0.0;                        // f16 loss scaler (0 when off)
  int64_t loss_scale_good_steps = 0;
  double best_eval_loss = -1.0;  // save_best's threshold; -1: no evaluation yet
  std::string config_yaml;       // the input file's text after --set overrides
};

// One FSDP unit as a checkpoint sees it on this rank.
struct UnitShard {
  const FlatLayout* layout = nullptr;        // params in PyTorch order, offsets in the flat buffer
  int64_t padded_numel = 0;                  // flat buffer size, padding at the end
  int64_t held_begin = 0, held_count = 0;    // this rank's shard: range of the flat buffer
  int64_t local_offset = 0;                  // where the shard starts in `buffers`
  int64_t write_begin = 0, write_count = 0;  // the part of the shard this rank saves
};

// This rank's training state: the units' shards, concatenated in `buffers` (params first, then
// one buffer per optimizer state name, all the same layout).
struct ShardedState {
  std::vector<UnitShard> units;
  std::vector<std::string> state_names;
  std::vector<float*> buffers;  // 1 + state_names.size()
};

struct CheckpointStats {
  int64_t bytes = 0;     // tensor bytes in the file (all ranks)
  double seconds = 0.0;  // wall time of the whole save or load, every rank done
};

struct SaveOptions {
  CheckpointFormat format = CheckpointFormat::consolidated;
  bool collective = false;  // MPI-IO collective transfers (default: independent)
  // Called on every rank after it wrote its pieces, before the file is complete: where the
  // crash-safety tests kill a rank (fsdp_app's FSDP_TEST_KILL_RANK_DURING_SAVE). Empty: nothing.
  std::function<void()> after_pieces_written;
};

// Collective over comm (MPI_COMM_NULL: this process alone, without MPI). Writes path.tmp, checks
// every piece it wrote by reading it back, fsyncs, renames to path, fsyncs the folder.
CheckpointStats save_checkpoint(const std::string& path, const ShardedState& state, const CheckpointMeta& meta,
                                const SaveOptions& options, MPI_Comm comm);

struct LoadOptions {
  bool optimizer_state = true;             // false: parameters only
  std::optional<OptimizerKind> optimizer;  // with optimizer_state: the kind this run uses (must match)
};

// A checkpoint whose tensors are not all finite (a diverged run's): save_checkpoint does not
// write one and load_checkpoint does not load one (after its CRC checks pass), on every rank
// alike, so a run that diverged never replaces good checkpoints and `resume: auto` can pass over
// such a file.
class NonFiniteCheckpoint : public Error {
 public:
  using Error::Error;
};

// Collective over comm. Fills every rank's shard (params, and optimizer state when asked) from
// a checkpoint of either format written at any world size, strategy or wrap policy. Verifies
// each tensor's crc32 from the pieces all ranks read. A bad file is an Error with one line,
// thrown on every rank (no rank is left waiting); a sound file holding NaN or Inf is a
// NonFiniteCheckpoint (the shards then hold its values: load another file or stop).
CheckpointMeta load_checkpoint(const std::string& path, const ShardedState& state, const LoadOptions& options,
                               MPI_Comm comm, CheckpointStats* stats = nullptr);

// Root attributes only (one process). Error on a file that is not a complete checkpoint.
CheckpointMeta read_checkpoint_meta(const std::string& path);

// Files in a checkpoint dir: ckpt_<step, 8 digits>.h5, best.h5, and `.tmp` while being written.
std::string checkpoint_path(const std::string& dir, int64_t step);
std::string best_checkpoint_path(const std::string& dir);
// The newest ckpt_*.h5 in dir whose attributes read back complete ("" when none); files that do
// not (a torn copy, a foreign file) are skipped with a note in `skipped`. One process.
std::string latest_checkpoint(const std::string& dir, std::vector<std::string>* skipped = nullptr);
// The newest `max_count` of those, newest first (resume: auto tries them in this order).
std::vector<std::string> complete_checkpoints(const std::string& dir, std::vector<std::string>* skipped = nullptr,
                                              size_t max_count = SIZE_MAX);
// After a save of step `saved_step`: removes all but the newest `keep` ckpt_*.h5 files of steps
// up to saved_step, and any stale .tmp file. Files of later steps (junk, or a previous run's in a
// reused folder) are never what pushes the file just saved out. One process.
void prune_checkpoints(const std::string& dir, int64_t keep, int64_t saved_step);

}  // namespace fsdp

// ---- Contents and integrity of a checkpoint file (for the fsdp_ckpt tool) ----------------
namespace fsdp {

// One parameter as a checkpoint stores it.
struct CheckpointTensor {
  std::string name;  // state_dict name
  Shape shape;
  int64_t unit = -1;            // sharded: its unit k (/shards/<k>/...); consolidated: -1
  int64_t offset = 0;           // sharded: its first element in the unit's flat buffer
  std::vector<uint32_t> crc32;  // sharded: its /index/crc32 row (param, then meta.optimizer_states)
};

struct CheckpointContents {
  CheckpointMeta meta;
  std::vector<CheckpointTensor> tensors;   // sharded: index order; consolidated: /model in file order
  std::vector<int64_t> unit_padded_numel;  // sharded: each unit's flat buffer size; consolidated: empty
};

// Root attributes and parameter list of either format, from metadata and the index only (one
// process). Error with one line when the file is not a complete checkpoint or its index does
// not hold together.
CheckpointContents list_checkpoint(const std::string& path);

struct CheckpointVerifyReport {
  int64_t datasets = 0, bytes = 0;    // tensor datasets read, and their f32 bytes
  std::vector<std::string> problems;  // one line each (a CRC mismatch, a missing dataset); empty: intact
};

// Reads every tensor dataset in bounded chunks (never a whole tensor in memory) and compares
// the CRC-32 of its f32 little-endian bytes with its crc32 attribute; in sharded files also
// every parameter's and optimizer state's range of its unit with the index. One process. Error
// only when the file cannot be listed (list_checkpoint's errors).
CheckpointVerifyReport verify_checkpoint(const std::string& path);

}  // namespace fsdp
