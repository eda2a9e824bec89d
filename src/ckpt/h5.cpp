#include "ckpt/h5.h"

#include <set>
#include <unistd.h>

#include "tensor/error.h"

namespace fsdp {

H5Quiet::H5Quiet() {
  H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

H5Quiet::~H5Quiet() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }

namespace {

herr_t collect_name(hid_t, const char* name, const H5L_info_t*, void* out) {
  static_cast<std::set<std::string>*>(out)->insert(name);
  return 0;
}

}  // namespace

void load_model_weights(const std::string& path, const std::vector<Param*>& params) {
  H5Quiet quiet;
  const std::string where = "model.init_from " + path + ": ";
  if (access(path.c_str(), R_OK) != 0) throw Error(where + "cannot read the file");
  if (H5Fis_hdf5(path.c_str()) <= 0) throw Error(where + "not an HDF5 file");
  H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) throw Error(where + "cannot open as HDF5 (truncated or damaged?)");
  if (H5Lexists(file.get(), "/model", H5P_DEFAULT) <= 0) throw Error(where + "has no /model group");
  H5Id group(H5Gopen2(file.get(), "/model", H5P_DEFAULT), H5Gclose);
  if (!group.valid()) throw Error(where + "/model is not a group");

  std::set<std::string> in_file;
  H5Literate(group.get(), H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, collect_name, &in_file);
  for (Param* p : params) in_file.erase(p->name);
  if (!in_file.empty()) throw Error(where + "unexpected tensor /model/" + *in_file.begin() + " (not in this model)");

  for (Param* p : params) {
    const std::string ds_name = "/model/" + p->name;
    if (H5Lexists(group.get(), p->name.c_str(), H5P_DEFAULT) <= 0) throw Error(where + "missing tensor " + ds_name);
    H5Id ds(H5Dopen2(group.get(), p->name.c_str(), H5P_DEFAULT), H5Dclose);
    if (!ds.valid()) throw Error(where + ds_name + " is not a dataset");
    H5Id type(H5Dget_type(ds.get()), H5Tclose);
    if (H5Tget_class(type.get()) != H5T_FLOAT) throw Error(where + ds_name + " is not a floating-point dataset");
    H5Id space(H5Dget_space(ds.get()), H5Sclose);
    int rank = H5Sget_simple_extent_ndims(space.get());
    std::vector<hsize_t> dims(rank > 0 ? rank : 0);
    if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    Shape shape(dims.begin(), dims.end());
    if (rank < 0 || shape != p->shape)
      throw Error(where + ds_name + " has shape " + shape_str(shape) + ", the model expects " + shape_str(p->shape));
    if (H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, p->data) < 0)
      throw Error(where + "cannot read " + ds_name + " (truncated or damaged file?)");
  }
}

void save_model_weights(const std::string& path, const std::vector<Param*>& params) {
  H5Quiet quiet;
  H5Id file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) throw Error("cannot create HDF5 file " + path);
  H5Id group(H5Gcreate2(file.get(), "/model", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  for (const Param* p : params) {
    std::vector<hsize_t> dims(p->shape.begin(), p->shape.end());
    H5Id space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
    H5Id ds(H5Dcreate2(group.get(), p->name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT,
                       H5P_DEFAULT),
            H5Dclose);
    if (!ds.valid() || H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, p->data) < 0)
      throw Error("cannot write /model/" + p->name + " to " + path);
  }
  if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0) throw Error("cannot flush " + path);
}

}  // namespace fsdp
