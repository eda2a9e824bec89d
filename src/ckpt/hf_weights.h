#pragma once
// model.init_from in Hugging Face's form (a .safetensors file, or a model folder with
// model.safetensors or model.safetensors.index.json and its files): every rank reads only the
// element ranges of its own shards, as load_checkpoint does for HDF5.
#include <mpi.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "models/family.h"  // HfNames

namespace fsdp {

// How a model's parameter names meet the names in a Hugging Face file.
struct HfLoadStats {
  int64_t tensor_bytes = 0;     // the model's parameters as f32 (all ranks)
  uint64_t bytes_read = 0;      // file bytes this rank read: headers and its shards' ranges
  uint64_t max_bytes_read = 0;  // the most any rank read
  double seconds = 0.0;         // wall time, every rank done
};

// Collective over comm (MPI_COMM_NULL: alone). Fills the params buffer (state.buffers[0]) of
// every unit's held range, padding zeroed; the optimizer buffers are not touched. Each rank
// checks the file set on its own (every parameter present under its name or an alias, at its
// shape, in F32/BF16/F16; no tensor the model does not have), then the ranks agree: a bad file is
// one Error with one line naming the file, thrown on every rank.
HfLoadStats load_hf_weights(const std::string& path, const ShardedState& state, const HfNames& names, MPI_Comm comm);

}  // namespace fsdp
