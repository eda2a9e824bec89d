// load_hf_weights: each rank opens the safetensors files itself (POSIX, read-only), checks the
// whole header set against the model (headers are small: every rank sees the same verdict), then
// preads exactly the element ranges of its own shards, converting to f32. One agreement step
// decides for all, as in load_checkpoint: a damaged file never leaves a rank waiting.
#include "ckpt/hf_weights.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>

#include "ckpt/internal.h"
#include "ckpt/safetensors.h"
#include "tensor/error.h"

namespace fsdp {

namespace {

using Entry = SafetensorsReader::Entry;

// Where each parameter is read from, and the other names the file holds it under (tied aliases
// present beside it), whose values must be the same.
struct Source {
  const Entry* entry;
  std::vector<const Entry*> also;
};

// Each parameter's tensor in the file set, in ShardedState order; Error on a mismatch.
std::vector<Source> map_params(const SafetensorsReader& reader, const std::string& path, const ShardedState& st,
                               const HfNames& names) {
  std::vector<Source> sources;
  std::set<std::string> used;
  for (const UnitShard& u : st.units)
    for (const Param* p : u.layout->params) {
      const Entry* found = reader.find(p->name);
      std::vector<const Entry*> also;
      used.insert(p->name);
      const auto aliases = names.aliases.find(p->name);
      std::string tried = p->name;
      if (aliases != names.aliases.end())
        for (const std::string& alias : aliases->second) {
          tried += " or " + alias;
          const Entry* e = reader.find(alias);
          if (!e) continue;
          used.insert(alias);
          if (e->tensor->shape != p->shape)
            throw Error(reader.file_path(e->file) + ": tensor " + alias + " (an alias of " + p->name + ") has shape " +
                        shape_str(e->tensor->shape) + ", the model expects " + shape_str(p->shape));
          (void)safetensors_float_dtype(*e->tensor, reader.file_path(e->file));
          if (found)
            also.push_back(e);
          else
            found = e;
        }
      if (!found) throw Error(std::string(path).append(": missing tensor ").append(tried));
      const std::string& file = reader.file_path(found->file);
      if (found->tensor->shape != p->shape)
        throw Error(file + ": tensor " + found->tensor->name + " has shape " + shape_str(found->tensor->shape) +
                    ", the model expects " + shape_str(p->shape));
      (void)safetensors_float_dtype(*found->tensor, file);
      sources.push_back({found, std::move(also)});
    }
  for (const auto& [name, e] : reader.tensors())
    if (!used.contains(name) && !names.ignored.contains(name))
      throw Error(reader.file_path(e.file) + ": unexpected tensor " + name + " (not in this model)");
  return sources;
}

// Reads this rank's held range of every unit's params buffer; padding is zero. The same range of
// every alias present beside a parameter is read too and must hold the same values (a tied
// weight saved twice): transformers ties them silently, whatever the second copy holds.
void read_shards(SafetensorsReader& reader, const std::vector<Source>& sources, const ShardedState& st) {
  size_t param = 0;
  std::vector<float> copy;
  for (const UnitShard& u : st.units) {
    const int64_t h_begin = u.held_begin, h_end = u.held_begin + u.held_count;
    float* shard = st.buffers[0] + u.local_offset;
    for (size_t i = 0; i < u.layout->params.size(); ++i, ++param) {
      const int64_t p_begin = u.layout->offsets[i], p_end = p_begin + u.layout->params[i]->numel();
      const int64_t lo = std::max(p_begin, h_begin), hi = std::min(p_end, h_end);
      if (lo >= hi) continue;
      const Source& src = sources[param];
      float* values = shard + (lo - h_begin);
      reader.read_f32(*src.entry, lo - p_begin, hi - lo, values);
      for (const Entry* alias : src.also) {
        copy.resize(static_cast<size_t>(hi - lo));
        reader.read_f32(*alias, lo - p_begin, hi - lo, copy.data());
        for (int64_t k = 0; k < hi - lo; ++k)
          if (std::bit_cast<uint32_t>(copy[static_cast<size_t>(k)]) != std::bit_cast<uint32_t>(values[k]))
            throw Error(reader.file_path(alias->file) + ": tensor " + alias->tensor->name + " differs from " +
                        src.entry->tensor->name + ", which it aliases (tied), at element " +
                        std::to_string(lo - p_begin + k) + ": " + std::to_string(copy[static_cast<size_t>(k)]) +
                        " vs " + std::to_string(values[k]));
      }
    }
    const int64_t pad_lo = std::max(u.layout->numel, h_begin);
    if (pad_lo < h_end) std::memset(shard + (pad_lo - h_begin), 0, (h_end - pad_lo) * sizeof(float));
  }
}

}  // namespace

HfLoadStats load_hf_weights(const std::string& path, const ShardedState& st, const HfNames& names, MPI_Comm comm) {
  const auto t0 = std::chrono::steady_clock::now();
  const ckpt::Group g(comm);
  HfLoadStats stats;
  std::string error;
  try {
    SafetensorsReader reader(path);
    read_shards(reader, map_params(reader, path, st, names), st);
    stats.bytes_read = reader.bytes_read();
  } catch (const std::bad_alloc&) {
    error = path + ": out of memory while loading";
  } catch (const std::exception& e) {
    error = e.what();
  }
  g.agree(error);
  for (const UnitShard& u : st.units)
    for (const Param* p : u.layout->params) stats.tensor_bytes += p->numel() * static_cast<int64_t>(sizeof(float));
  stats.max_bytes_read = stats.bytes_read;
  if (g.parallel()) MPI_Allreduce(&stats.bytes_read, &stats.max_bytes_read, 1, MPI_UINT64_T, MPI_MAX, g.comm());
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

}  // namespace fsdp
