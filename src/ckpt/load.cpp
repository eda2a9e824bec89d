// load_checkpoint: each rank opens the file by itself (read-only), checks that it fits this
// model, and reads exactly the pieces of its own new shard, wherever the old layout put them:
// consolidated files by name and flat range of /model/<name>, sharded ones through the index
// into the old units' flat buffers. The per-piece CRCs of all ranks are then combined per tensor
// and compared with the stored ones, so every byte that was loaded has been checked.
//
// Reading by independent POSIX opens (HDF5's default driver) instead of one collective MPI-IO
// open keeps a damaged file from ever leaving ranks in a collective that some never reach: each
// rank fails or succeeds alone, and one agreement step decides for all.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <set>

#include "ckpt/internal.h"
#include "tensor/error.h"

namespace fsdp {

using namespace ckpt;

namespace {

// Where one (parameter, state) lives in the file.
struct TensorSource {
  hid_t dataset = H5I_INVALID_HID;
  std::vector<hsize_t> dims;  // the dataset's dims (selection space)
  int64_t base = 0;           // the tensor's first element in it
  uint32_t crc = 0;
};

class Reader {
 public:
  Reader(const std::string& path, const ShardedState& st, const LoadOptions& options)
      : what_("checkpoint " + path), st_(st), options_(options) {
    file_ = open_checkpoint_file(path, what_);
    meta_ = read_meta(file_.get(), what_);
    for (const UnitShard& u : st.units)
      for (Param* p : u.layout->params) params_.push_back(p);
    states_ = options.optimizer_state ? 1 + static_cast<int>(st.state_names.size()) : 1;
    if (options.optimizer_state) check_optimizer();
    sources_.resize(params_.size() * states_);
    if (meta_.format == CheckpointFormat::consolidated)
      map_consolidated();
    else
      map_sharded();
  }

  const CheckpointMeta& meta() const { return meta_; }
  const std::vector<Param*>& params() const { return params_; }  // in ShardedState order
  int states() const { return states_; }
  const TensorSource& source(size_t param, int state) const { return sources_[param * states_ + state]; }

  // Reads this rank's shard of every unit; returns the CRC of each piece read.
  std::vector<PieceCrc> read_shards() {
    std::vector<PieceCrc> pieces;
    size_t param_index = 0;
    for (const UnitShard& u : st_.units) {
      const int64_t h_begin = u.held_begin, h_end = u.held_begin + u.held_count;
      for (size_t i = 0; i < u.layout->params.size(); ++i, ++param_index) {
        const int64_t p_begin = u.layout->offsets[i], p_end = p_begin + u.layout->params[i]->numel();
        const int64_t lo = std::max(p_begin, h_begin), hi = std::min(p_end, h_end);
        if (lo >= hi) continue;
        for (int s = 0; s < states_; ++s) {
          float* dest = st_.buffers[s] + u.local_offset + (lo - h_begin);
          const TensorSource& src = source(param_index, s);
          read_range(src, lo - p_begin, hi - lo, dest, param_index, s);
          if (nonfinite_.empty() && !all_finite(dest, hi - lo)) nonfinite_ = tensor_name(param_index, s);
          pieces.push_back({static_cast<int64_t>(param_index * states_ + s), 0, lo - p_begin, 0, hi - lo,
                            crc32_floats(dest, hi - lo)});
        }
      }
      // Padding is zero in every layout (it never receives a gradient).
      const int64_t pad_lo = std::max(u.layout->numel, h_begin);
      for (int s = 0; s < states_ && pad_lo < h_end; ++s)
        std::memset(st_.buffers[s] + u.local_offset + (pad_lo - h_begin), 0, (h_end - pad_lo) * sizeof(float));
    }
    return pieces;
  }

  // The first tensor (in this rank's pieces) holding a NaN or an Inf; "" when none.
  const std::string& nonfinite() const { return nonfinite_; }

  std::string tensor_name(size_t param, int state) const {
    return state == 0 ? params_[param]->name : params_[param]->name + " (" + st_.state_names[state - 1] + ")";
  }

