#pragma once
// fsdp_ckpt's commands as library calls; apps/fsdp_ckpt.cpp is only their command line and the
// ranks' agreements on errors.
//   print_checkpoint    inspect: the file's summary, root attributes, datasets, sharded index
//   CheckpointSlice     consolidate, reshard and export-hf: rank r of k holds 1/k of every unit,
//                       so no rank ever holds the whole state
//   HfExport            export-hf: a Hugging Face folder (config.json, model.safetensors or
//                       its shards with their index)
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/safetensors.h"
#include "config/config.h"
#include "models/model.h"
#include "nn/module.h"
#include "tensor/dtype.h"

namespace fsdp {

// Prints to stdout what `fsdp_ckpt inspect` shows: one summary line, the root attributes, every
// dataset with shape, dtype, bytes and crc32, and a sharded file's index. Throws Error (after
// printing what it could) when the file is a damaged checkpoint or not HDF5.
void print_checkpoint(const std::string& path);

// This rank's slice of a checkpoint's state: one FSDP unit per input unit (sharded) or per
// parameter (consolidated), each split over the k ranks in contiguous ranges. The parameters are
// names and shapes only: the loader maps by name.
struct CheckpointSlice {
  CheckpointContents contents;
  std::deque<Param> params;
  std::deque<FlatLayout> layouts;
  std::vector<std::vector<float>> buffers;
  ShardedState state;  // load_checkpoint fills it, save_checkpoint writes it
};
// with_optimizer false: the parameters only (export-hf). Error when `in` is not a checkpoint.
std::unique_ptr<CheckpointSlice> slice_checkpoint(const std::string& in, int rank, int size,
                                                  bool with_optimizer = true);

// Error unless `out` may be written by a conversion of `in` (not the input, replaced only with
// force, in an existing writable folder).
void check_convert_output(const std::string& in, const std::string& out, bool force);

// export-hf in phases, each run on every rank; the caller agrees on each phase's errors.
// export-hf's options.
struct HfExportOptions {
  DType dtype = DType::f32;  // of the safetensors data
  bool force = false;        // replace an existing folder's files
  // A new file starts when the next tensor would take the current one past this (transformers'
  // save_pretrained rule, max_shard_size, default "5GB"); one file: model.safetensors, more:
  // model-0000K-of-0000N.safetensors and model.safetensors.index.json.
  uint64_t max_shard_bytes = 5'000'000'000;
};

// "5GB" (10^9), "500MiB" (2^20), "64KB", "123" (bytes), as transformers'
// convert_file_size_to_int reads max_shard_size; Error naming the text otherwise.
uint64_t parse_shard_size(const std::string& text);

class HfExport {
 public:
  // This rank's slice of the parameters of checkpoint `in`, checked against the model its
  // config_yaml names (every tensor there, none more, the same shapes); dir checked (exists as a
  // folder or can be made; its files replaced only with force). make_model builds that model
  // (names and shapes are what is read of it): train/model_from_config.h's, passed in because
  // models are built a layer above checkpoints.
  using ModelMaker = std::function<std::unique_ptr<Model>(const ModelConfig&)>;
  HfExport(const std::string& in, const std::string& dir, const HfExportOptions& options, int rank, int size,
           const ModelMaker& make_model);
  void create_file();                   // rank 0, before the others open them: the folder, headers, sizes
  CheckpointStats load(MPI_Comm comm);  // load_checkpoint's agreed errors
  void write_slice(bool created_here);  // every rank: its pieces into the files, then fsync
  void finish();                        // rank 0: the files under their names, the index, config.json
  void remove_partial() const;          // rank 0 after a failure: best effort
  const CheckpointSlice& slice() const { return *slice_; }
  uint64_t file_bytes() const;  // all files
  size_t file_count() const { return files_.size(); }

 private:
  struct File {
    std::string path, tmp;
    std::unique_ptr<SafetensorsWriter> writer;
  };
  struct Place {
    size_t file, index;  // the file, and the tensor's place among its specs
  };
  std::string in_, dir_;
  std::unique_ptr<CheckpointSlice> slice_;
  std::vector<File> files_;
  std::map<std::string, Place> place_of_;  // name -> where it is written
  std::string config_json_, index_json_;   // index: "" for one file
};

}  // namespace fsdp
