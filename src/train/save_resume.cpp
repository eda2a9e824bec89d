// The trainer's files: resuming from a checkpoint, saving one, and output.save_weights. A plan
// (RunEnv::planning) stages the state as a save does and touches no file.
#include <algorithm>
#include <cstdio>
#include <memory>

#include "ckpt/checkpoint.h"
#include "ckpt/h5.h"
#include "ckpt/hf_weights.h"
#include "config/hf_config.h"
#include "nn/flat.h"
#include "tensor/error.h"
#include "train/checkpointing.h"
#include "train/model_from_config.h"
#include "train/trainer_state.h"

namespace fsdp {

namespace {

// model.init_from's HDF5 file (/model/<name> datasets) for the engine's load_full_weights; the
// family's Hugging Face names let a transformers state_dict (tied aliases included) load.
WeightOpener init_from(const std::string& path, const HfNames& names) {
  return [path, names] {
    auto file = std::make_shared<WeightFile>(path, names);
    return WeightReader{[file](const std::vector<Param*>& all) { file->check(all); },
                        [file](const std::vector<Param*>& params) { file->read(params); }};
  };
}

// output.save_weights, one gathered unit: WeightWriter reads each param's data on the host. A
// host run writes the bound params in place. On a device run the unit's values (the gathered
// buffer, or under NO_SHARD in f32 the shard itself) are device memory: they are copied to a host
// staging buffer (charged `other` until written) and written through stand-in params bound to
// it, so the engine's bindings are never touched. The copy is enqueued on the compute stream,
// which wait_for_unshard made wait for the all_gather and the low-precision cast, and after the
// last optimizer step's kernels; the host waits for it.
// writer null: a plan (or a rank that does not write) stages as the writer's rank does.
void write_gathered_unit(WeightWriter* writer, const Unit& u, DeviceRuntime& rt, MemoryTracker& mem) {
  const FlatLayout& layout = u.layout;
  if (rt.device() == Device::cpu || layout.params.empty()) {
    if (writer) writer->write(layout.params);
    return;
  }
  const float* unit_values = layout.params[0]->data - layout.offsets[0];  // the unit's flat buffer
  Tensor host = Tensor::empty({layout.numel}, DType::f32, MemCategory::other, &mem);
  const Stream s = rt.compute_stream();
  rt.copy_async(host.raw(), unit_values, host.bytes(), CopyKind::device_to_host, s);
  rt.synchronize(s);
  std::vector<Param> staged;
  staged.reserve(layout.params.size());
  std::vector<Param*> staged_ptrs;
  for (size_t i = 0; i < layout.params.size(); ++i) {
    staged.push_back(*layout.params[i]);  // name and shape
    staged.back().data = host.f32() + layout.offsets[i];
    staged.back().grad = nullptr;
    staged_ptrs.push_back(&staged.back());
  }
  if (writer) writer->write(staged_ptrs);
}

}  // namespace

// The state a run starts from, once everything is allocated: a checkpoint (checkpoint.resume),
// or model.init_from's weights, or the initial values init_shards drew.
void Trainer::restore() {
  State& s = *s_;
  const Config& c = s.c;
  if (s.env.planning) {
    // A plan touches no file. A resume is assumed to find its file: what it costs is the staging
    // of the state it loads (device shards), held while the file is read. model.init_from below
    // reads nothing on meta, and stages as its load does.
    if (!c.checkpoint.resume.empty()) HostCheckpointState(*s.engine, *s.optimizer, s.mem).copy_to_device(true);
  } else if (!c.checkpoint.dir.empty()) {
    prepare_checkpoint_dir(c.checkpoint.dir);
  }
  // Resume last: it overwrites the shards and optimizer state just made. Collective, and its
  // errors are agreed on inside, so a bad file is still a set-up error reported once.
  if (!c.checkpoint.resume.empty() && !s.env.planning) {
    // auto: the newest complete file whose values are finite; a diverged one (written by an older
    // version, or by another tool) is passed over with a note. Every rank sees the same list and
    // the same load outcome (errors are agreed on inside the load), so all take the same branch.
    const std::vector<std::string> paths = resolve_resume(c.checkpoint, s.env.mpi_comm, &s.resume_note);
    for (size_t i = 0; i < paths.size() && !s.resumed; ++i) {
      try {
        resume(paths[i]);
      } catch (const NonFiniteCheckpoint& e) {
        if (c.checkpoint.resume != "auto") throw;
        s.resume_note.append("checkpoint: skipping ").append(e.what()).append("\n");
        // The shards now hold that file's values: only another complete load may follow.
        if (i + 1 == paths.size())
          throw Error("checkpoint.resume auto: every checkpoint in " + c.checkpoint.dir +
                      " holds non-finite values; move them away to start fresh");
      }
    }
  }
  // model.init_from: rank 0 checks the file and tells everyone before any data moves, so a bad
  // file fails every rank alike — a set-up error reported once. A resumed run has its weights.
  if (c.model.init_from.empty() || s.resumed) return;
  if (init_from_kind(c.model.init_from) != InitFromKind::hdf5)
    init_from_hf();
  else
    s.engine->load_full_weights(init_from(c.model.init_from, hf_names(c.model)));
}

// model.init_from in Hugging Face's form (a .safetensors file or a model folder): every rank reads
// its own shards' ranges into the host staging of its shards (the shards themselves on a host
// run), which then go to the device. A plan stages as the load does and reads nothing.
void Trainer::init_from_hf() {
  State& s = *s_;
  const std::string& path = s.c.model.init_from;
  HostCheckpointState staged(*s.engine, *s.optimizer, s.mem);
  if (s.env.planning) {
    staged.copy_to_device(false);
    return;
  }
  const HfLoadStats st = load_hf_weights(path, staged.state(), hf_names(s.c.model), s.env.mpi_comm);
  staged.copy_to_device(false);
  char line[512];
  std::snprintf(line, sizeof line,
                "init_from: %s: %.1f MB of parameters (f32) in %.2f s; the most any rank read: %.1f MB\n", path.c_str(),
                st.tensor_bytes / 1e6, st.seconds, st.max_bytes_read / 1e6);
  s.resume_note += line;
}

void Trainer::resume(const std::string& path) {
  State& s = *s_;
  LoadOptions options;
  options.optimizer = s.c.train.optimizer.kind;
  CheckpointStats stats;
  HostCheckpointState staged(*s.engine, *s.optimizer, s.mem);
  CheckpointMeta m = load_checkpoint(path, staged.state(), options, s.env.mpi_comm, &stats);
  staged.copy_to_device(options.optimizer_state);  // a load that threw left the device values as they were
  s.resumed = true;
  s.last_good = path;
  s.start_step = m.step;
  s.optimizer->set_step_count(m.optimizer_step);
  if (s.scaler.enabled && m.loss_scale > 0) {
    s.scaler.scale = m.loss_scale;
    s.scaler.good_steps = m.loss_scale_good_steps;
  }
  s.best_eval_loss = m.best_eval_loss;
  char line[512];
  std::snprintf(
      line, sizeof line, "checkpoint: resumed from %s at step %lld (written by %lld rank%s, %s); %.1f MB in %.2f s\n",
      path.c_str(), static_cast<long long>(m.step), static_cast<long long>(m.world_size), m.world_size == 1 ? "" : "s",
      std::string(enum_name(m.strategy)).c_str(), stats.bytes / 1e6, stats.seconds);
  s.resume_note += line;
  if (m.global_batch_size != s.global_batch)
    s.resume_note += "checkpoint: note: global batch " + std::to_string(m.global_batch_size) + " -> " +
                     std::to_string(s.global_batch) + "; the sample order from here on differs from the original run\n";
}

CheckpointMeta Trainer::position(int64_t steps_done, double lr) const {
  const State& s = *s_;
  const Config& c = s.c;
  CheckpointMeta m;
  m.step = steps_done;
  m.epoch = steps_done / s.steps_per_epoch;
  m.step_in_epoch = steps_done % s.steps_per_epoch;
  m.steps_per_epoch = s.steps_per_epoch;
  m.world_size = s.env.world_size;
  m.shard_group_size = s.engine->mesh().shard->size();
  m.global_batch_size = s.global_batch;
  m.seed = static_cast<int64_t>(c.train.seed);
  m.strategy = c.fsdp.sharding_strategy;
  m.backend = c.comm.backend;
  m.wrap_policy = c.fsdp.wrap_policy;
  m.model_kind = c.model.kind;
  m.optimizer = c.train.optimizer.kind;
  m.optimizer_step = s.optimizer->step_count();
  m.scheduler = c.train.scheduler.kind;
  m.lr = lr;
  m.loss_scale = s.scaler.enabled ? s.scaler.scale : 0.0;
  m.loss_scale_good_steps = s.scaler.good_steps;
  m.best_eval_loss = s.best_eval_loss;
  m.config_yaml = c.yaml_text;
  return m;
}

std::string Trainer::diverged(int64_t step, const std::string& what) const {
  const std::string& good = s_->last_good;
  return "step " + std::to_string(step) + ": " + what + "; the run diverged and stops (" +
         (good.empty() ? std::string("no checkpoint of this run to go back to") : "last good checkpoint: " + good) +
         ")";
}

CheckpointStats Trainer::save(const std::string& path, int64_t steps_done, double lr) {
  State& s = *s_;
  const auto span = s.engine->tracer().scope(Track::host, "checkpoint_save");
  HostCheckpointState staged(*s.engine, *s.optimizer, s.mem);
  staged.copy_from_device();
  if (s.env.planning) return {};  // a plan stages the state as a save does and writes nothing
  SaveOptions options;
  options.format = s.c.checkpoint.format;
  options.collective = s.c.checkpoint.io == CheckpointIo::collective;
  if (s.env.during_save) options.after_pieces_written = [&] { s.env.during_save(steps_done); };
  CheckpointStats stats;
  try {
    stats = save_checkpoint(path, staged.state(), position(steps_done, lr), options, s.env.mpi_comm);
  } catch (const NonFiniteCheckpoint& e) {
    throw AgreedError(diverged(steps_done, e.what()));
  }
  s.last_good = path;
  if (s.env.rank == 0) {
    std::printf("checkpoint: step %lld saved to %s, %.1f MB in %.2f s (%.2f GB/s)\n",
                static_cast<long long>(steps_done), path.c_str(), stats.bytes / 1e6, stats.seconds,
                stats.bytes / 1e9 / std::max(stats.seconds, 1e-9));
    std::fflush(stdout);
  }
  return stats;
}

void Trainer::write_weights() {
  State& s = *s_;
  const auto span = s.engine->tracer().scope(Track::host, "save_weights");
  const bool leader = s.env.rank == 0;
  std::unique_ptr<WeightWriter> writer;
  if (leader && !s.env.planning) writer = std::make_unique<WeightWriter>(s.c.output.save_weights);
  s.engine->for_each_gathered_unit([&](const Unit& u) {
    if (leader) write_gathered_unit(writer.get(), u, s.engine->runtime(), s.mem);
  });
  if (writer) writer->commit();
}

}  // namespace fsdp
