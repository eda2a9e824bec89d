// Fuzz target, structure-aware: the fuzzer's bytes are a list of edits applied with the HDF5 C
// API to a valid checkpoint (ToyState saved by save_checkpoint, consolidated or sharded), then
// every checkpoint reader runs on the result (read_checkpoint_every_way). Edits: root and crc32
// attributes replaced by other values, types and sizes or deleted; datasets replaced with other
// dims (up to 2^40 elements declared, never written), dtypes and layouts; /index entries
// rewritten, resized or retyped; tensor data changed with or without a matching crc32; groups
// and datasets deleted, swapped for each other, duplicated by hard links, soft/external links.
// Input: byte 0 picks the base format and the reader options, then edits of one opcode byte
// and its arguments until the input runs out (at most 12).
#include <zlib.h>

#include <cmath>
#include <limits>

#include "ckpt/internal.h"
#include "ckpt_fixture.h"

namespace {

using fsdp::H5Id;

// Every root attribute the reader knows, and the per-dataset crc32.
const std::vector<std::string>& attr_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v = fsdp::ckpt::meta_attribute_names();
    v.emplace_back("crc32");
    return v;
  }();
  return names;
}

const std::vector<int64_t>& interesting_ints() {
  static const std::vector<int64_t> v = {0,
                                         1,
                                         -1,
                                         2,
                                         3,
                                         4,
                                         7,
                                         8,
                                         16,
                                         17,
                                         31,
                                         32,
                                         255,
                                         65536,
                                         int64_t{1} << 31,
                                         (int64_t{1} << 32) - 1,
                                         int64_t{1} << 32,
                                         int64_t{1} << 40,
                                         int64_t{1} << 62,
                                         std::numeric_limits<int64_t>::max(),
                                         std::numeric_limits<int64_t>::min(),
                                         std::numeric_limits<int64_t>::max() / 4 + 1,
                                         -(int64_t{1} << 40)};
  return v;
}

int64_t some_int(fuzz::Input& in) {
  const uint8_t k = in.u8();
  if (k < 200) return interesting_ints()[k % interesting_ints().size()];
  return static_cast<int64_t>(in.u64());
}

double some_double(fuzz::Input& in) {
  static const std::vector<double> v = {0.0,
                                        1.0,
                                        -1.0,
                                        0.5,
                                        1e-300,
                                        1e300,
                                        std::numeric_limits<double>::quiet_NaN(),
                                        std::numeric_limits<double>::infinity(),
                                        -std::numeric_limits<double>::infinity(),
                                        17.0,
                                        1e19,
                                        -0.0};
  const uint8_t k = in.u8();
  return k < 200 ? v[k % v.size()] : in.f64();
}

hsize_t some_dim(fuzz::Input& in) {
  static const std::vector<hsize_t> v = {
      0, 1, 2, 3, 4, 5, 7, 8, 12, 15, 16, 20, 22, 24, 1 << 20, hsize_t{1} << 31, hsize_t{1} << 40, hsize_t{1} << 62};
  return v[in.u8() % v.size()];
}

// Every link path in the file ("/model/a.weight", "/index", ...), root excluded.
std::vector<std::string> object_paths(hid_t file) {
  std::vector<std::string> paths;
  H5Lvisit(
      file, H5_INDEX_NAME, H5_ITER_INC,
      [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
        static_cast<std::vector<std::string>*>(out)->push_back("/" + std::string(name));
        return 0;
      },
      &paths);
  return paths;
}

bool is_dataset(hid_t file, const std::string& path) {
  if (H5Lexists(file, path.c_str(), H5P_DEFAULT) <= 0) return false;
  H5Id obj(H5Oopen(file, path.c_str(), H5P_DEFAULT), H5Oclose);
  return obj.valid() && H5Iget_type(obj.get()) == H5I_DATASET;
}

