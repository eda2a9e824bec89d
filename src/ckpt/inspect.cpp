// list_checkpoint and verify_checkpoint: a checkpoint's table of contents and a full CRC pass
// over it, one process, for the fsdp_ckpt tool. Loading needs neither: load_checkpoint checks
// what it reads itself.

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "ckpt/internal.h"
#include "tensor/error.h"

namespace fsdp {

using namespace ckpt;

namespace {

constexpr int64_t kMaxIndexEntries = 1 << 24;

bool is_dataset(hid_t loc, const std::string& path) {
  if (H5Lexists(loc, path.c_str(), H5P_DEFAULT) <= 0) return false;
  H5Id obj(H5Oopen(loc, path.c_str(), H5P_DEFAULT), H5Oclose);
  return obj.valid() && H5Iget_type(obj.get()) == H5I_DATASET;
}

class Lister {
 public:
  explicit Lister(const std::string& path) : what_("checkpoint " + path) {
    owned_ = open_checkpoint_file(path, what_);
    file_ = owned_.get();
    c_.meta = read_meta(file_, what_);
    if (c_.meta.format == CheckpointFormat::consolidated)
      list_consolidated();
    else
      list_sharded();
  }
  // The sharded index of a file the caller has open.
  Lister(hid_t file, const CheckpointMeta& meta, std::string what) : what_(std::move(what)), file_(file) {
    c_.meta = meta;
    list_sharded();
  }
  CheckpointContents take() { return std::move(c_); }

 private:
  // /model/<name> datasets, ordered as the file stores them (the saver creates them in the
  // model's parameter order, so their addresses follow it); those without an address by name.
  void list_consolidated() {
    if (H5Lexists(file_, "/model", H5P_DEFAULT) <= 0) throw Error(what_ + ": has no /model group");
    H5Id group(H5Gopen2(file_, "/model", H5P_DEFAULT), H5Gclose);
    if (!group.valid()) throw Error(what_ + ": /model is not a group");
    const std::vector<std::string> names = link_names(group.get());
    std::vector<std::pair<haddr_t, CheckpointTensor>> found;
    for (const std::string& name : names) {
      const std::string path = "/model/" + name;
      if (!is_dataset(file_, path)) throw Error(what_ + ": " + path + " is not a dataset");
      H5Id ds(H5Dopen2(file_, path.c_str(), H5P_DEFAULT), H5Dclose);
      H5Id type(H5Dget_type(ds.get()), H5Tclose);
      if (!ds.valid() || H5Tget_class(type.get()) != H5T_FLOAT)
        throw Error(what_ + ": " + path + " is not a floating-point dataset");
      std::vector<hsize_t> dims = dataset_dims(ds.get(), what_ + ": " + path);
      CheckpointTensor t;
      t.name = name;
      t.shape.assign(dims.begin(), dims.end());
      found.emplace_back(H5Dget_offset(ds.get()), std::move(t));
    }
    std::stable_sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& f : found) c_.tensors.push_back(std::move(f.second));
  }

  // The index's entries must be in the file before we make room for them: a damaged header can
  // declare 2^28 entries (2 GiB to allocate) that were never written. The saver writes every
  // index dataset whole and uncompressed.
  void check_stored(hid_t ds, const std::string& path, hssize_t n) {
    H5Id type(H5Dget_type(ds), H5Tclose);
    const hsize_t need = static_cast<hsize_t>(n) * H5Tget_size(type.get());
    if (n > 0 && H5Dget_storage_size(ds) < need)
      throw Error(what_ + ": " + path + " declares " + std::to_string(n) +
                  " entries but stores fewer (truncated or damaged?)");
  }

