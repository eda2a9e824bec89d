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

WeightFile::WeightFile(const std::string& path) : path_(path), where_("model.init_from " + path + ": ") {
  if (access(path.c_str(), R_OK) != 0) throw Error(where_ + "cannot read the file");
  if (H5Fis_hdf5(path.c_str()) <= 0) throw Error(where_ + "not an HDF5 file");
  file_ = H5Id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file_.valid()) throw Error(where_ + "cannot open as HDF5 (truncated or damaged?)");
  if (H5Lexists(file_.get(), "/model", H5P_DEFAULT) <= 0) throw Error(where_ + "has no /model group");
  group_ = H5Id(H5Gopen2(file_.get(), "/model", H5P_DEFAULT), H5Gclose);
  if (!group_.valid()) throw Error(where_ + "/model is not a group");
}

void WeightFile::check(const std::vector<Param*>& all_params) const {
  std::vector<std::string> names = link_names(group_.get());
  std::set<std::string> in_file(names.begin(), names.end());
  for (Param* p : all_params) in_file.erase(p->name);
  if (!in_file.empty()) throw Error(where_ + "unexpected tensor /model/" + *in_file.begin() + " (not in this model)");
  for (Param* p : all_params) {
    const std::string ds_name = "/model/" + p->name;
    if (H5Lexists(group_.get(), p->name.c_str(), H5P_DEFAULT) <= 0) throw Error(where_ + "missing tensor " + ds_name);
    H5Id ds(H5Dopen2(group_.get(), p->name.c_str(), H5P_DEFAULT), H5Dclose);
    if (!ds.valid()) throw Error(where_ + ds_name + " is not a dataset");
    H5Id type(H5Dget_type(ds.get()), H5Tclose);
    if (H5Tget_class(type.get()) != H5T_FLOAT) throw Error(where_ + ds_name + " is not a floating-point dataset");
    H5Id space(H5Dget_space(ds.get()), H5Sclose);
    int rank = H5Sget_simple_extent_ndims(space.get());
    std::vector<hsize_t> dims(rank > 0 ? rank : 0);
    if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    Shape shape(dims.begin(), dims.end());
    if (rank < 0 || shape != p->shape)
      throw Error(where_ + ds_name + " has shape " + shape_str(shape) + ", the model expects " + shape_str(p->shape));
  }
}

void WeightFile::read(const std::vector<Param*>& params) const {
  for (Param* p : params) {
    H5Id ds(H5Dopen2(group_.get(), p->name.c_str(), H5P_DEFAULT), H5Dclose);
    if (!ds.valid() || H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, p->data) < 0)
      throw Error(where_ + "cannot read /model/" + p->name + " (truncated or damaged file?)");
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
