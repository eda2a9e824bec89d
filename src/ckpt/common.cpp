// The ckpt building blocks: the process group of a save/load, CRC-32 pieces, flat-range
// selections, attributes and the root-attribute table.
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>

#include "ckpt/internal.h"
#include "comm/agree.h"
#include "tensor/error.h"

namespace fsdp::ckpt {

Group::Group(MPI_Comm comm) : comm_(comm) {
  if (comm_ == MPI_COMM_NULL) return;
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

void Group::agree(const std::string& error) const { agree_on_error(comm_, error).throw_if_failed(); }

void Group::barrier() const {
  if (parallel()) MPI_Barrier(comm_);
}

std::vector<PieceCrc> all_gather_pieces(const Group& g, const std::vector<PieceCrc>& mine) {
  if (!g.parallel()) return mine;
  const int bytes = static_cast<int>(mine.size() * sizeof(PieceCrc));
  std::vector<int> counts(g.size()), displs(g.size());
  MPI_Allgather(&bytes, 1, MPI_INT, counts.data(), 1, MPI_INT, g.comm());
  std::exclusive_scan(counts.begin(), counts.end(), displs.begin(), int64_t{0});  // wraps when refused below
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  if (total > INT32_MAX) throw Error("checkpoint: piece table too large to exchange");
  std::vector<PieceCrc> all(total / sizeof(PieceCrc));
  MPI_Allgatherv(mine.data(), bytes, MPI_BYTE, all.data(), counts.data(), displs.data(), MPI_BYTE, g.comm());
  return all;
}

uint32_t crc_append(uint32_t crc, const float* data, int64_t count) {
  // crc32_combine with a running CRC of 0 (nothing yet) gives the second CRC unchanged.
  return static_cast<uint32_t>(
      crc32_combine64(crc, crc32_floats(data, count), static_cast<z_off64_t>(count * sizeof(float))));
}

bool all_finite(const float* data, int64_t count) {
  // Summing x - x is 0 for finite x and NaN otherwise: one branch-free pass the compiler
  // vectorises, instead of an isfinite() test per element.
  float acc = 0.0f;
#pragma omp parallel for reduction(+ : acc) schedule(static) if (count > (1 << 16))
  for (int64_t i = 0; i < count; ++i) acc += data[i] - data[i];
  return acc == 0.0f;
}

uint32_t crc32_floats(const float* data, int64_t count) {
  // zlib's CRC runs at a few GB/s per core: chunks in parallel, then crc32_combine in order.
  constexpr int64_t kChunk = 1 << 20;  // floats
  const auto* bytes = reinterpret_cast<const Bytef*>(data);
  const int64_t chunks = (count + kChunk - 1) / kChunk;
  if (chunks <= 1) return static_cast<uint32_t>(crc32_z(0, bytes, static_cast<size_t>(count) * sizeof(float)));
  std::vector<uLong> crcs(chunks);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t n = std::min(kChunk, count - c * kChunk);
    crcs[c] = crc32_z(0, bytes + c * kChunk * sizeof(float), static_cast<size_t>(n) * sizeof(float));
  }
  uLong crc = crcs[0];
  for (int64_t c = 1; c < chunks; ++c) {
    int64_t n = std::min(kChunk, count - c * kChunk);
    crc = crc32_combine64(crc, crcs[c], static_cast<z_off64_t>(n * sizeof(float)));
  }
  return static_cast<uint32_t>(crc);
}

bool combine_crc(std::vector<PieceCrc> pieces, bool by_tensor, int64_t total, uint32_t* crc) {
  auto off = [by_tensor](const PieceCrc& p) { return by_tensor ? p.tensor_offset : p.dataset_offset; };
  std::sort(pieces.begin(), pieces.end(), [&](const PieceCrc& a, const PieceCrc& b) {
    return off(a) != off(b) ? off(a) < off(b) : a.count < b.count;
  });
  uLong c = 0;
  int64_t at = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const PieceCrc& p = pieces[i];
    if (p.count == 0) continue;
    if (i > 0 && off(p) == off(pieces[i - 1]) && p.count == pieces[i - 1].count) {
      if (p.crc != pieces[i - 1].crc) return false;  // two ranks read different bytes
      continue;
    }
    if (off(p) != at) return false;
    c = at == 0 ? p.crc : crc32_combine64(c, p.crc, static_cast<z_off64_t>(p.count * sizeof(float)));
    at += p.count;
  }
  if (at != total) return false;
  *crc = static_cast<uint32_t>(c);
  return true;
}