  template <class T>
  std::vector<T> read_index(const char* name, hid_t mem_type, int64_t expect) {
    const std::string path = std::string("/index/") + name;
    if (!is_dataset(file_, path)) throw Error(what_ + ": sharded index " + path + " is missing");
    H5Id ds(H5Dopen2(file_, path.c_str(), H5P_DEFAULT), H5Dclose);
    H5Id space(H5Dget_space(ds.get()), H5Sclose);
    hssize_t n = H5Sget_simple_extent_npoints(space.get());
    if (n < 0 || n > kMaxIndexEntries * 16 || (expect >= 0 && n != expect))
      throw Error(what_ + ": " + path + " has " + std::to_string(n) + " entries" +
                  (expect >= 0 ? ", expected " + std::to_string(expect) : ""));
    check_stored(ds.get(), path, n);
    std::vector<T> v(n);
    if (n > 0 && H5Dread(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
      throw Error(what_ + ": cannot read " + path + " (truncated or damaged?)");
    return v;
  }

  std::vector<std::string> read_names() {
    if (!is_dataset(file_, "/index/names")) throw Error(what_ + ": sharded index /index/names is missing");
    H5Id ds(H5Dopen2(file_, "/index/names", H5P_DEFAULT), H5Dclose);
    H5Id type(H5Dget_type(ds.get()), H5Tclose);
    H5Id space(H5Dget_space(ds.get()), H5Sclose);
    hssize_t n = H5Sget_simple_extent_npoints(space.get());
    size_t width = H5Tget_size(type.get());
    if (H5Tget_class(type.get()) != H5T_STRING || H5Tis_variable_str(type.get()) > 0 || width == 0 || width > 4096 ||
        n < 0 || n > kMaxIndexEntries)
      throw Error(what_ + ": /index/names is not a list of fixed-length strings");
    check_stored(ds.get(), "/index/names", n);
    std::vector<char> buf(static_cast<size_t>(n) * width);
    H5Id mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.get(), width);
    if (n > 0 && H5Dread(ds.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0)
      throw Error(what_ + ": cannot read /index/names (truncated or damaged?)");
    std::vector<std::string> names;
    for (hssize_t i = 0; i < n; ++i) names.emplace_back(buf.data() + i * width, strnlen(buf.data() + i * width, width));
    return names;
  }

  // The index, checked as load_checkpoint checks it: shapes agree with numel, every parameter
  // lies inside its unit, no name twice.
  void list_sharded() {
    const std::string bad = what_ + ": sharded index ";
    std::vector<std::string> names = read_names();
    const int64_t n = static_cast<int64_t>(names.size());
    auto unit = read_index<int64_t>("unit", H5T_NATIVE_INT64, n);
    auto offset = read_index<int64_t>("offset", H5T_NATIVE_INT64, n);
    auto numel = read_index<int64_t>("numel", H5T_NATIVE_INT64, n);
    auto ndim = read_index<int64_t>("ndim", H5T_NATIVE_INT64, n);
    c_.unit_padded_numel = read_index<int64_t>("unit_padded_numel", H5T_NATIVE_INT64, -1);
    const int64_t states = 1 + static_cast<int64_t>(c_.meta.optimizer_states.size());
    auto crc = read_index<uint32_t>("crc32", H5T_NATIVE_UINT32, n * states);
    int64_t total_dims = 0;
    for (int64_t d : ndim) {
      if (d < 0 || d > kMaxDims) throw Error(bad + "has a tensor with " + std::to_string(d) + " dimensions");
      total_dims += d;
    }
    auto dims = read_index<int64_t>("dims", H5T_NATIVE_INT64, std::max<int64_t>(1, total_dims));
    for (int64_t p : c_.unit_padded_numel)
      if (p < 0) throw Error(bad + "has a unit of negative size");
    std::set<std::string> seen;
    for (int64_t i = 0, at = 0; i < n; at += ndim[i], ++i) {
      if (!seen.insert(names[i]).second) throw Error(bad + "names " + names[i] + " twice");
      CheckpointTensor t;
      t.name = names[i];
      t.shape.assign(dims.begin() + at, dims.begin() + at + ndim[i]);
      int64_t count = 1;
      for (int64_t d : t.shape) {
        if (d < 0 || (d > 0 && count > (int64_t{1} << 40) / d)) throw Error(bad + "gives " + names[i] + " a bad shape");
        count *= d;
      }
      if (count != numel[i])
        throw Error(bad + "gives " + names[i] + " numel " + std::to_string(numel[i]) + " but shape " +
                    shape_str(t.shape));
      if (unit[i] < 0 || unit[i] >= static_cast<int64_t>(c_.unit_padded_numel.size()))
        throw Error(bad + "puts " + names[i] + " in unit " + std::to_string(unit[i]) + " of " +
                    std::to_string(c_.unit_padded_numel.size()));
      if (offset[i] < 0 || offset[i] > c_.unit_padded_numel[unit[i]] - numel[i])
        throw Error(bad + "puts " + names[i] + " at offset " + std::to_string(offset[i]) + ", outside its unit's " +
                    std::to_string(c_.unit_padded_numel[unit[i]]) + " elements");
      t.unit = unit[i];
      t.offset = offset[i];
      t.crc32.assign(crc.begin() + i * states, crc.begin() + (i + 1) * states);
      c_.tensors.push_back(std::move(t));
    }
  }

  std::string what_;
  H5Quiet quiet_;
  H5Id owned_;
  hid_t file_ = H5I_INVALID_HID;
  CheckpointContents c_;
};

std::string u32(uint32_t v) { return std::to_string(v); }

}  // namespace

CheckpointContents list_checkpoint(const std::string& path) { return Lister(path).take(); }

CheckpointContents ckpt::read_sharded_index(hid_t file, const CheckpointMeta& meta, const std::string& what) {
  return Lister(file, meta, what).take();
}

// Long (about 120 lines) on purpose: one pass over the file that checks every tensor against the
// index and its CRC in the order a reader meets them, so the whole contract reads in one place.
// NOLINTNEXTLINE(readability-function-size): the reason is above
CheckpointVerifyReport verify_checkpoint(const std::string& path) {
  CheckpointContents c = list_checkpoint(path);
  const std::string what = "checkpoint " + path;
  H5Quiet quiet;
  H5Id file = open_checkpoint_file(path, what);
  const std::vector<std::string>& states = c.meta.optimizer_states;
  const int n_states = 1 + static_cast<int>(states.size());
  const bool sharded = c.meta.format == CheckpointFormat::sharded;
  CheckpointVerifyReport report;

  // What the format promises: each dataset's path and shape, and (sharded) the tensors inside.
  struct Expected {
    Shape shape;
    int state = 0;
    std::vector<const CheckpointTensor*> tensors;
    bool seen = false;
  };
  std::map<std::string, Expected> expected;
  if (sharded) {
    for (size_t k = 0; k < c.unit_padded_numel.size(); ++k)
      for (int s = 0; s < n_states; ++s)
        expected[shard_path(static_cast<int64_t>(k), s, states)] = {{c.unit_padded_numel[k]}, s, {}, false};
    for (const CheckpointTensor& t : c.tensors)
      for (int s = 0; s < n_states; ++s) expected[shard_path(t.unit, s, states)].tensors.push_back(&t);
  } else {
    for (const CheckpointTensor& t : c.tensors)
      for (int s = 0; s < n_states; ++s) expected[consolidated_path(t.name, s, states)] = {t.shape, s, {}, false};
  }

  // Every dataset outside /index is a tensor dataset, expected or not.
  std::vector<std::string> paths;
  H5Lvisit(
      file.get(), H5_INDEX_NAME, H5_ITER_INC,
      [](hid_t root, const char* name, const H5L_info_t* info, void* out) -> herr_t {
        const std::string path = std::string("/") + name;
        if (info->type == H5L_TYPE_HARD && path.rfind("/index/", 0) != 0 && is_dataset(root, path))
          static_cast<std::vector<std::string>*>(out)->push_back(path);
        return 0;
      },
      &paths);

  std::vector<float> scratch;
  for (const std::string& p : paths) {
    H5Id ds(H5Dopen2(file.get(), p.c_str(), H5P_DEFAULT), H5Dclose);
    H5Id type(ds.valid() ? H5Dget_type(ds.get()) : H5I_INVALID_HID, H5Tclose);
    if (!ds.valid() || H5Tget_class(type.get()) != H5T_FLOAT) {
      report.problems.push_back(p + ": not a floating-point dataset");
      continue;
    }
    std::vector<hsize_t> dims;
    try {
      dims = dataset_dims(ds.get(), p);
    } catch (const Error& e) {
      report.problems.emplace_back(e.what());
      continue;
    }
    const Shape shape(dims.begin(), dims.end());
    // Read only what the file holds: a dataset declaring more than it stores (never written, or
    // a damaged header) would stream up to 2^40 fill values. fsdp-hpc stores tensors uncompressed.
    const hsize_t declared = static_cast<hsize_t>(shape_numel(shape)) * H5Tget_size(type.get());
    const hsize_t holds = H5Dget_storage_size(ds.get());
    if (holds < declared) {
      report.problems.push_back(p + ": stores " + std::to_string(holds) + " of its " + std::to_string(declared) +
                                " bytes (truncated, compressed or never written)");
      if (auto e = expected.find(p); e != expected.end()) e->second.seen = true;
      continue;
    }
    auto it = expected.find(p);
    Expected* exp = it == expected.end() ? nullptr : &it->second;
    if (exp) {
      exp->seen = true;
      if (shape != exp->shape) {
        report.problems.push_back(p + ": shape " + shape_str(shape) + ", expected " + shape_str(exp->shape));
        exp = nullptr;  // the index's ranges do not apply
      }
    }
    std::string attr_error;
    uint32_t stored = 0;
    try {
      int64_t v = read_int_attr(ds.get(), "crc32", p);
      if (v < 0 || v > UINT32_MAX) throw Error(p + ": crc32 attribute out of range");
      stored = static_cast<uint32_t>(v);
    } catch (const Error& e) {
      attr_error = e.what();
    }

    // One pass: the whole dataset's CRC and each indexed tensor's range of it.
    const std::vector<const CheckpointTensor*> none;
    const std::vector<const CheckpointTensor*>& tensors = exp ? exp->tensors : none;
    std::vector<uint32_t> tensor_crc(tensors.size(), 0);
    uint32_t crc = 0;
    const bool ok = stream_flat_range(
        ds.get(), dims, 0, shape_numel(shape), scratch, [&](int64_t at, const float* data, int64_t n) {
          crc = crc_append(crc, data, n);
          for (size_t i = 0; i < tensors.size(); ++i) {
            const int64_t lo = std::max(at, tensors[i]->offset);
            const int64_t hi = std::min(at + n, tensors[i]->offset + shape_numel(tensors[i]->shape));
            if (lo < hi) tensor_crc[i] = crc_append(tensor_crc[i], data + (lo - at), hi - lo);
          }
        });
    if (!ok) {
      report.problems.push_back(p + ": cannot read the data (truncated or damaged file?)");
      continue;
    }
    ++report.datasets;
    report.bytes += shape_numel(shape) * static_cast<int64_t>(sizeof(float));
    if (!attr_error.empty())
      report.problems.push_back(attr_error);
    else if (crc != stored)
      report.problems.push_back(p + ": crc32 mismatch (attribute " + u32(stored) + ", data " + u32(crc) + ")");
    for (size_t i = 0; i < tensors.size(); ++i) {
      const CheckpointTensor& t = *tensors[i];
      const uint32_t want = t.crc32[exp->state];
      if (tensor_crc[i] != want)
        report.problems.push_back(t.name + (exp->state ? " (" + states[exp->state - 1] + ")" : "") +
                                  ": crc32 mismatch in " + p + " [" + std::to_string(t.offset) + ", " +
                                  std::to_string(t.offset + shape_numel(t.shape)) + ") (index " + u32(want) +
                                  ", data " + u32(tensor_crc[i]) + ")");
    }
  }
  for (const auto& [p, e] : expected)
    if (!e.seen) report.problems.push_back(p + ": missing");
  return report;
}

}  // namespace fsdp
