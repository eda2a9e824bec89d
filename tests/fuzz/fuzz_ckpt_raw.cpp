// Fuzz target: checkpoint files as raw bytes (seeds: small valid checkpoints of both formats).
// Input: byte 0 picks the reader options (see read_checkpoint_every_way), the rest is the .h5 file.
// Every reader runs: read_checkpoint_meta, list_checkpoint, verify_checkpoint, load_checkpoint
// at world size 1, load_model_weights (model.init_from) and latest_checkpoint.
// HDF5 itself is not instrumented: a crash inside libhdf5 is an HDF5 bug on damaged files.
#include "ckpt_fixture.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::warm_up();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string path = fuzz::scratch_dir() + "/raw.h5";
  fuzz::write_file(path, bytes);
  fuzz::read_checkpoint_every_way(path, data[0]);
  if (data[0] & 8) fuzz::find_latest(bytes);
  return 0;
}
