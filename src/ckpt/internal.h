#pragma once
// Pieces shared by save.cpp, load.cpp and files.cpp; not part of the ckpt interface.
#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/h5.h"

namespace fsdp::ckpt {

// A process group for the save/load protocol; MPI_COMM_NULL = this process alone.
class Group {
 public:
  explicit Group(MPI_Comm comm);
  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm comm() const { return comm_; }
  bool parallel() const { return comm_ != MPI_COMM_NULL; }
  // Error agreement: when any rank's message is non-empty, every rank throws the lowest failing
  // rank's message (prefixed with its rank when the group has several).
  void agree(const std::string& error) const;
  void barrier() const;

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

// One logical tensor of a checkpoint: a parameter (state 0) or one of its optimizer states.
struct TensorRef {
  std::string name;  // the parameter's state_dict name
  int state = 0;     // 0 = the parameter, s = state_names[s - 1]
  Shape shape;
};

// A contiguous range of a tensor's flattened elements, as one rank wrote or read it, with the
// CRC-32 of its bytes. Exchanged between ranks as plain bytes.
struct PieceCrc {
  int64_t tensor = 0;   // index into the tensor list both sides agree on; -1 = padding
  int64_t dataset = 0;  // index into the dataset list
  int64_t tensor_offset = 0, dataset_offset = 0, count = 0;
  uint64_t crc = 0;
};

// Every rank's pieces, in rank order (the save and the load check CRCs from them).
std::vector<PieceCrc> all_gather_pieces(const Group& g, const std::vector<PieceCrc>& mine);

// True when none of the count floats is a NaN or an Inf.
bool all_finite(const float* data, int64_t count);
// CRC-32 (zlib) of count floats' bytes, in parallel chunks.
uint32_t crc32_floats(const float* data, int64_t count);
// The CRC of (bytes behind `crc`) followed by count floats; crc 0 = nothing yet.
uint32_t crc_append(uint32_t crc, const float* data, int64_t count);
// Combines pieces [begin, end) that tile [0, total) once sorted by `offset_of`, deduplicating
// identical ranges (replicas read the same piece). False when they do not tile it.
bool combine_crc(std::vector<PieceCrc> pieces, bool by_tensor, int64_t total, uint32_t* crc);

// Datasets of more dimensions, or of more elements, are refused as damaged.
constexpr int kMaxDims = 8;
constexpr int64_t kMaxNumel = int64_t{1} << 40;
// The dataset's dims; Error("<what> has no usable shape") otherwise.
std::vector<hsize_t> dataset_dims(hid_t ds, const std::string& what);

// Reads flat elements [offset, offset + count) of a float dataset in row-major order, 4 MiB at a
// time into scratch: fn(first element, data, n) per chunk. False when a read fails.
bool stream_flat_range(hid_t ds, const std::vector<hsize_t>& dims, int64_t offset, int64_t count,
                       std::vector<float>& scratch, const std::function<void(int64_t, const float*, int64_t)>& fn);

// Flat elements [offset, offset + count) of a row-major dataset of `dims` as a union of at most
// 2 * rank - 1 hyperslabs on `space` (replaces its selection).
void select_flat_range(hid_t space, const std::vector<hsize_t>& dims, int64_t offset, int64_t count);

// Attributes: scalar int64/f64, variable-length UTF-8 strings and string lists.
void write_attr(hid_t obj, const char* name, int64_t value);
void write_attr(hid_t obj, const char* name, double value);
void write_attr(hid_t obj, const char* name, const std::string& value);
void write_attr(hid_t obj, const char* name, const std::vector<std::string>& value);
// Throws Error("<what>: attribute <name> ...") when missing or not a scalar integer.
int64_t read_int_attr(hid_t obj, const char* name, const std::string& what);

// The root attributes, one table for writing and reading.
void write_meta(hid_t file, const CheckpointMeta& meta);
CheckpointMeta read_meta(hid_t file, const std::string& what);
// Their names in file order, format_version first (tools and the structure-aware fuzz target).
std::vector<std::string> meta_attribute_names();

// Dataset paths of a tensor in each format.
std::string consolidated_path(const std::string& name, int state, const std::vector<std::string>& state_names);
std::string shard_path(int64_t unit, int state, const std::vector<std::string>& state_names);

// The sharded format's index, checked (shapes agree with numel, every parameter inside its
// unit, no name twice): tensors in index order with unit, offset and CRC row. inspect.cpp.
CheckpointContents read_sharded_index(hid_t file, const CheckpointMeta& meta, const std::string& what);

// Opens a checkpoint for reading by this process alone; Error with one line when it is not one.
H5Id open_checkpoint_file(const std::string& path, const std::string& what);

}  // namespace fsdp::ckpt
