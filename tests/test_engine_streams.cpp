// The FSDP engine's stream and event order, without a GPU: every case trains twice in-process,
// once on the host runtime and once on a fake "cuda" device (tests/fake_device.h) whose streams
// are deferred queues, whose kernels are the host kernels enqueued on the compute stream, and
// whose memory faults when the host touches it outside a stream operation. The device run takes
// the engine's device paths (all_gather and reduce_scatter on the communication stream, events
// between the streams, staged collectives, casts and adds on the device, cpu_offload's copies);
// with the order right it must give the host run's numbers bitwise: every step's loss, the final
// loss, the evaluation, and (output.save_weights) every parameter byte. A run with the fake's
// stream waits dropped must not.
//
// Run under mpirun (tests/mpirun.sh NP test_engine_streams ...); only rank 0 logs. A failing
// rank names itself on stderr and exits non-zero, so mpirun does too.
#define BOOST_TEST_NO_MAIN
#include <mpi.h>
#include <unistd.h>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/mpi_env.h"
#include "config/config.h"
#include "fake_device.h"
#include "mpi_test.h"
#include "tensor/error.h"
#include "train/trainer.h"

namespace ut = boost::unit_test;
using fsdp::testing::FakeDevice;
using fsdp::testing::FakeDeviceCounts;
using fsdp::testing::FakeDeviceOptions;
using fsdp::testing::report;
using fsdp::testing::world_rank;
using fsdp::testing::world_size;

