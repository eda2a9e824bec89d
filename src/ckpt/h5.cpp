#include "ckpt/h5.h"

#include <unistd.h>
#include <cstdio>
#include <set>

#include "tensor/error.h"

namespace fsdp {

H5Quiet::H5Quiet() {
  H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

H5Quiet::~H5Quiet() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }

namespace {

// H5Literate's and H5Aiterate2's callback: appends each name to the std::vector<std::string> at out.
template <class Info>
herr_t collect_name(hid_t, const char* name, const Info*, void* out) {
  static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}

}  // namespace

std::vector<std::string> link_names(hid_t group) {
  std::vector<std::string> names;
  H5Literate(group, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_name<H5L_info_t>, &names);
  return names;
}

std::vector<std::string> attr_names(hid_t obj) {
  std::vector<std::string> names;
  H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_name<H5A_info_t>, &names);
  return names;
}

WeightFile::WeightFile(const std::string& path, HfNames names)
    : path_(path), where_("model.init_from " + path + ": "), names_(std::move(names)) {
  if (access(path.c_str(), R_OK) != 0) throw Error(where_ + "cannot read the file");
  if (H5Fis_hdf5(path.c_str()) <= 0) throw Error(where_ + "not an HDF5 file");
  file_ = H5Id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file_.valid()) throw Error(where_ + "cannot open as HDF5 (truncated or damaged?)");
  if (H5Lexists(file_.get(), "/model", H5P_DEFAULT) <= 0) throw Error(where_ + "has no /model group");
  group_ = H5Id(H5Gopen2(file_.get(), "/model", H5P_DEFAULT), H5Gclose);
  if (!group_.valid()) throw Error(where_ + "/model is not a group");
}

Shape WeightFile::dataset_shape(const std::string& name) const {
  const std::string ds_name = "/model/" + name;
  H5Id ds(H5Dopen2(group_.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.valid()) throw Error(where_ + ds_name + " is not a dataset");
  H5Id type(H5Dget_type(ds.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_FLOAT) throw Error(where_ + ds_name + " is not a floating-point dataset");
  H5Id space(H5Dget_space(ds.get()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) throw Error(where_ + ds_name + " has no readable shape");
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return {dims.begin(), dims.end()};
}

std::vector<float> WeightFile::read_all(const std::string& name, int64_t numel) const {
  std::vector<float> values(static_cast<size_t>(numel));
  H5Id ds(H5Dopen2(group_.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.valid() || H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0)
    throw Error(where_ + "cannot read /model/" + name + " (truncated or damaged file?)");
  return values;
}

void WeightFile::check(const std::vector<Param*>& all_params) {
  const std::vector<std::string> names = link_names(group_.get());
  std::set<std::string> in_file(names.begin(), names.end()), used;
  source_.clear();
  for (Param* p : all_params) {
    // Its own name first, then its aliases in order: the first present is read, the others
    // present must be equal to it.
    std::vector<std::string> candidates = {p->name};
    if (const auto it = names_.aliases.find(p->name); it != names_.aliases.end())
      candidates.insert(candidates.end(), it->second.begin(), it->second.end());
    std::vector<std::string> present;
    for (const std::string& n : candidates)
      if (in_file.contains(n)) present.push_back(n);
    if (present.empty()) {
      std::string tried = "/model/" + candidates[0];
      for (size_t i = 1; i < candidates.size(); ++i) tried += " or /model/" + candidates[i];
      throw Error(where_ + "missing tensor " + tried);
    }
    for (const std::string& n : present) {
      const Shape shape = dataset_shape(n);
      if (shape != p->shape)
        throw Error(where_ + "/model/" + n + (n == p->name ? "" : " (an alias of " + p->name + ")") + " has shape " +
                    shape_str(shape) + ", the model expects " + shape_str(p->shape));
      used.insert(n);
    }
    source_[p->name] = present[0];
    if (present.size() > 1) {
      const std::vector<float> first = read_all(present[0], p->numel());
      for (size_t i = 1; i < present.size(); ++i) {
        const std::vector<float> other = read_all(present[i], p->numel());
        if (std::memcmp(first.data(), other.data(), first.size() * sizeof(float)) != 0)
          throw Error(where_ + "/model/" + present[i] + " differs from /model/" + present[0] +
                      ", which it aliases (tied): one of them is not this model's tied weight");
      }
    }
  }
  for (const std::string& n : in_file)
    if (!used.contains(n) && !names_.ignored.contains(n))
      throw Error(where_ + "unexpected tensor /model/" + n + " (not in this model)");
}

void WeightFile::read(const std::vector<Param*>& params) const {
  for (Param* p : params) {
    const auto it = source_.find(p->name);
    const std::string& name = it == source_.end() ? p->name : it->second;
    H5Id ds(H5Dopen2(group_.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
    if (!ds.valid() || H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, p->data) < 0)
      throw Error(where_ + "cannot read /model/" + name + " (truncated or damaged file?)");
  }
}

void load_model_weights(const std::string& path, const std::vector<Param*>& params) {
  WeightFile file(path);
  file.check(params);
  file.read(params);
}

WeightWriter::WeightWriter(const std::string& path) : path_(path), tmp_path_(path + ".tmp") {
  file_ = H5Id(H5Fcreate(tmp_path_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (!file_.valid()) throw Error("cannot create HDF5 file " + tmp_path_);
  // No object timestamps: the same weights give the same file bytes (checksums of outputs, and
  // the tests' byte comparison of host and device runs).
  H5Id gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
  H5Pset_obj_track_times(gcpl.get(), false);
  group_ = H5Id(H5Gcreate2(file_.get(), "/model", H5P_DEFAULT, gcpl.get(), H5P_DEFAULT), H5Gclose);
  if (!group_.valid()) throw Error("cannot create /model in " + tmp_path_);
}

WeightWriter::~WeightWriter() {
  if (file_.valid()) {
    group_.reset();
    file_.reset();
    (void)std::remove(tmp_path_.c_str());  // best effort in a destructor: an unfinished temporary
  }
}

void WeightWriter::write(const std::vector<Param*>& params) {
  H5Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_obj_track_times(dcpl.get(), false);  // see the constructor
  for (const Param* p : params) {
    std::vector<hsize_t> dims(p->shape.begin(), p->shape.end());
    H5Id space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
    H5Id ds(
        H5Dcreate2(group_.get(), p->name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
        H5Dclose);
    if (!ds.valid() || H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, p->data) < 0)
      throw Error("cannot write /model/" + p->name + " to " + tmp_path_);
  }
}

void WeightWriter::commit() {
  if (H5Fflush(file_.get(), H5F_SCOPE_GLOBAL) < 0) throw Error("cannot flush " + tmp_path_);
  group_.reset();
  file_.reset();
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) throw Error("cannot rename " + tmp_path_ + " to " + path_);
}

void save_model_weights(const std::string& path, const std::vector<Param*>& params) {
  WeightWriter w(path);
  w.write(params);
  w.commit();
}

}  // namespace fsdp