void select_flat_range(hid_t space, const std::vector<hsize_t>& dims, int64_t offset, int64_t count) {
  const size_t rank = dims.size();
  if (rank == 0) {  // a scalar
    H5Sselect_all(space);
    return;
  }
  std::vector<int64_t> stride(rank, 1);  // elements per step of dim d
  for (size_t d = rank - 1; d > 0; --d) stride[d - 1] = stride[d] * static_cast<int64_t>(dims[d]);
  H5Sselect_none(space);
  std::vector<hsize_t> start(rank), block(rank);
  int64_t p = offset;
  const int64_t end = offset + count;
  while (p < end) {
    // The outermost dim d at which p is aligned and a whole step still fits: take as many of
    // its steps as fit before `end` and before dim d wraps.
    size_t d = 0;
    while (d + 1 < rank && !(p % stride[d] == 0 && p + stride[d] <= end)) ++d;
    int64_t index_d = (p / stride[d]) % static_cast<int64_t>(dims[d]);
    int64_t steps = std::min((end - p) / stride[d], static_cast<int64_t>(dims[d]) - index_d);
    int64_t rest = p;
    for (size_t k = 0; k < rank; ++k) {
      start[k] = static_cast<hsize_t>(rest / stride[k]);
      rest %= stride[k];
      block[k] = k < d ? 1 : k == d ? static_cast<hsize_t>(steps) : dims[k];
    }
    H5Sselect_hyperslab(space, H5S_SELECT_OR, start.data(), nullptr, block.data(), nullptr);
    p += steps * stride[d];
  }
}

std::vector<hsize_t> dataset_dims(hid_t ds, const std::string& what) {
  H5Id space(H5Dget_space(ds), H5Sclose);
  int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0 || rank > kMaxDims) throw Error(what + " has no usable shape");
  std::vector<hsize_t> dims(rank);
  if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  // A damaged file may declare any dims (2^62 x 20): their product must fit what a tensor can be.
  hsize_t numel = 1;
  for (hsize_t d : dims) {
    if (d > static_cast<hsize_t>(kMaxNumel) || (d > 0 && numel > static_cast<hsize_t>(kMaxNumel) / d))
      throw Error(what + " has no usable shape (more than 2^40 elements)");
    numel *= d;
  }
  return dims;
}

bool stream_flat_range(hid_t ds, const std::vector<hsize_t>& dims, int64_t offset, int64_t count,
                       std::vector<float>& scratch, const std::function<void(int64_t, const float*, int64_t)>& fn) {
  constexpr int64_t kChunk = 1 << 20;  // floats: a bounded scratch for any tensor size
  H5Id space(H5Dget_space(ds), H5Sclose);
  for (int64_t at = offset; at < offset + count; at += kChunk) {
    const int64_t n = std::min(kChunk, offset + count - at);
    scratch.resize(n);
    select_flat_range(space.get(), dims, at, n);
    hsize_t mem_n = static_cast<hsize_t>(n);
    H5Id mem(H5Screate_simple(1, &mem_n, nullptr), H5Sclose);
    if (H5Dread(ds, H5T_NATIVE_FLOAT, mem.get(), space.get(), H5P_DEFAULT, scratch.data()) < 0) return false;
    fn(at, scratch.data(), n);
  }
  return true;
}