namespace {

// Files of this job: rank 0's pid names them, so concurrent jobs do not collide.
std::string job_path(const std::string& name) {
  long pid = static_cast<long>(getpid());
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  return (std::filesystem::temp_directory_path() / ("fsdp_streams_" + std::to_string(pid) + "_" + name)).string();
}

std::vector<std::string> metric_losses(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> losses;
  std::string line;
  while (std::getline(f, line)) {
    auto at = line.find("\"loss\": ");
    if (at != std::string::npos) losses.push_back(line.substr(at + 8, line.find_first_of(",}", at) - at - 8));
  }
  return losses;
}

// The done line's measured and planned peaks ({"params": N, ..., "total": N} each).
std::pair<std::string, std::string> done_peaks(const std::string& path) {
  std::ifstream f(path);
  std::string line, done;
  while (std::getline(f, line))
    if (line.find("\"event\": \"done\"") != std::string::npos) done = line;
  auto object = [&](const std::string& key) {
    const size_t at = done.find("\"" + key + "\": {");
    if (at == std::string::npos) return std::string();
    const size_t open = done.find('{', at);
    return done.substr(open, done.find('}', open) - open + 1);
  };
  return {object("mem_peak_bytes"), object("mem_plan_bytes")};
}

// An integer field of a flat JSON object's text ({"a": 1, "b": 2}); -1 when absent.
int64_t json_field(const std::string& object, const std::string& key) {
  const size_t at = object.find("\"" + key + "\": ");
  return at == std::string::npos ? -1 : std::stoll(object.substr(at + key.size() + 4));
}
// The done line's device_memory_bytes object ("" when the run had no caching allocator).
std::string done_device_memory(const std::string& path) {
  std::ifstream f(path);
  std::string line, done;
  while (std::getline(f, line))
    if (line.find("\"event\": \"done\"") != std::string::npos) done = line;
  const size_t at = done.find("\"device_memory_bytes\": {");
  if (at == std::string::npos) return "";
  const size_t open = done.find('{', at);
  return done.substr(open, done.find('}', open) - open + 1);
}

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

struct RunResult {
  std::string error;                // a thrown Error's text ("" when the run finished)
  std::vector<std::string> losses;  // metrics file, rank 0 only
  fsdp::TrainSummary summary;
  std::string weights;      // output.save_weights file's bytes, rank 0 only
  FakeDeviceCounts counts;  // device runs
  std::vector<std::string> device_errors;
  std::pair<std::string, std::string> peaks;  // measured, planned (rank 0)
  std::string device_memory;                  // the done line's device_memory_bytes (rank 0)
};

// One training run in this process. device: the fake device (train.device cuda); otherwise the
// host runtime.
RunResult train_once(const std::string& yaml, std::vector<std::string> overrides, bool device,
                     FakeDeviceOptions options = {}) {
  const std::string tag = device ? "dev" : "host";
  const std::string metrics = job_path(tag + ".jsonl"), weights = job_path(tag + "_weights.h5");
  overrides.push_back("output.metrics=" + metrics);
  overrides.push_back("output.save_weights=" + weights);
  overrides.push_back(std::string("train.device=") + (device ? "cuda" : "cpu"));
  // A device run stages its buffers through host memory unless the case sets comm.device_buffers:
  // the staged path reduces as the host run does (the same backend's own algorithm), so bitwise
  // equality with the host holds at every world size with any MPI (a CUDA-aware Open MPI's auto
  // would hand device pointers to its own reductions, in its own order).
  if (device && std::none_of(overrides.begin(), overrides.end(),
                             [](const std::string& o) { return o.rfind("comm.device_buffers=", 0) == 0; }))
    overrides.emplace_back("comm.device_buffers=staged");
  RunResult r;
  try {
    fsdp::Config c = fsdp::parse_config(yaml, "streams.yaml", overrides);
    // The world (losses, agreements) is comm.backend in both runs: fsdp_app's device runs put it on
    // MPI because NCCL cannot carry host values, but MPI and UCX sum the f64 loss over 3 ranks in
    // different orders, and this test compares the FSDP data plane, not that.
    auto world = fsdp::make_communicator(c.comm.backend, MPI_COMM_WORLD, {c.comm.timeout_s});
    FakeDevice* fake = nullptr;
    // One node: every rank's node is rank 0's, and the local rank is the world rank.
    fsdp::RunEnv env;
    env.rank = env.local_rank = world_rank();
    env.world_size = world_size();
    env.world = world.get();
    env.mpi_comm = MPI_COMM_WORLD;
    if (device)  // the cpu run: the trainer's own host runtime
      env.make_runtime = [&](fsdp::MemoryTracker& tracker, int) {
        auto d = std::make_unique<FakeDevice>(tracker, options);
        fake = d.get();
        return std::unique_ptr<fsdp::DeviceRuntime>(std::move(d));
      };
    {
      const std::unique_ptr<fsdp::Trainer> trainer = fsdp::Trainer::create(c, env);
      r.summary = trainer->run();
      if (fake) {
        r.counts = fake->counts();
        r.device_errors = fake->errors();
      }
    }
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) {
    r.losses = metric_losses(metrics);
    r.weights = file_bytes(weights);
    r.peaks = done_peaks(metrics);
    r.device_memory = done_device_memory(metrics);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) {
    std::filesystem::remove(metrics);
    std::filesystem::remove(weights);
  }
  return r;
}

std::string describe(const FakeDeviceCounts& c) {
  std::ostringstream s;
  s << c.kernels << " kernels, " << c.ops_run << "/" << c.ops_enqueued << " stream ops run, " << c.comm_stream_ops
    << " on the comm stream, " << c.stream_waits << " stream waits, " << c.event_syncs << " event syncs, "
    << c.stream_syncs << " stream syncs, copies h2d " << c.h2d << " d2h " << c.d2h << " d2d " << c.d2d;
  return s.str();
}

// The device run must equal the host run bitwise, and the fake must have seen the device paths.
// device_only: keys only a device run takes (fsdp.cpu_offload). rtol > 0: the device run's
// reductions are the library's own (mpi with device pointers: Open MPI's order, and bf16/f16
// rounded per pairwise op): losses within rtol, weights not compared. Returns the device run's
// counts.
FakeDeviceCounts check_same(const std::string& name, const std::string& yaml, const std::vector<std::string>& overrides,
                            bool expect_comm_stream = true, const std::vector<std::string>& device_only = {},
                            double rtol = 0) {
  RunResult host = train_once(yaml, overrides, false);
  std::vector<std::string> dev_overrides = overrides;
  dev_overrides.insert(dev_overrides.end(), device_only.begin(), device_only.end());
  RunResult dev = train_once(yaml, dev_overrides, true);
  report(host.error.empty(), name + ": host run failed: " + host.error);
  report(dev.error.empty(), name + ": device run failed: " + dev.error);
  if (!host.error.empty() || !dev.error.empty()) return dev.counts;
  auto close = [rtol](double a, double b) {
    return a == b || std::abs(a - b) <= rtol * std::max(std::abs(a), std::abs(b));
  };
  if (world_rank() == 0) {
    report(!host.losses.empty(), name + ": the host run wrote no losses");
    report(!host.weights.empty(), name + ": the host run saved no weights");
    if (rtol == 0) {
      report(host.losses == dev.losses, name + ": per-step losses differ between the host and the fake device");
      report(host.weights == dev.weights, name + ": saved weights differ between the host and the fake device");
    } else {
      bool near = host.losses.size() == dev.losses.size();
      for (size_t i = 0; near && i < host.losses.size(); ++i)
        near = close(std::stod(host.losses[i]), std::stod(dev.losses[i]));
      report(near, name + ": per-step losses differ between the host and the fake device by more than " +
                       std::to_string(rtol));
    }
    BOOST_TEST_MESSAGE(name << " (np " << world_size() << "): " << host.losses.size() << " losses "
                            << (rtol == 0 ? "and " + std::to_string(host.weights.size()) + " weight-file bytes equal"
                                          : "within " + std::to_string(rtol))
                            << "; device: " << describe(dev.counts));
  }
  report(host.summary.steps == dev.summary.steps, name + ": step counts differ");
  report(close(host.summary.last_loss, dev.summary.last_loss),
         name + ": last loss " + std::to_string(dev.summary.last_loss) + " on the device, " +
             std::to_string(host.summary.last_loss) + " on the host");
  report(close(host.summary.eval_loss, dev.summary.eval_loss), name + ": eval loss differs");
  if (rtol == 0) report(host.summary.eval_accuracy == dev.summary.eval_accuracy, name + ": eval accuracy differs");
  // The memory plan runs this step on the meta device (as cuda for the device run): its peaks are
  // the measured ones to the byte, cpu_offload and the device's host staging included.
  if (world_rank() == 0) {
    for (const RunResult* r : {&host, &dev})
      report(!r->peaks.first.empty() && r->peaks.first == r->peaks.second,
             name + (r == &host ? ": host" : ": device") + " run: measured peaks " + r->peaks.first + ", planned " +
                 r->peaks.second);
  }
  report(dev.device_errors.empty(),
         name + ": the fake device saw a misuse: " + (dev.device_errors.empty() ? "" : dev.device_errors.front()));
  // The caching allocator's memory in the metrics: on device runs only; segments of 2 MiB, the
  // reserved peak at least the allocated one. (The tracked peaks' total also holds the run's host
  // memory, so it is not compared with the allocator's.)
  if (world_rank() == 0) {
    const std::string& m = dev.device_memory;
    const int64_t alloc = json_field(m, "peak_allocated"), reserved = json_field(m, "peak_reserved");
    report(host.device_memory.empty(), name + ": the host run reported device memory: " + host.device_memory);
    report(alloc > 0 && reserved >= alloc && reserved % (int64_t{2} << 20) == 0,
           name + ": device_memory_bytes " + m + " (reserved peak in 2 MiB segments, >= allocated peak > 0)");
  }
  report(dev.counts.null_stream_ops == 0,
         name + ": " + std::to_string(dev.counts.null_stream_ops) + " operations on the null stream");
  report(dev.counts.kernels > 0 && dev.counts.h2d > 0, name + ": the device run launched no kernels or copies");
  if (expect_comm_stream)
    report(dev.counts.comm_stream_ops > 0 && dev.counts.stream_waits > 0,
           name + ": nothing ran on the communication stream: " + describe(dev.counts));
  return dev.counts;
}

const char* kLm =
    "model: {kind: transformer, vocab: 32, d_model: 32, n_layers: 2, n_heads: 4, d_ff: 64, seq_len: 16}\n"
    "data: {kind: synthetic, synthetic_samples: 192}\n"
    "train: {batch_size: 4, steps: 5, eval_every: 5, eval_batch_size: 8, clip_grad_norm: 0.5,\n"
    "        optimizer: {kind: adamw, lr: 0.003, weight_decay: 0.1}}\n"
    "fsdp: {auto_wrap: {policy: transformer_layer}}\n"
    "comm: {timeout_s: 120}\n"
    "output: {log_every: 1}\n";

const char* kCnn =
    "model: {kind: mnist_cnn}\n"
    "data: {kind: synthetic, synthetic_samples: 96}\n"
    "train: {batch_size: 4, steps: 3, eval_every: 3, eval_batch_size: 8,\n"
    "        optimizer: {kind: adadelta, lr: 1.0}}\n"
    "fsdp: {auto_wrap: {policy: size_based, min_num_params: 1000}}\n"
    "comm: {timeout_s: 120}\n"
    "output: {log_every: 1}\n";

// A strategy whose groups exist at this world size: HYBRID shards over pairs when it can.
std::vector<std::string> hybrid_overrides() {
  return {"fsdp.sharding_strategy=HYBRID_SHARD",
          "fsdp.hybrid.shard_group_size=" + std::to_string(world_size() % 2 == 0 ? 2 : 1)};
}

}  // namespace

