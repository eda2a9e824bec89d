#pragma once
// RAII owners for HDF5 handles and the weight-file reader/writer used by model.init_from: one
// dataset per parameter, `/model/<state_dict name>`, at its full PyTorch shape. Any tool (h5py,
// PyTorch via h5py) reads and writes these files.
#include <hdf5.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "models/family.h"  // HfNames
#include "nn/module.h"

namespace fsdp {

class H5Id {
 public:
  H5Id() = default;
  H5Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~H5Id() { reset(); }
  H5Id(H5Id&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), close_(o.close_) {}
  H5Id& operator=(H5Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      close_ = o.close_;
    }
    return *this;
  }
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  hid_t get() const { return id_; }
  // Gives up ownership: the caller closes it (to see the close's own result, e.g. H5Fclose).
  hid_t release() { return std::exchange(id_, H5I_INVALID_HID); }
  bool valid() const { return id_ >= 0; }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  herr_t (*close_)(hid_t) = nullptr;
};

// Silences HDF5's own error-stack printing while alive: we report one line of our own instead.
class H5Quiet {
 public:
  H5Quiet();
  ~H5Quiet();
  H5Quiet(const H5Quiet&) = delete;
  H5Quiet& operator=(const H5Quiet&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// The names of a group's links (its datasets and subgroups), in name order.
std::vector<std::string> link_names(hid_t group);
// The names of obj's attributes, in name order (HDF5's H5Aiterate2).
std::vector<std::string> attr_names(hid_t obj);

// A weight file opened for reading: /model/<name> datasets. check() is strict like PyTorch's
// load_state_dict (a missing, extra or mis-shaped tensor is an Error naming the file and the
// tensor); read() fills the given params' data (converted to f32), a subset at a time so a
// sharded loader never needs the whole model in memory.
// With `names` (a model family's HfNames) a state_dict saved by PyTorch loads as transformers
// loads it: a parameter missing under its name is read under its first alias present, an alias
// present beside it must hold the same values (one Error naming both), and the names the family
// ignores may be there.
class WeightFile {
 public:
  explicit WeightFile(const std::string& path, HfNames names = {});
  void check(const std::vector<Param*>& all_params);
  void read(const std::vector<Param*>& params) const;

 private:
  // A float dataset's shape; Error naming it when it is not one.
  Shape dataset_shape(const std::string& name) const;
  std::vector<float> read_all(const std::string& name, int64_t numel) const;

  std::string path_, where_;
  HfNames names_;
  std::map<std::string, std::string> source_;  // parameter -> the dataset read for it (check())
  H5Quiet quiet_;
  H5Id file_, group_;
};

// check() then read() of every param.
void load_model_weights(const std::string& path, const std::vector<Param*>& params);
// Writes /model/<name> datasets (f32, full shape) a few params at a time, under a temporary
// name renamed into place by commit(): the file appears only when complete.
class WeightWriter {
 public:
  explicit WeightWriter(const std::string& path);
  ~WeightWriter();  // without commit(): the temporary file is removed
  WeightWriter(const WeightWriter&) = delete;
  WeightWriter& operator=(const WeightWriter&) = delete;
  void write(const std::vector<Param*>& params);
  void commit();

 private:
  std::string path_, tmp_path_;
  H5Quiet quiet_;
  H5Id file_, group_;
};

// Writes every param's data as /model/<name> (f32, full shape) into a new file.
void save_model_weights(const std::string& path, const std::vector<Param*>& params);

}  // namespace fsdp