namespace {

H5Id string_type() {
  H5Id t(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(t.get(), H5T_VARIABLE);
  H5Tset_cset(t.get(), H5T_CSET_UTF8);
  return t;
}

void write_raw_attr(hid_t obj, const char* name, hid_t type, hid_t space, const void* data) {
  if (H5Aexists(obj, name) > 0) H5Adelete(obj, name);
  H5Id a(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!a.valid() || H5Awrite(a.get(), type, data) < 0) throw Error(std::string("cannot write attribute ") + name);
}

H5Id open_attr(hid_t obj, const char* name, const std::string& what) {
  if (H5Aexists(obj, name) <= 0) throw Error(what + ": attribute " + name + " is missing");
  H5Id a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (!a.valid()) throw Error(what + ": attribute " + name + " cannot be read");
  return a;
}

// The attribute's dataspace must hold exactly `n` elements (scalar = 1).
void expect_points(hid_t attr, hssize_t n, const char* name, const std::string& what) {
  H5Id space(H5Aget_space(attr), H5Sclose);
  if (H5Sget_simple_extent_npoints(space.get()) != n)
    throw Error(what + ": attribute " + name + " has the wrong number of elements");
}

template <class T>
T read_scalar(hid_t obj, const char* name, const std::string& what, H5T_class_t cls, hid_t mem_type) {
  H5Id a = open_attr(obj, name, what);
  H5Id type(H5Aget_type(a.get()), H5Tclose);
  if (H5Tget_class(type.get()) != cls)
    throw Error(what + ": attribute " + name + " is not " + (cls == H5T_INTEGER ? "an integer" : "a number"));
  expect_points(a.get(), 1, name, what);
  T v{};
  if (H5Aread(a.get(), mem_type, &v) < 0) throw Error(what + ": attribute " + name + " cannot be read");
  return v;
}

}  // namespace

void write_attr(hid_t obj, const char* name, int64_t value) {
  H5Id space(H5Screate(H5S_SCALAR), H5Sclose);
  write_raw_attr(obj, name, H5T_NATIVE_INT64, space.get(), &value);
}

void write_attr(hid_t obj, const char* name, double value) {
  H5Id space(H5Screate(H5S_SCALAR), H5Sclose);
  write_raw_attr(obj, name, H5T_NATIVE_DOUBLE, space.get(), &value);
}

void write_attr(hid_t obj, const char* name, const std::string& value) {
  H5Id space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Id type = string_type();
  const char* p = value.c_str();
  write_raw_attr(obj, name, type.get(), space.get(), &p);
}

void write_attr(hid_t obj, const char* name, const std::vector<std::string>& value) {
  hsize_t n = value.size();
  // An empty list is a null dataspace: HDF5 has no zero-length simple one in every version.
  H5Id space(n == 0 ? H5Screate(H5S_NULL) : H5Screate_simple(1, &n, nullptr), H5Sclose);
  H5Id type = string_type();
  std::vector<const char*> ptrs;
  ptrs.reserve(value.size());
  for (const auto& s : value) ptrs.push_back(s.c_str());
  const char* empty = nullptr;
  write_raw_attr(obj, name, type.get(), space.get(), ptrs.empty() ? static_cast<const void*>(&empty) : ptrs.data());
}

int64_t read_int_attr(hid_t obj, const char* name, const std::string& what) {
  return read_scalar<int64_t>(obj, name, what, H5T_INTEGER, H5T_NATIVE_INT64);
}

namespace {

std::vector<std::string> read_strings_attr(hid_t obj, const char* name, const std::string& what) {
  H5Id a = open_attr(obj, name, what);
  H5Id type(H5Aget_type(a.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_STRING || H5Tis_variable_str(type.get()) <= 0)
    throw Error(what + ": attribute " + name + " is not a string");
  H5Id space(H5Aget_space(a.get()), H5Sclose);
  hssize_t n = H5Sget_simple_extent_npoints(space.get());
  if (n < 0 || n > (1 << 20)) throw Error(what + ": attribute " + name + " has a bad size");
  std::vector<char*> ptrs(n, nullptr);
  H5Id mem = string_type();
  if (n > 0 && H5Aread(a.get(), mem.get(), ptrs.data()) < 0)
    throw Error(what + ": attribute " + name + " cannot be read");
  std::vector<std::string> out;
  for (char* p : ptrs) {
    out.emplace_back(p ? p : "");
    H5free_memory(p);
  }
  return out;
}

std::string read_string_attr(hid_t obj, const char* name, const std::string& what) {
  std::vector<std::string> v = read_strings_attr(obj, name, what);
  if (v.size() != 1) throw Error(what + ": attribute " + name + " is not a single string");
  return v[0];
}

// A root attribute holding one of E's names. "format" keeps the message it always had.
template <class E>
E read_enum_attr(hid_t file, const char* name, const std::string& what) {
  const std::string text = read_string_attr(file, name, what);
  if (const std::optional<E> e = parse_enum<E>(text)) return *e;
  if (std::string_view(name) == "format") throw Error(what + ": unknown format '" + text + "'");
  throw Error(what + ": attribute " + name + " is '" + text + "', not " + names_of(name_table(E{})));
}

// One call per root attribute but format_version, in file order: fn(name, member). The writer,
// the reader and meta_attribute_names walk the same list.
template <class Meta, class Fn>
void for_each_meta_field(Meta&& m, Fn fn) {
  fn("format", m.format);
  fn("step", m.step);
  fn("epoch", m.epoch);
  fn("step_in_epoch", m.step_in_epoch);
  fn("steps_per_epoch", m.steps_per_epoch);
  fn("world_size", m.world_size);
  fn("shard_group_size", m.shard_group_size);
  fn("global_batch_size", m.global_batch_size);
  fn("seed", m.seed);
  fn("strategy", m.strategy);
  fn("backend", m.backend);
  fn("wrap_policy", m.wrap_policy);
  fn("model_kind", m.model_kind);
  fn("optimizer", m.optimizer);
  fn("optimizer_states", m.optimizer_states);
  fn("optimizer_step", m.optimizer_step);
  fn("scheduler", m.scheduler);
  fn("lr", m.lr);
  fn("loss_scale", m.loss_scale);
  fn("loss_scale_good_steps", m.loss_scale_good_steps);
  fn("best_eval_loss", m.best_eval_loss);
  fn("config_yaml", m.config_yaml);
}

}  // namespace

void write_meta(hid_t file, const CheckpointMeta& meta) {
  // format_version first: a reader checks it before trusting anything else.
  write_attr(file, "format_version", meta.format_version);
  for_each_meta_field(meta, [&]<class T>(const char* name, const T& value) {
    if constexpr (std::is_enum_v<T>)
      write_attr(file, name, std::string(name_of(name_table(value), value)));  // by name, for any reader
    else
      write_attr(file, name, value);
  });
}

std::vector<std::string> meta_attribute_names() {
  std::vector<std::string> names = {"format_version"};
  for_each_meta_field(CheckpointMeta{}, [&](const char* name, const auto&) { names.emplace_back(name); });
  return names;
}

CheckpointMeta read_meta(hid_t file, const std::string& what) {
  CheckpointMeta m;
  if (H5Aexists(file, "format_version") <= 0)
    throw Error(what + ": not an fsdp-hpc checkpoint (no format_version attribute)");
  m.format_version = read_int_attr(file, "format_version", what);
  if (m.format_version != kCheckpointFormatVersion)
    throw Error(what + ": format_version " + std::to_string(m.format_version) + " is not supported (this build reads " +
                std::to_string(kCheckpointFormatVersion) + ")");
  for_each_meta_field(m, [&]<class T>(const char* name, T& value) {
    if constexpr (std::is_same_v<T, int64_t>)
      value = read_int_attr(file, name, what);
    else if constexpr (std::is_same_v<T, double>)
      value = read_scalar<double>(file, name, what, H5T_FLOAT, H5T_NATIVE_DOUBLE);
    else if constexpr (std::is_same_v<T, std::string>)
      value = read_string_attr(file, name, what);
    else if constexpr (std::is_enum_v<T>)
      value = read_enum_attr<T>(file, name, what);
    else
      value = read_strings_attr(file, name, what);
  });
  if (m.step < 0 || m.epoch < 0 || m.world_size < 1 || m.optimizer_step < 0)
    throw Error(what + ": negative step, epoch or world_size attribute");
  return m;
}

std::string consolidated_path(const std::string& name, int state, const std::vector<std::string>& state_names) {
  return state == 0 ? "/model/" + name : "/optim/" + name + "/" + state_names[state - 1];
}

std::string shard_path(int64_t unit, int state, const std::vector<std::string>& state_names) {
  std::string base = "/shards/" + std::to_string(unit);
  return state == 0 ? base + "/params" : base + "/optim/" + state_names[state - 1];
}

H5Id open_checkpoint_file(const std::string& path, const std::string& what) {
  if (access(path.c_str(), R_OK) != 0) throw Error(what + ": cannot read the file (" + std::strerror(errno) + ")");
  if (H5Fis_hdf5(path.c_str()) <= 0) throw Error(what + ": not an HDF5 file (or truncated)");
  H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) throw Error(what + ": cannot open as HDF5 (truncated or damaged?)");
  return file;
}

}  // namespace fsdp::ckpt