BOOST_AUTO_TEST_CASE(full_shard_with_prefetch_accumulation_and_clipping) {
  check_same("FULL_SHARD forward+backward prefetch, grad_accum 2", kLm,
             {"fsdp.forward_prefetch=true", "fsdp.limit_all_gathers=false", "train.grad_accum=2"}, world_size() > 1);
}

BOOST_AUTO_TEST_CASE(bf16_params_and_reductions_with_checkpointing) {
  check_same("bf16 params+reduce, BACKWARD_POST, activation checkpointing", kLm,
             {"fsdp.mixed_precision.param_dtype=bf16", "fsdp.mixed_precision.reduce_dtype=bf16",
              "fsdp.backward_prefetch=BACKWARD_POST", "fsdp.activation_checkpointing=true"});
}

// Attention's recompute mode frees its row-block scratch at the end of each call while the
// device still has the kernels that read it queued: the allocator's stream order must hold.
BOOST_AUTO_TEST_CASE(attention_recompute) {
  check_same("attention recompute", kLm, {"model.attention=recompute"}, world_size() > 1);
  check_same(
      "attention recompute, bf16, activation checkpointing", kLm,
      {"model.attention=recompute", "fsdp.mixed_precision.param_dtype=bf16", "fsdp.activation_checkpointing=true"});
}