H5Id vlen_string() {
  H5Id t(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(t.get(), H5T_VARIABLE);
  H5Tset_cset(t.get(), H5T_CSET_UTF8);
  return t;
}

void put_attr(hid_t obj, const std::string& name, hid_t type, hid_t space, const void* data) {
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  H5Id a(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (a.valid() && data) H5Awrite(a.get(), type, data);
}

// Replaces attribute `name` of obj with a value of a kind the fuzzer picks.
void edit_attr(hid_t obj, const std::string& name, fuzz::Input& in) {
  const uint8_t kind = in.u8() % 12;
  H5Id scalar(H5Screate(H5S_SCALAR), H5Sclose);
  switch (kind) {
    case 0: {
      int64_t v = some_int(in);
      put_attr(obj, name, H5T_NATIVE_INT64, scalar.get(), &v);
      break;
    }
    case 1: {
      double v = some_double(in);
      put_attr(obj, name, H5T_NATIVE_DOUBLE, scalar.get(), &v);
      break;
    }
    case 2: {
      std::string s = in.str(64);
      const char* p = s.c_str();
      put_attr(obj, name, vlen_string().get(), scalar.get(), &p);
      break;
    }
    case 3: {  // a list of strings, maybe empty (null dataspace), maybe with a null pointer
      const hsize_t n = in.u8() % 5;
      std::vector<std::string> items;
      for (hsize_t i = 0; i < n; ++i) items.push_back(in.str(16));
      std::vector<const char*> ptrs;
      for (const auto& s : items) ptrs.push_back(in.u8() == 0xff ? nullptr : s.c_str());
      H5Id space(n == 0 ? H5Screate(H5S_NULL) : H5Screate_simple(1, &n, nullptr), H5Sclose);
      const char* none = nullptr;
      put_attr(obj, name, vlen_string().get(), space.get(), n ? static_cast<const void*>(ptrs.data()) : &none);
      break;
    }
    case 4: {  // a fixed-length string
      std::string s = in.str(32);
      H5Id t(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(t.get(), std::max<size_t>(1, s.size()));
      s.resize(std::max<size_t>(1, s.size()));
      put_attr(obj, name, t.get(), scalar.get(), s.data());
      break;
    }
    case 5: {  // integers, 0 to 4 of them
      const hsize_t n = in.u8() % 5;
      std::vector<int64_t> v(std::max<hsize_t>(1, n));
      for (auto& x : v) x = some_int(in);
      H5Id space(n == 0 ? H5Screate(H5S_NULL) : H5Screate_simple(1, &n, nullptr), H5Sclose);
      put_attr(obj, name, H5T_NATIVE_INT64, space.get(), v.data());
      break;
    }
    case 6: {  // narrower or unsigned integers
      static const hid_t* types[] = {&H5T_NATIVE_UINT8,  &H5T_NATIVE_INT16, &H5T_NATIVE_UINT32,
                                     &H5T_NATIVE_UINT64, &H5T_STD_I64BE,    &H5T_NATIVE_INT8};
      const hid_t type = *types[in.u8() % 6];
      uint64_t v = in.u64();
      H5Id mem(H5Tcopy(H5T_NATIVE_UINT64), H5Tclose);
      H5Id a;
      if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
      a = H5Id(H5Acreate2(obj, name.c_str(), type, scalar.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
      if (a.valid()) H5Awrite(a.get(), mem.get(), &v);  // converted (clipped) by HDF5
      break;
    }
    case 7: {
      float v = static_cast<float>(some_double(in));
      put_attr(obj, name, H5T_NATIVE_FLOAT, scalar.get(), &v);
      break;
    }
    case 8:
      if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
      break;
    case 9: {  // an attribute with no value: null dataspace of an integer
      H5Id space(H5Screate(H5S_NULL), H5Sclose);
      put_attr(obj, name, H5T_NATIVE_INT64, space.get(), nullptr);
      break;
    }
    case 10: {  // a 2-d attribute
      hsize_t dims[2] = {static_cast<hsize_t>(1 + in.u8() % 3), static_cast<hsize_t>(1 + in.u8() % 3)};
      std::vector<double> v(dims[0] * dims[1], some_double(in));
      H5Id space(H5Screate_simple(2, dims, nullptr), H5Sclose);
      put_attr(obj, name, H5T_NATIVE_DOUBLE, space.get(), v.data());
      break;
    }
    default: {  // an enum (its own class)
      H5Id t(H5Tenum_create(H5T_NATIVE_INT), H5Tclose);
      int zero = 0, one = 1;
      H5Tenum_insert(t.get(), "no", &zero);
      H5Tenum_insert(t.get(), "yes", &one);
      put_attr(obj, name, t.get(), scalar.get(), &one);
      break;
    }
  }
}

// The float type of a new dataset.
H5Id dataset_type(uint8_t k) {
  switch (k % 10) {
    case 0: return H5Id(H5Tcopy(H5T_IEEE_F32LE), H5Tclose);
    case 1: return H5Id(H5Tcopy(H5T_IEEE_F32BE), H5Tclose);
    case 2: return H5Id(H5Tcopy(H5T_IEEE_F64LE), H5Tclose);
    case 3: {  // a 16-bit IEEE half
      H5Id t(H5Tcopy(H5T_IEEE_F32LE), H5Tclose);
      H5Tset_fields(t.get(), 15, 10, 5, 0, 10);
      H5Tset_size(t.get(), 2);
      H5Tset_ebias(t.get(), 15);
      return t;
    }
    case 4: return H5Id(H5Tcopy(H5T_STD_I32LE), H5Tclose);
    case 5: return H5Id(H5Tcopy(H5T_STD_U8LE), H5Tclose);
    case 6: return H5Id(H5Tcopy(H5T_STD_I64LE), H5Tclose);
    case 7: return H5Id(H5Tcopy(H5T_STD_U32LE), H5Tclose);
    case 8: {
      H5Id t(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(t.get(), 1 + k % 9);
      return t;
    }
    default: return vlen_string();
  }
}

// Replaces the dataset (or group) at `path` with a new dataset of fuzzed shape, type and layout.
void replace_dataset(hid_t file, const std::string& path, fuzz::Input& in) {
  const uint8_t how = in.u8();
  H5Id type = dataset_type(in.u8());
  H5Id space;
  std::vector<hsize_t> dims;
  if ((how & 3) == 3) {
    space = H5Id(H5Screate((how & 4) ? H5S_NULL : H5S_SCALAR), H5Sclose);
  } else {
    const int rank = 1 + in.u8() % 9;  // up to 9: one past the readers' limit
    for (int d = 0; d < rank; ++d) dims.push_back(some_dim(in));
    space = H5Id(H5Screate_simple(rank, dims.data(), nullptr), H5Sclose);
  }
  if (!space.valid()) return;
  hssize_t points = H5Sget_simple_extent_npoints(space.get());
  H5Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_LATE);
  if ((how & 8) && !dims.empty()) {  // chunked, maybe deflated
    std::vector<hsize_t> chunk(dims.size());
    for (size_t d = 0; d < dims.size(); ++d) chunk[d] = std::max<hsize_t>(1, std::min<hsize_t>(dims[d], 4));
    H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data());
    if (how & 16) H5Pset_deflate(dcpl.get(), 1);
  }
  H5Ldelete(file, path.c_str(), H5P_DEFAULT);
  H5Id lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  H5Id ds(H5Dcreate2(file, path.c_str(), type.get(), space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT), H5Dclose);
  if (!ds.valid()) return;
  // Small numeric datasets get values (1/4 steps, or the fuzzer's), and a crc32 attribute
  // that matches them when asked; big ones stay unwritten (declared, never allocated).
  if (points > 0 && points <= 4096 && H5Tget_class(type.get()) != H5T_STRING) {
    std::vector<float> v(points);
    for (hssize_t i = 0; i < points; ++i)
      v[i] = (how & 32) ? static_cast<float>(static_cast<int8_t>(in.u8())) : 0.25f * i;
    H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    if (how & 64) {
      int64_t crc = static_cast<int64_t>(crc32_z(0, reinterpret_cast<const Bytef*>(v.data()), v.size() * 4));
      H5Id scalar(H5Screate(H5S_SCALAR), H5Sclose);
      put_attr(ds.get(), "crc32", H5T_NATIVE_INT64, scalar.get(), &crc);
    }
  }
}

// Rewrites one /index dataset: one entry changed, resized, or retyped.
void edit_index(hid_t file, const std::string& path, fuzz::Input& in) {
  H5Id ds(H5Dopen2(file, path.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.valid()) return;
  H5Id type(H5Dget_type(ds.get()), H5Tclose);
  H5Id space(H5Dget_space(ds.get()), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  if (n < 0 || n > 4096) return;
  const int rank = H5Sget_simple_extent_ndims(space.get());
  std::vector<hsize_t> dims(std::max(rank, 0));
  if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  const uint8_t op = in.u8() % 4;
  if (H5Tget_class(type.get()) == H5T_STRING) {  // /index/names: fixed-length strings
    const size_t width = H5Tget_size(type.get());
    if (H5Tis_variable_str(type.get()) > 0 || width == 0 || width > 4096) return;
    std::vector<char> buf(static_cast<size_t>(n) * width);
    if (n > 0 && H5Dread(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0) return;
    std::vector<std::string> names;
    for (hssize_t i = 0; i < n; ++i) names.emplace_back(buf.data() + i * width, strnlen(buf.data() + i * width, width));
    if (op == 0 && n > 0) names[in.u8() % n] = in.str(24);
    if (op == 1 && n > 0) names[in.u8() % n] = names[in.u8() % n];  // a duplicate
    if (op == 2) names.push_back(in.str(24));
    if (op == 3 && n > 0) names.pop_back();
    size_t w = 1;
    for (const auto& s : names) w = std::max(w, s.size());
    std::vector<char> out(names.size() * w, '\0');
    for (size_t i = 0; i < names.size(); ++i) std::memcpy(out.data() + i * w, names[i].data(), names[i].size());
    H5Ldelete(file, path.c_str(), H5P_DEFAULT);
    H5Id t(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(t.get(), w);
    hsize_t len = names.size();
    H5Id sp(len == 0 ? H5Screate(H5S_NULL) : H5Screate_simple(1, &len, nullptr), H5Sclose);
    H5Id nd(H5Dcreate2(file, path.c_str(), t.get(), sp.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
    if (nd.valid() && len > 0) H5Dwrite(nd.get(), t.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data());
    return;
  }
  std::vector<int64_t> v(n);
  if (n > 0 && H5Dread(ds.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0) return;
  if (op == 0) {  // one entry, in place
    if (n == 0) return;
    v[in.u8() % n] = some_int(in);
    H5Dwrite(ds.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    return;
  }
  H5Id new_type(H5Tcopy(type.get()), H5Tclose);
  if (op == 1) v.push_back(some_int(in));         // one more entry
  if (op == 2 && !v.empty()) v.pop_back();        // one fewer
  if (op == 3) new_type = dataset_type(in.u8());  // same values, another type
  ds.reset();
  H5Ldelete(file, path.c_str(), H5P_DEFAULT);
  hsize_t len = v.size();
  H5Id sp(len == 0
              ? H5Screate(H5S_NULL)
              : (op == 3 && rank == 2 ? H5Screate_simple(2, dims.data(), nullptr) : H5Screate_simple(1, &len, nullptr)),
          H5Sclose);
  H5Id nd(H5Dcreate2(file, path.c_str(), new_type.get(), sp.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  if (nd.valid() && len > 0 && H5Tget_class(new_type.get()) != H5T_STRING)
    H5Dwrite(nd.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
}

// Changes one float of a tensor dataset, with its crc32 attribute kept or made to match.
void edit_tensor(hid_t file, const std::string& path, fuzz::Input& in) {
  H5Id ds(H5Dopen2(file, path.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.valid()) return;
  H5Id space(H5Dget_space(ds.get()), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  if (n <= 0 || n > 4096) return;
  std::vector<float> v(n);
  if (H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0) return;
  v[in.u8() % n] = static_cast<float>(some_double(in));
  H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  if (in.u8() & 1) {
    int64_t crc = static_cast<int64_t>(crc32_z(0, reinterpret_cast<const Bytef*>(v.data()), v.size() * 4));
    H5Id scalar(H5Screate(H5S_SCALAR), H5Sclose);
    put_attr(ds.get(), "crc32", H5T_NATIVE_INT64, scalar.get(), &crc);
  }
}

const std::vector<std::string>& well_known_paths() {
  static const std::vector<std::string> v = {"/model",
                                             "/optim",
                                             "/shards",
                                             "/index",
                                             "/shards/0",
                                             "/shards/1",
                                             "/shards/2",
                                             "/model/a.weight",
                                             "/model/extra",
                                             "/index/names",
                                             "/index/unit",
                                             "/index/offset",
                                             "/index/numel",
                                             "/index/ndim",
                                             "/index/dims",
                                             "/index/crc32",
                                             "/index/unit_padded_numel",
                                             "/shards/0/params",
                                             "/shards/1/optim/exp_avg",
                                             "/optim/a.bias/exp_avg",
                                             "/optim/c/exp_avg_sq",
                                             "/x"};
  return v;
}

void apply_edit(hid_t file, const std::string& file_path, fuzz::Input& in) {
  const std::vector<std::string> paths = object_paths(file);
  const uint8_t op = in.u8() % 10;
  auto some_path = [&]() -> std::string {
    const uint8_t k = in.u8();
    if (k >= 200 || paths.empty()) return well_known_paths()[k % well_known_paths().size()];
    return paths[k % paths.size()];
  };
  switch (op) {
    case 0:
    case 1: {  // an attribute of the root or of some object
      const std::string name = attr_names()[in.u8() % attr_names().size()];
      if (op == 0) {
        H5Id root(H5Oopen(file, "/", H5P_DEFAULT), H5Oclose);
        edit_attr(root.get(), name, in);
      } else {
        const std::string p = some_path();
        H5Id obj(H5Oopen(file, p.c_str(), H5P_DEFAULT), H5Oclose);
        if (obj.valid()) edit_attr(obj.get(), in.u8() & 1 ? "crc32" : name, in);
      }
      break;
    }
    case 2: H5Ldelete(file, some_path().c_str(), H5P_DEFAULT); break;
    case 3: replace_dataset(file, some_path(), in); break;
    case 4: {
      static const std::vector<std::string> index = {
          "/index/names", "/index/unit", "/index/offset", "/index/numel",
          "/index/ndim",  "/index/dims", "/index/crc32",  "/index/unit_padded_numel"};
      edit_index(file, index[in.u8() % index.size()], in);
      break;
    }
    case 5: {
      const std::string p = some_path();
      if (is_dataset(file, p)) edit_tensor(file, p, in);
      break;
    }
    case 6: {  // a group where something else was (or is)
      const std::string p = some_path();
      if (in.u8() & 1) H5Ldelete(file, p.c_str(), H5P_DEFAULT);
      H5Id lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
      H5Pset_create_intermediate_group(lcpl.get(), 1);
      H5Id g(H5Gcreate2(file, p.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      break;
    }
    case 7: {  // a second name for an object (hard link)
      const std::string from = some_path(), to = some_path() + (in.u8() & 1 ? "" : "/dup");
      H5Ldelete(file, to.c_str(), H5P_DEFAULT);
      H5Lcreate_hard(file, from.c_str(), file, to.c_str(), H5P_DEFAULT, H5P_DEFAULT);
      break;
    }
    case 8: {  // a soft link, dangling or to a group above it (a cycle)
      const std::string to = some_path(), target = some_path() + (in.u8() & 1 ? "" : "/nowhere");
      H5Ldelete(file, to.c_str(), H5P_DEFAULT);
      H5Lcreate_soft(target.c_str(), file, to.c_str(), H5P_DEFAULT, H5P_DEFAULT);
      break;
    }
    default: {  // an external link: to a missing file, or back into this one
      const std::string to = some_path(), target = some_path();
      H5Ldelete(file, to.c_str(), H5P_DEFAULT);
      const std::string other = in.u8() & 1 ? file_path : fuzz::scratch_dir() + "/missing.h5";
      H5Lcreate_external(other.c_str(), target.c_str(), file, to.c_str(), H5P_DEFAULT, H5P_DEFAULT);
      break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::warm_up();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fuzz::Bases& bases = fuzz::warm_up();
  fuzz::Input in(data, size);
  const uint8_t flags = in.u8();
  const std::string path = fuzz::scratch_dir() + "/struct.h5";
  fuzz::write_file(path, flags & 16 ? bases.sharded : bases.consolidated);
  {
    fsdp::H5Quiet quiet;  // most edits are allowed to fail (a path that is not there)
    H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    if (!file.valid()) fuzz::broken("cannot open the base checkpoint");
    for (int k = 0; k < 12 && !in.empty(); ++k) apply_edit(file.get(), path, in);
  }
  fuzz::read_checkpoint_every_way(path, flags);
  if (flags & 8) fuzz::find_latest(fuzz::read_bytes(path));
  return 0;
}
