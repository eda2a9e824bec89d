// save_checkpoint: every rank writes the pieces of its own shard into one HDF5 file through
// MPI-IO, then the file is checked, made durable and renamed into place.
//
//   plan      the datasets (same list on every rank) and this rank's pieces of them
//   create    the file and every dataset (collective: HDF5 metadata is identical everywhere)
//   write     each rank's pieces (collective or independent transfers)
//   checksum  per-piece CRC-32s exchanged, combined per dataset and per tensor, written as
//             attributes (and the sharded index), then the root attributes
//   verify    each rank reads its pieces back from the closed file and compares CRCs
//   commit    fsync, rename path.tmp -> path, fsync the folder
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "ckpt/internal.h"
#include "tensor/error.h"

namespace fsdp {

using namespace ckpt;

namespace {

struct DatasetSpec {
  std::string path;
  std::vector<hsize_t> dims;
  int64_t numel = 0;
};

// One contiguous write of this rank into one dataset (at most one per dataset).
struct WriteOp {
  int64_t dataset = 0, offset = 0, count = 0;
  const float* data = nullptr;
};

struct SavePlan {
  std::vector<DatasetSpec> datasets;
  std::vector<TensorRef> tensors;  // (param, state) in unit, layout, state order
  std::vector<WriteOp> writes;     // this rank's
  std::vector<PieceCrc> pieces;    // this rank's, tensor pieces and (sharded) padding pieces
  std::vector<const float*> piece_data;
};

SavePlan make_plan(const ShardedState& st, CheckpointFormat format) {
  SavePlan plan;
  const int states = 1 + static_cast<int>(st.state_names.size());
  const bool sharded = format == CheckpointFormat::sharded;
  for (size_t k = 0; k < st.units.size(); ++k) {
    const UnitShard& u = st.units[k];
    const int64_t w_begin = u.write_begin, w_end = u.write_begin + u.write_count;
    const int64_t first_dataset = static_cast<int64_t>(plan.datasets.size());
    auto local = [&](int s, int64_t flat) { return st.buffers[s] + u.local_offset + (flat - u.held_begin); };
    if (sharded) {
      for (int s = 0; s < states; ++s) {
        plan.datasets.push_back({shard_path(static_cast<int64_t>(k), s, st.state_names),
                                 {static_cast<hsize_t>(u.padded_numel)},
                                 u.padded_numel});
        if (u.write_count > 0) plan.writes.push_back({first_dataset + s, w_begin, u.write_count, local(s, w_begin)});
      }
    }
    for (size_t i = 0; i < u.layout->params.size(); ++i) {
      const Param* p = u.layout->params[i];
      const int64_t p_begin = u.layout->offsets[i], p_end = p_begin + p->numel();
      const int64_t lo = std::max(p_begin, w_begin), hi = std::min(p_end, w_end);
      for (int s = 0; s < states; ++s) {
        const int64_t tensor = static_cast<int64_t>(plan.tensors.size());
        plan.tensors.push_back({p->name, s, p->shape});
        int64_t dataset = first_dataset + s;
        if (!sharded) {
          dataset = static_cast<int64_t>(plan.datasets.size());
          plan.datasets.push_back(
              {consolidated_path(p->name, s, st.state_names), {p->shape.begin(), p->shape.end()}, p->numel()});
        }
        if (lo >= hi) continue;
        PieceCrc piece{tensor, dataset, lo - p_begin, sharded ? lo : lo - p_begin, hi - lo, 0};
        plan.pieces.push_back(piece);
        plan.piece_data.push_back(local(s, lo));
        if (!sharded) plan.writes.push_back({dataset, piece.dataset_offset, piece.count, local(s, lo)});
      }
    }
    // Sharded files keep the padding too: the flat buffers are stored exactly as held.
    const int64_t pad_lo = std::max(u.layout->numel, w_begin);
    if (sharded && pad_lo < w_end)
      for (int s = 0; s < states; ++s) {
        plan.pieces.push_back({-1, first_dataset + s, 0, pad_lo, w_end - pad_lo, 0});
        plan.piece_data.push_back(local(s, pad_lo));
      }
  }
  return plan;
}

H5Id make_fapl(const Group& g) {
  H5Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (g.parallel()) {
    H5Pset_fapl_mpio(fapl.get(), g.comm(), MPI_INFO_NULL);
    // Metadata is flushed by all ranks together (at close, which every rank reaches). Metadata
    // reads stay independent: a collective read would leave ranks waiting on one that failed
    // between two of them.
    H5Pset_coll_metadata_write(fapl.get(), true);
  }
  // Page-aligned tensor data: large contiguous writes map onto whole file-system blocks.
  H5Pset_alignment(fapl.get(), 16384, 4096);
  return fapl;
}

void fsync_path(const std::string& path, bool directory) {
  int fd = open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw Error("cannot open " + path + " to sync it (" + std::strerror(errno) + ")");
  int rc = fsync(fd);
  int err = errno;
  close(fd);
  if (rc != 0) throw Error("fsync " + path + " failed (" + std::strerror(err) + ")");
}

// Why a write of `bytes` into `file` through HDF5 and MPI-IO failed, for the error message.
// Neither library passes the system error up. A full file system (the common cause) is
// recognised by its free space, since errno is not reliable: the failed write(2) leaves ENOSPC
// there only sometimes (the MPI-IO layer's error path may reset it). Otherwise errno, when the
// call left one (callers clear it first).
std::string io_reason(int err, const std::string& file, int64_t bytes) {
  struct statvfs fs {};
  const std::filesystem::path dir = std::filesystem::path(file).parent_path();
  if (statvfs(dir.empty() ? "." : dir.c_str(), &fs) == 0 &&
      static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize) < std::max<int64_t>(bytes, 1))
    return std::strerror(ENOSPC);  // "No space left on device"
  return err != 0 ? std::strerror(err) : "an I/O error";
}

// Every piece this rank wrote, read back from the closed file by this process alone.
std::string verify_pieces(const std::string& tmp, const SavePlan& plan) {
  if (plan.pieces.empty()) return "";
  H5Quiet quiet;
  H5Id file(H5Fopen(tmp.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) return "cannot reopen " + tmp + " to verify it";
  std::vector<float> scratch;
  for (const PieceCrc& p : plan.pieces) {
    const DatasetSpec& spec = plan.datasets[p.dataset];
    H5Id ds(H5Dopen2(file.get(), spec.path.c_str(), H5P_DEFAULT), H5Dclose);
    if (!ds.valid()) return "verify: " + spec.path + " is missing in " + tmp;
    uint32_t crc = 0;
    if (!stream_flat_range(ds.get(), spec.dims, p.dataset_offset, p.count, scratch,
                           [&](int64_t, const float* data, int64_t n) { crc = crc_append(crc, data, n); }))
      return "verify: cannot read back " + spec.path + " from " + tmp;
    if (crc != p.crc) return "verify: " + spec.path + " reads back different bytes from " + tmp + " than were written";
  }
  return "";
}

// The sharded format's index: per parameter its unit, offset, numel, shape and CRCs.
struct IndexTables {
  std::vector<std::string> names;
  std::vector<int64_t> unit, offset, numel, ndim, dims, padded;
  std::vector<uint32_t> crc;  // (params, 1 + states)
};

IndexTables make_index(const ShardedState& st) {
  IndexTables t;
  for (size_t k = 0; k < st.units.size(); ++k) {
    const UnitShard& u = st.units[k];
    t.padded.push_back(u.padded_numel);
    for (size_t i = 0; i < u.layout->params.size(); ++i) {
      const Param* p = u.layout->params[i];
      t.names.push_back(p->name);
      t.unit.push_back(static_cast<int64_t>(k));
      t.offset.push_back(u.layout->offsets[i]);
      t.numel.push_back(p->numel());
      t.ndim.push_back(static_cast<int64_t>(p->shape.size()));
      t.dims.insert(t.dims.end(), p->shape.begin(), p->shape.end());
    }
  }
  return t;
}

// Creates the index datasets (collective); only rank 0 writes their (small) contents.
void write_index(hid_t file, const IndexTables& t, bool writer, hid_t lcpl) {
  H5Id xfer(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  auto make = [&](const char* name, hid_t file_type, hid_t mem_type, std::vector<hsize_t> dims, const void* data) {
    H5Id space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
    H5Id ds(H5Dcreate2(file, name, file_type, space.get(), lcpl, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
    if (!ds.valid()) throw Error(std::string("cannot create ") + name);
    if (!writer) H5Sselect_none(space.get());
    if (H5Dwrite(ds.get(), mem_type, writer ? H5S_ALL : space.get(), space.get(), xfer.get(), data) < 0)
      throw Error(std::string("cannot write ") + name);
  };
  const hsize_t n = t.names.size();
  size_t width = 1;
  for (const auto& s : t.names) width = std::max(width, s.size() + 1);
  std::vector<char> names(n * width, '\0');
  for (size_t i = 0; i < n; ++i) std::memcpy(names.data() + i * width, t.names[i].data(), t.names[i].size());
  H5Id str(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(str.get(), width);
  H5Tset_strpad(str.get(), H5T_STR_NULLTERM);
  make("/index/names", str.get(), str.get(), {n}, names.data());
  make("/index/unit", H5T_STD_I64LE, H5T_NATIVE_INT64, {n}, t.unit.data());
  make("/index/offset", H5T_STD_I64LE, H5T_NATIVE_INT64, {n}, t.offset.data());
  make("/index/numel", H5T_STD_I64LE, H5T_NATIVE_INT64, {n}, t.numel.data());
  make("/index/ndim", H5T_STD_I64LE, H5T_NATIVE_INT64, {n}, t.ndim.data());
  int64_t dummy = 0;
  // A model of scalars only would have no dims at all; keep the dataset non-empty.
  make("/index/dims", H5T_STD_I64LE, H5T_NATIVE_INT64, {std::max<hsize_t>(1, t.dims.size())},
       t.dims.empty() ? &dummy : t.dims.data());
  make("/index/crc32", H5T_STD_U32LE, H5T_NATIVE_UINT32, {n, t.crc.size() / std::max<hsize_t>(1, n)}, t.crc.data());
  make("/index/unit_padded_numel", H5T_STD_I64LE, H5T_NATIVE_INT64, {t.padded.size()}, t.padded.data());
}

}  // namespace

// Long (about 170 lines) on purpose: a collective protocol (create, write, agree, read back,
// checksum, fsync, rename) whose every step every rank takes in the same order; split into
// functions, the agreement points that keep a failing rank from stranding the others would be
// scattered across them.
// NOLINTNEXTLINE(readability-function-size): the reason is above
CheckpointStats save_checkpoint(const std::string& path, const ShardedState& st, const CheckpointMeta& meta_in,
                                const SaveOptions& options, MPI_Comm comm) {
  const auto t0 = std::chrono::steady_clock::now();
  Group g(comm);
  const bool sharded = options.format == CheckpointFormat::sharded;
  CheckpointMeta meta = meta_in;
  meta.format = options.format;
  meta.optimizer_states = st.state_names;
  const std::string tmp = path + ".tmp";
  const int states = 1 + static_cast<int>(st.state_names.size());

  SavePlan plan = make_plan(st, options.format);
  std::string nonfinite;  // the first of this rank's tensors holding a NaN or an Inf
  for (size_t i = 0; i < plan.pieces.size(); ++i) {
    plan.pieces[i].crc = crc32_floats(plan.piece_data[i], plan.pieces[i].count);
    const int64_t t = plan.pieces[i].tensor;
    if (nonfinite.empty() && t >= 0 && !all_finite(plan.piece_data[i], plan.pieces[i].count)) {
      const TensorRef& ref = plan.tensors[t];
      nonfinite = ref.name + (ref.state == 0 ? "" : " (" + st.state_names[ref.state - 1] + ")");
    }
  }
  // A diverged state is never written: it would count towards checkpoint.keep and push out the
  // good files. Decided before the file exists, on every rank alike.
  try {
    g.agree(nonfinite.empty()
                ? ""
                : "checkpoint: " + nonfinite + " holds non-finite values (NaN or Inf); " + path + " not written");
  } catch (const Error& e) {
    throw NonFiniteCheckpoint(e.what());
  }

  H5Quiet quiet;
  // create: a failure here (folder missing, not writable) is the same on every rank.
  H5Id fapl = make_fapl(g);
  H5Id file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
  g.agree(file.valid() ? "" : "checkpoint: cannot create " + tmp + " (is checkpoint.dir writable?)");
  std::string error;
  std::vector<H5Id> datasets;
  // Every rank takes part (agree() is collective); on any rank's error the partial file goes.
  auto agree_or_discard = [&](const std::string& e) {
    try {
      g.agree(e);
    } catch (...) {
      datasets.clear();
      file.reset();
      if (g.rank() == 0) (void)std::remove(tmp.c_str());  // best effort: we are failing already
      // The caller aborts the job on this error (MPI_Abort kills every rank at once): without
      // this barrier a fast rank's abort can kill rank 0 before it removed the partial file.
      g.barrier();
      throw;
    }
  };
  H5Id lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  H5Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS);
  H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY);
  H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);  // every byte is written once, by its owner
  datasets.reserve(plan.datasets.size());
  for (const DatasetSpec& d : plan.datasets) {
    H5Id space(H5Screate_simple(static_cast<int>(d.dims.size()), d.dims.data(), nullptr), H5Sclose);
    datasets.emplace_back(
        H5Dcreate2(file.get(), d.path.c_str(), H5T_IEEE_F32LE, space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
        H5Dclose);
    if (!datasets.back().valid()) {
      error = "checkpoint: cannot create " + d.path + " in " + tmp;
      break;
    }
  }
  agree_or_discard(error);

  // write: every rank visits every dataset in the same order (collective transfers need it).
  H5Id xfer(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  if (g.parallel()) H5Pset_dxpl_mpio(xfer.get(), options.collective ? H5FD_MPIO_COLLECTIVE : H5FD_MPIO_INDEPENDENT);
  std::vector<const WriteOp*> op_of(plan.datasets.size(), nullptr);
  for (const WriteOp& w : plan.writes) op_of[w.dataset] = &w;
  for (size_t d = 0; d < plan.datasets.size(); ++d) {
    const WriteOp* w = op_of[d];
    if (!w && !(g.parallel() && options.collective)) continue;
    if (plan.datasets[d].numel == 0) continue;  // an empty unit (a root that wraps nothing): nothing to transfer
    H5Id fspace(H5Dget_space(datasets[d].get()), H5Sclose);
    hsize_t n = w ? static_cast<hsize_t>(w->count) : 1;
    H5Id mspace(H5Screate_simple(1, &n, nullptr), H5Sclose);
    if (w) {
      select_flat_range(fspace.get(), plan.datasets[d].dims, w->offset, w->count);
    } else {
      H5Sselect_none(fspace.get());
      H5Sselect_none(mspace.get());
    }
    static const float kNothing = 0.0f;
    errno = 0;
    if (H5Dwrite(datasets[d].get(), H5T_NATIVE_FLOAT, mspace.get(), fspace.get(), xfer.get(), w ? w->data : &kNothing) <
            0 &&
        error.empty())
      error = "checkpoint: cannot write " + plan.datasets[d].path + " to " + tmp + " (" +
              io_reason(errno, tmp, w ? w->count * static_cast<int64_t>(sizeof(float)) : 0) + ")";
  }
  if (options.after_pieces_written) options.after_pieces_written();
  agree_or_discard(error);

  // checksum: every rank ends up with every piece's CRC and computes the same attributes.
  const std::vector<PieceCrc> all = all_gather_pieces(g, plan.pieces);
  std::vector<std::vector<PieceCrc>> by_dataset(plan.datasets.size()), by_tensor(plan.tensors.size());
  for (const PieceCrc& p : all) {
    by_dataset[p.dataset].push_back(p);
    if (p.tensor >= 0) by_tensor[p.tensor].push_back(p);
  }
  CheckpointStats stats;
  try {
    for (size_t d = 0; d < plan.datasets.size(); ++d) {
      const int64_t numel = plan.datasets[d].numel;
      stats.bytes += numel * static_cast<int64_t>(sizeof(float));
      uint32_t crc = 0;
      if (!combine_crc(by_dataset[d], false, numel, &crc))
        throw Error("checkpoint: the ranks' pieces do not cover " + plan.datasets[d].path);
      write_attr(datasets[d].get(), "crc32", static_cast<int64_t>(crc));
    }
    if (sharded) {
      IndexTables index = make_index(st);
      for (size_t t = 0; t < plan.tensors.size(); ++t) {
        uint32_t crc = 0;
        if (!combine_crc(by_tensor[t], true, shape_numel(plan.tensors[t].shape), &crc))
          throw Error("checkpoint: the ranks' pieces do not cover " + plan.tensors[t].name);
        index.crc.push_back(crc);
      }
      if (plan.tensors.empty()) index.crc.assign(states, 0);
      write_index(file.get(), index, g.rank() == 0, lcpl.get());
    }
    write_meta(file.get(), meta);
  } catch (const Error& e) {
    error = e.what();
  }
  datasets.clear();
  // Closing flushes everything still buffered: its failure is a failed save.
  errno = 0;
  if (H5Fclose(file.release()) < 0 && error.empty())
    error = "checkpoint: cannot close " + tmp + " (" + io_reason(errno, tmp, 0) + ")";
  agree_or_discard(error);

  // verify, then commit.
  error = verify_pieces(tmp, plan);
  if (error.empty() && g.rank() == 0) {
    try {
      H5Id f = open_checkpoint_file(tmp, "checkpoint " + tmp);
      read_meta(f.get(), "checkpoint " + tmp);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  agree_or_discard(error);
  if (g.rank() == 0) {
    try {
      fsync_path(tmp, false);
      if (std::rename(tmp.c_str(), path.c_str()) != 0)
        throw Error("checkpoint: cannot rename " + tmp + " to " + path + " (" + std::strerror(errno) + ")");
      std::filesystem::path dir = std::filesystem::path(path).parent_path();
      fsync_path(dir.empty() ? "." : dir.string(), true);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  g.agree(error);
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

}  // namespace fsdp