BOOST_AUTO_TEST_CASE(every_strategy) {
  for (const char* s : {"SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD_ZERO2"})
    check_same(std::string(s), kLm, {std::string("fsdp.sharding_strategy=") + s, "fsdp.limit_all_gathers=false"},
               world_size() > 1 && std::string(s) != "NO_SHARD");
  check_same("HYBRID_SHARD", kLm, hybrid_overrides(), world_size() % 2 == 0);
}

BOOST_AUTO_TEST_CASE(f16_loss_scaling_skips_steps_alike) {
  // An initial scale of 2^28 overflows f16: the finiteness check (a host value) decides skips.
  check_same("f16 dynamic loss scaling", kLm,
             {"fsdp.mixed_precision.param_dtype=f16", "fsdp.mixed_precision.reduce_dtype=f16",
              "fsdp.mixed_precision.init_loss_scale=268435456", "train.steps=6"});
}

BOOST_AUTO_TEST_CASE(cpu_offload) {
  // The host run has no offload (its shards are host memory already): the same numbers.
  check_same("cpu_offload f32", kLm, {}, true, {"fsdp.cpu_offload=true"});
  check_same("cpu_offload bf16", kLm,
             {"fsdp.mixed_precision.param_dtype=bf16", "fsdp.mixed_precision.reduce_dtype=bf16"}, true,
             {"fsdp.cpu_offload=true"});
}

