#pragma once
// Shared by the checkpoint fuzz targets: a toy model state (as tests/test_ckpt.cpp builds one),
// valid checkpoints of both formats written by save_checkpoint, and one pass of every
// checkpoint reader over a file. MPI is initialised once, at one rank; loads run on
// MPI_COMM_SELF (world size 1) so the agreement and piece exchange of a real load run too.
#include <mpi.h>

#include <fstream>
#include <iterator>
#include <memory>

#include "ckpt/checkpoint.h"
#include "ckpt/h5.h"
#include "fuzz_util.h"

namespace fuzz {

// Params grouped into units, held whole by this process, with the optimizer states of adamw.
struct ToyState {
  std::vector<fsdp::Param> params;
  std::vector<fsdp::FlatLayout> layouts;
  std::vector<std::vector<float>> buffers;
  fsdp::ShardedState st;

  ToyState() {
    const std::vector<std::pair<std::string, fsdp::Shape>> specs = {
        {"a.weight", {3, 5}}, {"a.bias", {7}}, {"b.weight", {4, 2, 3}}, {"c", {2, 1, 3, 2}}};
    const std::vector<std::vector<int>> groups = {{0, 1}, {2, 3}};
    const int64_t pad = 4;
    for (const auto& [name, shape] : specs) params.push_back(fsdp::Param{name, shape, {}, nullptr, nullptr});
    layouts.reserve(groups.size());
    int64_t total = 0;
    for (const auto& g : groups) {
      std::vector<fsdp::Param*> ps;
      for (int i : g) ps.push_back(&params[i]);
      layouts.push_back(fsdp::make_flat_layout(ps));
      fsdp::UnitShard u;
      u.layout = &layouts.back();
      u.padded_numel = (layouts.back().numel + pad - 1) / pad * pad;
      u.held_begin = u.write_begin = 0;
      u.held_count = u.write_count = u.padded_numel;
      u.local_offset = total;
      total += u.padded_numel;
      st.units.push_back(u);
    }
    st.state_names = {"exp_avg", "exp_avg_sq"};
    buffers.assign(1 + st.state_names.size(), std::vector<float>(total, 0.0f));
    for (size_t s = 0; s < buffers.size(); ++s) {
      for (int64_t i = 0; i < total; ++i) buffers[s][i] = 0.25f * static_cast<float>(i) - 3.0f * s;
      st.buffers.push_back(buffers[s].data());
    }
    // Padding is zero in every layout.
    for (const fsdp::UnitShard& u : st.units)
      for (auto& b : buffers)
        std::fill(b.begin() + u.local_offset + u.layout->numel, b.begin() + u.local_offset + u.padded_numel, 0.0f);
  }
};

inline fsdp::CheckpointMeta toy_meta(const std::string& format) {
  fsdp::CheckpointMeta m;
  m.format = fsdp::parse_checkpoint_format(format);
  m.step = 17;
  m.epoch = 1;
  m.step_in_epoch = 5;
  m.steps_per_epoch = 12;
  m.world_size = 1;
  m.shard_group_size = 1;
  m.global_batch_size = 64;
  m.seed = 3;
  m.strategy = fsdp::Strategy::full_shard;
  m.backend = "mpi";
  m.wrap_policy = fsdp::WrapPolicy::size_based;
  m.model_kind = "mnist_cnn";
  m.optimizer = fsdp::OptimizerKind::adamw;
  m.optimizer_states = {"exp_avg", "exp_avg_sq"};
  m.optimizer_step = 17;
  m.scheduler = fsdp::SchedulerKind::cosine;
  m.lr = 2.5e-4;
  m.loss_scale = 0.0;
  m.best_eval_loss = 0.25;
  m.config_yaml = "model: {kind: mnist_cnn}\n";
  return m;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// MPI once per process (one rank). Never finalized: MPI_Finalize unloads Open MPI's components,
// and what they never freed would then show up in LeakSanitizer's exit report as leaks with
// unnamed frames (not ours, and impossible to suppress by library).
inline void init_mpi() {
  int done = 0;
  MPI_Initialized(&done);
  if (done) return;
  int argc = 0;
  char** argv = nullptr;
  MPI_Init(&argc, &argv);
}

// The bytes of a valid checkpoint of `format` ("consolidated" | "sharded") of ToyState.
inline std::string valid_checkpoint(const std::string& format) {
  static ToyState toy;
  const std::string path = scratch_dir() + "/base_" + format + ".h5";
  fsdp::SaveOptions options;
  options.format = fsdp::parse_checkpoint_format(format);
  fsdp::save_checkpoint(path, toy.st, toy_meta(format), options, MPI_COMM_NULL);
  std::string bytes = read_bytes(path);
  std::remove(path.c_str());
  return bytes;
}

// Every reader of checkpoint files over `path`: bad files are an fsdp::Error with a message.
inline void read_checkpoint_every_way(const std::string& path, uint8_t flags) {
  try {
    fsdp::read_checkpoint_meta(path);
  } catch (const fsdp::Error& e) {
    expect_message(e);
  }
  try {
    fsdp::CheckpointContents c = fsdp::list_checkpoint(path);
    for (const fsdp::CheckpointTensor& t : c.tensors)
      if (t.shape.size() > 8 ||
          (c.meta.format == fsdp::CheckpointFormat::sharded && t.crc32.size() != 1 + c.meta.optimizer_states.size()))
        broken("list_checkpoint returned a tensor it did not check");
  } catch (const fsdp::Error& e) {
    expect_message(e);
  }
  try {
    fsdp::CheckpointVerifyReport r = fsdp::verify_checkpoint(path);
    for (const std::string& p : r.problems)
      if (p.empty()) broken("verify_checkpoint reported an empty problem");
  } catch (const fsdp::Error& e) {
    expect_message(e);
  }
  {  // load at world size 1, the full state or parameters only, the optimizer named or not
    ToyState toy;
    fsdp::LoadOptions options;
    options.optimizer_state = !(flags & 1);
    if (!(flags & 2)) options.optimizer = fsdp::OptimizerKind::adamw;
    try {
      fsdp::load_checkpoint(path, toy.st, options, MPI_COMM_SELF);
    } catch (const fsdp::Error& e) {
      expect_message(e);
    }
  }
  if (flags & 4) {  // model.init_from takes a consolidated checkpoint
    ToyState toy;
    std::vector<std::vector<float>> data;
    std::vector<fsdp::Param*> params;
    for (fsdp::Param& p : toy.params) {
      data.emplace_back(p.numel());
      p.data = data.back().data();
      params.push_back(&p);
    }
    try {
      fsdp::load_model_weights(path, params);
    } catch (const fsdp::Error& e) {
      expect_message(e);
    }
  }
}

// latest_checkpoint over a folder holding the file under a step name (it reads the attributes).
inline void find_latest(const std::string& bytes) {
  const std::string dir = fresh_dir("latest");
  write_file(dir + "/ckpt_00000017.h5", bytes);
  std::vector<std::string> skipped;
  try {
    fsdp::latest_checkpoint(dir, &skipped);
  } catch (const fsdp::Error& e) {
    expect_message(e);
  }
}

// LLVMFuzzerInitialize of both checkpoint targets: MPI, the two valid checkpoints, and one pass of
// every reader over each, so the libraries' one-time allocations (HDF5's and Open MPI's global
// state) happen before libFuzzer starts counting allocations per input.
struct Bases {
  std::string consolidated, sharded;
};
inline const Bases& warm_up() {
  static const Bases bases = [] {
    init_mpi();
    Bases b{valid_checkpoint("consolidated"), valid_checkpoint("sharded")};
    const std::string path = scratch_dir() + "/warm_up.h5";
    for (const std::string* bytes : {&b.consolidated, &b.sharded}) {
      write_file(path, *bytes);
      for (uint8_t flags = 0; flags < 8; ++flags) read_checkpoint_every_way(path, flags);
      find_latest(*bytes);
    }
    std::remove(path.c_str());
    // FSDP_FUZZ_WRITE_BASES=DIR: also write them there (how tests/fuzz/corpus/ckpt_raw was made).
    if (const char* dir = std::getenv("FSDP_FUZZ_WRITE_BASES")) {
      write_file(std::string(dir) + "/consolidated.h5", b.consolidated);
      write_file(std::string(dir) + "/sharded.h5", b.sharded);
    }
    return b;
  }();
  return bases;
}

}  // namespace fuzz