 private:
  void check_optimizer() {
    if (options_.optimizer && meta_.optimizer != *options_.optimizer)
      throw Error(what_ + ": written with optimizer " + std::string(enum_name(meta_.optimizer)) + ", this run uses " +
                  std::string(enum_name(*options_.optimizer)) + " (load weights only with model.init_from)");
    for (const std::string& s : st_.state_names)
      if (std::ranges::find(meta_.optimizer_states, s) == meta_.optimizer_states.end())
        throw Error(what_ + ": has no optimizer state '" + s + "'");
  }

  hid_t open_dataset(const std::string& path) {
    auto it = open_.find(path);
    if (it != open_.end()) return it->second.get();
    if (H5Lexists(file_.get(), path.c_str(), H5P_DEFAULT) <= 0) return H5I_INVALID_HID;
    H5Id ds(H5Dopen2(file_.get(), path.c_str(), H5P_DEFAULT), H5Dclose);
    if (!ds.valid()) throw Error(what_ + ": " + path + " is not a dataset");
    H5Id type(H5Dget_type(ds.get()), H5Tclose);
    if (H5Tget_class(type.get()) != H5T_FLOAT) throw Error(what_ + ": " + path + " is not a floating-point dataset");
    hid_t id = ds.get();
    open_.emplace(path, std::move(ds));
    return id;
  }

  uint32_t crc_attr(hid_t ds, const std::string& path) {
    int64_t v = read_int_attr(ds, "crc32", what_ + ": " + path);
    if (v < 0 || v > UINT32_MAX) throw Error(what_ + ": " + path + " has a bad crc32 attribute");
    return static_cast<uint32_t>(v);
  }

  void map_consolidated() {
    if (H5Lexists(file_.get(), "/model", H5P_DEFAULT) <= 0) throw Error(what_ + ": has no /model group");
    std::set<std::string> names;
    for (Param* p : params_) names.insert(p->name);
    H5Id group(H5Gopen2(file_.get(), "/model", H5P_DEFAULT), H5Gclose);
    if (!group.valid()) throw Error(what_ + ": /model is not a group");
    for (const std::string& n : link_names(group.get()))
      if (!names.contains(n)) throw Error(what_ + ": unexpected tensor /model/" + n + " (not in this model)");
    for (size_t i = 0; i < params_.size(); ++i)
      for (int s = 0; s < states_; ++s) {
        const std::string path = consolidated_path(params_[i]->name, s, st_.state_names);
        hid_t ds = open_dataset(path);
        if (ds < 0) throw Error(what_ + ": missing tensor " + path);
        std::vector<hsize_t> dims = dataset_dims(ds, what_ + ": " + path);
        const Shape shape(dims.begin(), dims.end());
        if (shape != params_[i]->shape)
          throw Error(what_ + ": " + path + " has shape " + shape_str(shape) + ", the model expects " +
                      shape_str(params_[i]->shape));
        sources_[i * states_ + s] = {ds, dims, 0, crc_attr(ds, path)};
      }
  }

  void map_sharded() {
    CheckpointContents index = read_sharded_index(file_.get(), meta_, what_);
    std::map<std::string, const CheckpointTensor*> by_name;
    for (const CheckpointTensor& t : index.tensors) by_name.emplace(t.name, &t);
    std::set<std::string> model_names;
    for (Param* p : params_) model_names.insert(p->name);
    for (const CheckpointTensor& t : index.tensors)
      if (!model_names.contains(t.name)) throw Error(what_ + ": unexpected tensor " + t.name + " (not in this model)");
    for (size_t i = 0; i < params_.size(); ++i) {
      auto it = by_name.find(params_[i]->name);
      if (it == by_name.end()) throw Error(what_ + ": missing tensor " + params_[i]->name);
      const CheckpointTensor& t = *it->second;
      if (t.shape != params_[i]->shape)
        throw Error(what_ + ": " + t.name + " has shape " + shape_str(t.shape) + ", the model expects " +
                    shape_str(params_[i]->shape));
      const int64_t padded = index.unit_padded_numel[t.unit];
      for (int s = 0; s < states_; ++s) {
        int file_state = 0;  // the file's column for this run's state s (check_optimizer found it)
        if (s > 0)
          for (size_t f = 0; f < meta_.optimizer_states.size(); ++f)
            if (meta_.optimizer_states[f] == st_.state_names[s - 1]) file_state = static_cast<int>(f) + 1;
        const std::string path = shard_path(t.unit, file_state, meta_.optimizer_states);
        hid_t ds = open_dataset(path);
        if (ds < 0) throw Error(what_ + ": missing dataset " + path);
        std::vector<hsize_t> ddims = dataset_dims(ds, what_ + ": " + path);
        if (ddims.size() != 1 || static_cast<int64_t>(ddims[0]) != padded)
          throw Error(what_ + ": " + path + " has shape " + shape_str(Shape(ddims.begin(), ddims.end())) +
                      ", the index says (" + std::to_string(padded) + ")");
        sources_[i * states_ + s] = {ds, ddims, t.offset, t.crc32[file_state]};
      }
    }
  }