BOOST_AUTO_TEST_CASE(cnn_with_dropout_and_sgd) {
  check_same("mnist_cnn adadelta", kCnn, {}, world_size() > 1);
  check_same("mnist_cnn sgd nesterov", kCnn,
             {"train.optimizer.kind=sgd", "train.optimizer.lr=0.05", "train.optimizer.momentum=0.9",
              "train.optimizer.nesterov=true", "train.optimizer.weight_decay=0.01"},
             world_size() > 1);
}

BOOST_AUTO_TEST_CASE(ucx_data_plane) {
  const FakeDeviceCounts staged =
      check_same("FULL_SHARD over ucx", kLm, {"comm.backend=ucx", "fsdp.mixed_precision.param_dtype=bf16"});
  report(staged.library_accesses == 0, "staged ucx: the library was handed device memory");
}

// comm.device_buffers: direct hands the fake device's pointers to the library, as a CUDA-aware
// Open MPI (every collective) or a UCX with CUDA memory (all_gather; reductions staged) gets a
// GPU's: the host waits for the stream, the library reads and writes device memory (opened by
// library_access), and the result is in place for the next stream operation with no copy. The
// runs equal the host's bitwise, with reduced-precision all_gathers and reductions.
// mpi: the reductions are Open MPI's own (its order at 3 ranks and more), so the losses are
// compared within 1e-5 (what the GPU check asks of np 2 and 4 against np 1); ucx's reductions are
// its rings', staged, so it stays bitwise.
BOOST_AUTO_TEST_CASE(device_pointers_to_the_library) {
  std::vector<std::string> hybrid = hybrid_overrides();
  for (const char* backend : {"mpi", "ucx"}) {
    const std::string be = backend;
    const double rtol = be == "mpi" ? 1e-5 : 0;
    std::vector<std::string> sets = {"comm.backend=" + be, "comm.device_buffers=direct",
                                     "fsdp.mixed_precision.param_dtype=bf16"};
    const FakeDeviceCounts full = check_same("FULL_SHARD over " + be + ", device pointers", kLm, sets, true, {}, rtol);
    if (world_size() > 1) report(full.library_accesses > 0, be + " direct: no collective was handed device memory");
    sets.insert(sets.end(), hybrid.begin(), hybrid.end());
    check_same("HYBRID_SHARD over " + be + ", device pointers", kLm, sets, true, {}, rtol);
  }
}