  void read_range(const TensorSource& src, int64_t offset, int64_t count, float* dest, size_t param, int state) {
    H5Id space(H5Dget_space(src.dataset), H5Sclose);
    select_flat_range(space.get(), src.dims, src.base + offset, count);
    hsize_t n = static_cast<hsize_t>(count);
    H5Id mem(H5Screate_simple(1, &n, nullptr), H5Sclose);
    if (H5Dread(src.dataset, H5T_NATIVE_FLOAT, mem.get(), space.get(), H5P_DEFAULT, dest) < 0)
      throw Error(what_ + ": cannot read " + tensor_name(param, state) + " (truncated or damaged file?)");
  }

  std::string what_;
  const ShardedState& st_;
  LoadOptions options_;
  H5Quiet quiet_;
  H5Id file_;
  CheckpointMeta meta_;
  std::vector<Param*> params_;
  int states_ = 1;
  std::vector<TensorSource> sources_;  // (param, state)
  std::string nonfinite_;
  std::map<std::string, H5Id> open_;
};

}  // namespace

CheckpointMeta load_checkpoint(const std::string& path, const ShardedState& st, const LoadOptions& options,
                               MPI_Comm comm, CheckpointStats* stats) {
  const auto t0 = std::chrono::steady_clock::now();
  Group g(comm);
  std::string error;
  std::unique_ptr<Reader> reader;
  std::vector<PieceCrc> pieces;
  try {
    reader = std::make_unique<Reader>(path, st, options);
    pieces = reader->read_shards();
  } catch (const std::bad_alloc&) {
    error = "checkpoint " + path + ": out of memory while loading";
  } catch (const std::exception& e) {
    error = e.what();
  }
  g.agree(error);

  // Every tensor's pieces, from all ranks, tile it: their combined CRC must be the stored one.
  const std::vector<PieceCrc> all = all_gather_pieces(g, pieces);
  const int states = reader->states();
  const std::vector<Param*>& params = reader->params();
  std::vector<std::vector<PieceCrc>> by_tensor(params.size() * states);
  for (const PieceCrc& p : all) by_tensor[p.tensor].push_back(p);
  int64_t bytes = 0;
  for (size_t param = 0; param < params.size(); ++param)
    for (int s = 0; s < states; ++s) {
      const int64_t numel = params[param]->numel();
      bytes += numel * static_cast<int64_t>(sizeof(float));
      uint32_t crc = 0;
      if (!combine_crc(by_tensor[param * states + s], true, numel, &crc))
        throw Error("checkpoint " + path + ": the ranks did not read all of " + reader->tensor_name(param, s));
      if (crc != reader->source(param, s).crc)
        throw Error("checkpoint " + path + ": " + reader->tensor_name(param, s) +
                    " fails its crc32 check (the file is damaged)");
    }
  // Sound bytes, diverged values: the caller decides (resume: auto tries an older file).
  try {
    g.agree(reader->nonfinite().empty() ? ""
                                        : "checkpoint " + path + ": " + reader->nonfinite() +
                                              " holds non-finite values (NaN or Inf; the run that wrote it diverged)");
  } catch (const Error& e) {
    throw NonFiniteCheckpoint(e.what());
  }
  if (stats) {
    stats->bytes = bytes;
    stats->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return reader->meta();
}

}  // namespace fsdp