// Checkpoints from device shards (staged through host memory) hold the host run's values: a run
// resumed from either run's step-2 checkpoint, on either runtime, ends where the straight host
// run ends, weights byte for byte.
BOOST_AUTO_TEST_CASE(checkpoints_staged_from_the_device_resume_anywhere) {
  const std::string dir = job_path("ckpt");
  for (const std::string f : {"consolidated", "sharded"}) {
    auto saving = [&](const std::string& who) {
      return std::vector<std::string>{"checkpoint.dir=" + dir + "/" + who + "_" + f, "checkpoint.every_steps=2",
                                      "checkpoint.keep=10", "checkpoint.format=" + f};
    };
    RunResult host = train_once(kLm, saving("host"), false);
    RunResult dev = train_once(kLm, saving("dev"), true);
    report(host.error.empty() && dev.error.empty(), f + ": a saving run failed: " + host.error + dev.error);
    report(host.summary.last_loss == dev.summary.last_loss, f + ": the saving runs' last losses differ");
    for (const char* from : {"host", "dev"})
      for (bool on_device : {false, true}) {
        const std::string what =
            f + " checkpoint from the " + from + " run, resumed on the " + (on_device ? "device" : "host");
        RunResult r =
            train_once(kLm, {"checkpoint.resume=" + dir + "/" + from + "_" + f + "/ckpt_00000002.h5"}, on_device);
        report(r.error.empty(), what + ": " + r.error);
        report(r.summary.start_step == 2, what + ": did not resume at step 2");
        report(r.summary.last_loss == host.summary.last_loss && r.summary.eval_loss == host.summary.eval_loss,
               what + ": last loss " + std::to_string(r.summary.last_loss) + ", straight host run " +
                   std::to_string(host.summary.last_loss));
        report(r.device_errors.empty(), what + ": the fake device saw a misuse");
        if (world_rank() == 0)
          report(!r.weights.empty() && r.weights == host.weights, what + ": final weights differ from the host run's");
      }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::filesystem::remove_all(dir);
}

// fsdp.node_shared_params (host runs): the peers' slices are read in place from the node's one
// copy instead of all_gathered, so every number must be the all_gather run's bitwise: each step's
// loss, the evaluation, every saved parameter byte. Through gradient accumulation, prefetch,
// activation checkpointing, SHARD_GRAD_OP, HYBRID's groups, bf16 and f16 parameters (the copy
// holds the values rounded to param_dtype; f16's overflowing first steps are skipped alike),
// checkpoints saved mid-run (each asks
// for the shards, so the next step publishes them anew) and a resume (the load writes them). The
// plan runs the same code: its peaks equal the measured ones; and the gathered memory differs
// from the all_gather run's (this rank's share of the copy instead of gathered buffers), which
// shows the mode was on wherever a shard group has two ranks.
BOOST_AUTO_TEST_CASE(node_shared_params_same_bits) {
  const std::string dir = job_path("shared_ckpt");
  const bool groups = world_size() > 1;  // HYBRID shards over pairs at even sizes, else groups of 1
  const std::vector<std::pair<std::vector<std::string>, bool>> cases = {
      {{"fsdp.forward_prefetch=true", "train.grad_accum=2", "fsdp.activation_checkpointing=true",
        "checkpoint.dir=" + dir, "checkpoint.every_steps=2", "checkpoint.keep=10"},
       groups},
      {{"fsdp.sharding_strategy=SHARD_GRAD_OP", "fsdp.limit_all_gathers=false"}, groups},
      {hybrid_overrides(), world_size() % 2 == 0},
      {{"fsdp.mixed_precision.param_dtype=bf16", "fsdp.mixed_precision.reduce_dtype=bf16"}, groups},
      // f16 loss scaling: an initial scale of 2^28 overflows, so early steps are skipped alike.
      {{"fsdp.mixed_precision.param_dtype=f16", "fsdp.mixed_precision.reduce_dtype=f16",
        "fsdp.mixed_precision.init_loss_scale=268435456", "train.steps=6"},
       groups},
  };
  for (const auto& [overrides, engaged] : cases) {
    std::string name = "node_shared_params with";
    for (const std::string& o : overrides) name += " " + o;
    RunResult gathered = train_once(kLm, overrides, false);
    std::vector<std::string> on = overrides;
    on.emplace_back("fsdp.node_shared_params=true");
    RunResult shared = train_once(kLm, on, false);
    report(gathered.error.empty() && shared.error.empty(), name + ": a run failed: " + gathered.error + shared.error);
    report(shared.summary.last_loss == gathered.summary.last_loss &&
               shared.summary.eval_loss == gathered.summary.eval_loss,
           name + ": last loss " + std::to_string(shared.summary.last_loss) + ", all_gather run " +
               std::to_string(gathered.summary.last_loss));
    if (world_rank() == 0) {
      report(!shared.losses.empty() && shared.losses == gathered.losses, name + ": per-step losses differ");
      report(!shared.weights.empty() && shared.weights == gathered.weights, name + ": saved weights differ");
      report(!shared.peaks.first.empty() && shared.peaks.first == shared.peaks.second,
             name + ": measured peaks " + shared.peaks.first + ", planned " + shared.peaks.second);
      report(engaged == (shared.peaks.first != gathered.peaks.first),
             name + (engaged ? ": the same memory peaks as the all_gather run (" : ": other memory peaks (") +
                 shared.peaks.first + ")");
    }
    if (!overrides.empty() && overrides.back() == "checkpoint.keep=10") {
      // Resumed from step 2 of the shared run, shared again: the straight run's end, bit for bit.
      RunResult r =
          train_once(kLm,
                     {"checkpoint.resume=" + dir + "/ckpt_00000002.h5", "fsdp.forward_prefetch=true",
                      "train.grad_accum=2", "fsdp.activation_checkpointing=true", "fsdp.node_shared_params=true"},
                     false);
      report(r.error.empty() && r.summary.start_step == 2,
             name + ": the resume failed or started elsewhere: " + r.error);
      report(r.summary.last_loss == gathered.summary.last_loss, name + ": the resumed run ends elsewhere");
      if (world_rank() == 0)
        report(!r.weights.empty() && r.weights == gathered.weights, name + ": resumed weights differ");
    }
    if (world_rank() == 0)
      BOOST_TEST_MESSAGE(name << " (np " << world_size() << "): " << shared.losses.size() << " losses equal; peaks "
                              << shared.peaks.first);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::filesystem::remove_all(dir);
}

// The test can fail: with the fake's stream waits dropped, the communication stream no longer
// waits for the compute stream's casts, so the all_gather reads a slot before it is written.
// Staged (train_once's default): device pointers make the host wait for the stream before every
// collective, which orders everything whatever the stream waits do.
BOOST_AUTO_TEST_CASE(dropped_stream_waits_are_caught) {
  const std::vector<std::string> o = {"fsdp.mixed_precision.param_dtype=bf16", "train.steps=2",
                                      "train.eval_every=never"};
  RunResult host = train_once(kLm, o, false);
  FakeDeviceOptions broken;
  broken.drop_stream_waits = true;
  RunResult dev = train_once(kLm, o, true, broken);
  report(host.error.empty(), "host run failed: " + host.error);
  if (world_rank() == 0) {
    const bool differs = !dev.error.empty() || dev.losses != host.losses || dev.weights != host.weights;
    report(differs, "dropping every stream wait changed nothing: the comparison cannot see ordering bugs");
    BOOST_TEST_MESSAGE("without stream waits: "
                       << (dev.error.empty() ? "losses " + (dev.losses.empty() ? "none" : dev.losses.front()) + " vs " +
                                                   (host.losses.empty() ? "none" : host.losses.front())
                                             : "error: " + dev.error));
  }
}

// A run whose planned device peak exceeds the device's free memory stops at set-up with one line
// giving the numbers (check_plan_fits), on every rank alike; with room, the same run trains.
BOOST_AUTO_TEST_CASE(a_run_that_cannot_fit_the_device_is_refused_at_start) {
  const std::vector<std::string> o = {"train.steps=1", "train.eval_every=never"};
  FakeDeviceOptions small;
  small.free_bytes = 4096;
  RunResult dev = train_once(kLm, o, true, small);
  const int n = world_size();
  const std::string sharing =
      std::to_string(n) + " rank" + (n == 1 ? "" : "s") + " on fake cuda:0 would need " + std::to_string(n) + " x ";
  report(dev.error.find("memory plan: " + sharing) == 0 &&
             dev.error.find("of device memory at their peak, and the device has 4.00 KiB free") != std::string::npos,
         "expected the device refusal, got: '" + dev.error + "'");
  FakeDeviceOptions roomy;
  roomy.free_bytes = int64_t{1} << 30;
  report(train_once(kLm, o, true, roomy).error.empty(), "a run that fits was refused");
}

int main(int argc, char** argv) {
  fsdp::MpiSession mpi(&argc, &argv);
  return ut::unit_test_main(
      [] {
        fsdp::testing::init_mpi_suite("engine_streams");
        return true;
      },
      argc, argv);
}
