#define BOOST_TEST_MODULE timed_plan
#include <boost/test/unit_test.hpp>
// The timed plan (--plan --cluster): the collective cost formulas, cluster files and their
// errors, the step's timeline invariants (serial backends add up, overlapping ones hide, FLOPs
// do not depend on the world size), and --suggest's ranking.
#include <cmath>
#include <string>
#include <vector>

#include "comm/collective_cost.h"
#include "config/cluster.h"
#include "config/config.h"
#include "tensor/device.h"
#include "tensor/error.h"
#include "tensor/timeline.h"
#include "train/plan.h"

namespace {

using fsdp::CollectiveKind;

fsdp::Config cfg(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return fsdp::parse_config(yaml, "test.yaml", overrides);
}

const char* kLm =
    "model: {kind: transformer, vocab: 32, d_model: 64, n_layers: 3, n_heads: 4, d_ff: 128, seq_len: 16}\n"
    "data: {kind: synthetic, synthetic_samples: 256}\n"
    "train: {batch_size: 4, steps: 4, eval_every: never, optimizer: {kind: adamw, lr: 0.003}}\n"
    "fsdp: {auto_wrap: {policy: transformer_layer}}\n";

// A CPU node of 2 cores (one f32 rate) and a GPU node, round numbers so the costs are exact.
const char* kCpuNode = R"(
name: test-cpu
device: cpu
devices_per_node: 2
host_memory_GiB: 16
gemm_TFLOPs: {f32: 0.02, tf32: 0.02, bf16: 0.02}
gemm_efficiency: 1
memory_GBps: 10
host_link_GBps: 10
kernel_overhead_us: 2
backends:
  mpi:
    intra: {busbw_GBps: 1, latency_us: 10}
    inter: {busbw_GBps: 0.5, latency_us: 30}
    intra_by_ranks: {2: {busbw_GBps: 2, latency_us: 10}, 4: {busbw_GBps: 1, latency_us: 30}}
    overlaps_compute: false
)";

fsdp::PlanRequest req(int world, const fsdp::ClusterSpec& c, int per_node = 0) {
  fsdp::PlanRequest r;
  r.world_size = world;
  r.ranks_per_node = per_node;
  r.cluster = &c;
  return r;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const fsdp::Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

BOOST_AUTO_TEST_CASE(collective_formulas_are_nccl_tests) {
  BOOST_TEST(fsdp::bus_factor(CollectiveKind::all_gather, 4) == 0.75);
  BOOST_TEST(fsdp::bus_factor(CollectiveKind::reduce_scatter, 8) == 0.875);
  BOOST_TEST(fsdp::bus_factor(CollectiveKind::all_reduce, 4) == 1.5);
  BOOST_TEST(fsdp::bus_factor(CollectiveKind::broadcast, 4) == 1.0);
  fsdp::FabricSpec f;
  f.intra = {1e9, 1e-6};
  f.inter = {1e8, 1e-5};
  // size x factor / busbw + steps x latency.
  BOOST_TEST(fsdp::collective_seconds(CollectiveKind::all_gather, 4e9, 4, 1, f) == 3.0 + 3e-6,
             boost::test_tools::tolerance(1e-12));
  BOOST_TEST(fsdp::collective_seconds(CollectiveKind::all_reduce, 4e9, 4, 1, f) == 6.0 + 6e-6,
             boost::test_tools::tolerance(1e-12));
  BOOST_TEST(fsdp::collective_seconds(CollectiveKind::broadcast, 1e9, 8, 1, f) == 1.0 + 3e-6,
             boost::test_tools::tolerance(1e-12));
  // A group across nodes runs at the inter-node link's bandwidth; of its ring's 4 hops 2 cross
  // nodes (inter-node latency) and 2 stay inside one; one rank costs nothing.
  BOOST_TEST(fsdp::collective_seconds(CollectiveKind::all_gather, 4e9, 4, 2, f) == 30.0 + 3 * (2e-5 + 2e-6) / 4,
             boost::test_tools::tolerance(1e-12));
  BOOST_TEST(fsdp::collective_seconds(CollectiveKind::all_gather, 4e9, 1, 1, f) == 0.0);
  // Measured sizes: interpolated between them, the nearest end beyond.
  f.intra_by_ranks = {{2, {2e9, 1e-5}}, {4, {1e9, 3e-5}}};
  BOOST_TEST(fsdp::link_for(f, 3, 1).bus_bytes_per_s == 1.5e9);
  BOOST_TEST(fsdp::link_for(f, 3, 1).latency_s == 2e-5, boost::test_tools::tolerance(1e-15));
  BOOST_TEST(fsdp::link_for(f, 8, 1).bus_bytes_per_s == 1e9);
  BOOST_TEST(fsdp::link_for(f, 8, 2).bus_bytes_per_s == 1e8);
}

// all_reduce as a tree where the backend has one: the ring's bandwidth term, and the faster
// latency of the two (collective_cost.h).
BOOST_AUTO_TEST_CASE(all_reduce_tree_latency) {
  fsdp::FabricSpec f;
  f.intra = {1e9, 1e-6};
  f.inter = {1e8, 1e-5};
  // 1024 ranks on 128 nodes of 8: the ring's step averages 128 inter- and 896 intra-node hops.
  const double ring_step_s = (128 * 1e-5 + 896 * 1e-6) / 1024;
  const double ring_s = 1024e6 * 2 * 1023 / 1024 / 1e8 + 2 * 1023 * ring_step_s;
  BOOST_TEST(fsdp::collective_seconds(CollectiveKind::all_reduce, 1024e6, 1024, 128, f) == ring_s,
             boost::test_tools::tolerance(1e-12));
  f.all_reduce_tree = true;  // up and down: 7 levels of nodes, a chain of 7 inside each
  BOOST_TEST(fsdp::collective_seconds(CollectiveKind::all_reduce, 1024e6, 1024, 128, f) ==
                 1024e6 * 2 * 1023 / 1024 / 1e8 + 2 * (7 * 1e-5 + 7 * 1e-6),
             boost::test_tools::tolerance(1e-12));
  // One node of 8: recursive doubling's 2 x 3 steps against the ring's 14.
  BOOST_TEST(fsdp::collective_seconds(CollectiveKind::all_reduce, 8e8, 8, 1, f) == 8e8 * 2 * 7 / 8 / 1e9 + 6e-6,
             boost::test_tools::tolerance(1e-12));
  // 2 ranks: the ring's 2 steps, the tree's 2: the same.
  BOOST_TEST(fsdp::collective_seconds(CollectiveKind::all_reduce, 2e8, 2, 1, f) == 2e8 / 1e9 + 2e-6,
             boost::test_tools::tolerance(1e-12));
  // all_gather has no tree (NCCL's rings): 1023 ring steps.
  BOOST_TEST(fsdp::collective_seconds(CollectiveKind::all_gather, 1024e6, 1024, 128, f) ==
                 1024e6 * 1023 / 1024 / 1e8 + 1023 * ring_step_s,
             boost::test_tools::tolerance(1e-12));
}

// The lanes' rules (tensor/timeline.h) on round numbers.
BOOST_AUTO_TEST_CASE(timeline_lanes) {
  using fsdp::Lane;
  fsdp::DeviceRates r;
  r.f32_gemm_flops_per_s = r.tf32_gemm_flops_per_s = 1e9;
  r.bf16_gemm_flops_per_s = 4e9;
  r.memory_bytes_per_s = 1e9;
  r.host_link_bytes_per_s = 1e8;
  // A GPU: kernels on the compute lane, collectives on the comm lane beside them.
  fsdp::Timeline gpu(r, true, true);
  gpu.gemm(1e9, 0, 1024, fsdp::MatmulPrecision::highest, false);  // 1 s
  gpu.gemm(4e9, 0, 1024, fsdp::MatmulPrecision::medium, false);   // bf16: 1 s
  BOOST_TEST(gpu.now(Lane::compute) == 2.0);
  BOOST_TEST(gpu.now(Lane::host) == 0.0);  // launches are asynchronous
  const double end = gpu.collective(Lane::comm, CollectiveKind::all_gather, 1.5);
  BOOST_TEST(end == 1.5);  // started with the host at 0, beside the kernels
  gpu.wait_until(Lane::compute, end);
  BOOST_TEST(gpu.now(Lane::compute) == 2.0);  // already past it
  gpu.copy_on(Lane::comm, 1e8, true);         // host link: 1 s after the all_gather
  BOOST_TEST(gpu.now(Lane::comm) == 2.5);
  gpu.wait_until(Lane::host, gpu.now(Lane::comm));
  BOOST_TEST(gpu.latest() == 2.5);
  BOOST_TEST(gpu.busy().gemm_s == 2.0);
  BOOST_TEST(gpu.busy().collective_s[0] == 1.5);
  BOOST_TEST(gpu.busy().collective_calls[0] == 1);
  BOOST_TEST(gpu.busy().kernels == 2);  // the GEMMs; copies and collectives are not kernels
  // The CPU without background progress: one lane, everything in order.
  r.ranks_per_device = 2;
  r.gemm_half_dim = 64;
  fsdp::Timeline cpu(r, false, false);
  cpu.gemm(1e9, 0, 64, fsdp::MatmulPrecision::highest, false);  // half the rate, half the core: 4 s
  BOOST_TEST(cpu.now(Lane::host) == 4.0);
  cpu.collective(Lane::host, CollectiveKind::reduce_scatter, 1.0);
  cpu.memory_bound(1e9);  // 1 s x 2 ranks on the device
  BOOST_TEST(cpu.now(Lane::host) == 7.0);
  BOOST_TEST(cpu.latest() == 7.0);
  BOOST_TEST(cpu.busy().kernels == 2);
  // Dropout: memory-bound unless its random numbers are slower (2 ranks on the device).
  cpu.dropout(1e9, 1e9);  // no rate: 1 s x 2
  BOOST_TEST(cpu.now(Lane::host) == 9.0);
  r.dropout_elements_per_s = 1e8;
  fsdp::Timeline rng(r, false, false);
  rng.dropout(1e9, 1e9);  // 10 s of random numbers against 1 s of traffic, x 2
  BOOST_TEST(rng.now(Lane::host) == 20.0);
  BOOST_TEST(rng.busy().memory_bound_s == 20.0);
  BOOST_TEST(rng.busy().kernels == 1);
}

BOOST_AUTO_TEST_CASE(cluster_files_and_their_errors) {
  for (const std::string& name : fsdp::cluster_preset_names()) {
    const fsdp::ClusterSpec c = fsdp::load_cluster(name);
    BOOST_TEST(c.name == name);
    BOOST_TEST(!c.backends.empty());
    BOOST_TEST(c.rates.f32_gemm_flops_per_s > 0);
  }
  const fsdp::ClusterSpec h100 = fsdp::load_cluster("dgx-h100");
  BOOST_TEST(h100.devices_per_node == 8);
  BOOST_TEST(h100.device_memory_bytes == 80.0 * (1 << 30));
  BOOST_TEST(h100.rates.bf16_gemm_flops_per_s == 989.4e12 * 0.75, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(h100.fabric("nccl").inter.bus_bytes_per_s == 45e9);
  BOOST_TEST(h100.fabric("nccl").overlaps_compute);
  BOOST_TEST(!h100.fabric("mpi").overlaps_compute);
  BOOST_TEST(h100.fabric("nccl").all_reduce_tree);
  BOOST_TEST(!h100.fabric("ucx").all_reduce_tree);  // our UCX all_reduce is a ring

  const fsdp::ClusterSpec cpu = fsdp::parse_cluster(kCpuNode, "t.yaml");
  BOOST_TEST(cpu.fabric("mpi").intra_by_ranks.size() == 2u);
  BOOST_TEST(error_of([&] { (void)cpu.fabric("nccl"); }) == "cluster test-cpu describes no nccl links (it has: mpi)");

  auto bad = [](const std::string& from, const std::string& to) {
    std::string text = kCpuNode;
    const size_t at = text.find(from);
    BOOST_REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
    return error_of([&] { (void)fsdp::parse_cluster(text, "t.yaml"); });
  };
  BOOST_TEST(bad("memory_GBps: 10", "memory_GBs: 10") ==
             "cluster t.yaml: memory_GBs: unknown key (known: backends, device, device_memory_GiB, devices_per_node, "
             "dropout_Gelem_per_s, gemm_TFLOPs, gemm_efficiency, gemm_half_dim, host_link_GBps, host_memory_GiB, "
             "kernel_overhead_us, memory_GBps, name)");
  BOOST_TEST(bad("memory_GBps: 10", "memory_GBps: -1") == "cluster t.yaml: memory_GBps: is not a positive number");
  BOOST_TEST(fsdp::parse_cluster(std::string(kCpuNode) + "dropout_Gelem_per_s: 0.05\n", "t.yaml")
                     .rates.dropout_elements_per_s == 0.05e9,
             boost::test_tools::tolerance(1e-12));
  BOOST_TEST(fsdp::parse_cluster(kCpuNode, "t.yaml").rates.dropout_elements_per_s == 0.0);  // memory-bound
  BOOST_TEST(bad("memory_GBps: 10", "memory_GBps: 10\ndropout_Gelem_per_s: -1") ==
             "cluster t.yaml: dropout_Gelem_per_s: is not a number >= 0");
  BOOST_TEST(bad("device: cpu", "device: gpu") == "cluster t.yaml: device: is 'gpu', not cpu or cuda");
  BOOST_TEST(bad("devices_per_node: 2", "devices_per_node: 2.5") ==
             "cluster t.yaml: devices_per_node: is not a whole number");
  BOOST_TEST(bad("gemm_efficiency: 1", "gemm_efficiency: 1.5") == "cluster t.yaml: gemm_efficiency: is above 1");
  BOOST_TEST(bad("  mpi:", "  gloo:") == "cluster t.yaml: backends.gloo: is not a backend (mpi, ucx, nccl)");
  BOOST_TEST(bad("2: {busbw", "1: {busbw") ==
             "cluster t.yaml: backends.mpi.intra_by_ranks.1: the key is not a number of ranks >= 2");
  BOOST_TEST(bad("overlaps_compute: false", "overlaps_compute: no") ==
             "cluster t.yaml: backends.mpi.overlaps_compute: is not true or false");
  BOOST_TEST(bad("overlaps_compute: false", "overlaps_compute: false\n    all_reduce_tree: 1.5") ==
             "cluster t.yaml: backends.mpi.all_reduce_tree: is not true or false");
  BOOST_TEST(bad("    intra: {busbw_GBps: 1, latency_us: 10}\n", "") == "cluster t.yaml: backends.mpi.intra: missing");
  BOOST_TEST(error_of([] { (void)fsdp::load_cluster("/nonexistent/c.yaml"); }) ==
             "--cluster /nonexistent/c.yaml: no such preset (dgx-h100, dgx-h200, a100-node, cpu-2core) or readable "
             "file");
}

// On a backend that does not overlap (MPI on the CPU), the step is its kernels, copies and
// collectives end to end; on one rank no collective costs anything.
BOOST_AUTO_TEST_CASE(serial_backend_adds_up) {
  const fsdp::ClusterSpec cpu = fsdp::parse_cluster(kCpuNode, "t.yaml");
  const fsdp::MemoryPlan one = fsdp::plan_memory(cfg(kLm), req(1, cpu, 1));
  BOOST_REQUIRE(one.time.has_value());
  BOOST_TEST_MESSAGE(one.time->text(1));
  BOOST_TEST(one.time->comm_s() == 0.0);
  BOOST_TEST(one.time->step_s == one.time->compute_s(), boost::test_tools::tolerance(1e-9));
  BOOST_TEST(one.time->gemm_flops > 0);
  BOOST_TEST(one.time->tokens_per_sample == 16.0);
  BOOST_TEST(one.time->samples_per_step == 4.0);

  const fsdp::MemoryPlan four = fsdp::plan_memory(cfg(kLm), req(4, cpu, 4));
  const fsdp::TimePlan& t = *four.time;
  BOOST_TEST_MESSAGE(t.text(4));
  BOOST_TEST(t.ranks_per_node == 4);
  BOOST_TEST(t.ranks_per_device == 2);  // 4 ranks on 2 cores
  BOOST_TEST(t.collective_calls[0] == four.all_gather.calls);
  BOOST_TEST(t.collective_calls[1] == four.reduce_scatter.calls);
  BOOST_TEST(t.comm_s() > 0);
  BOOST_TEST(t.step_s == t.compute_s() + t.comm_s(), boost::test_tools::tolerance(1e-9));
  BOOST_TEST(t.exposed_comm_s() == t.comm_s(), boost::test_tools::tolerance(1e-9));
  // A rank's FLOPs are its batch's, whatever the world size; its kernels share a core with
  // another rank's, so they take twice as long.
  BOOST_TEST(t.gemm_flops == one.time->gemm_flops);
  BOOST_TEST(t.gemm_s > 1.9 * one.time->gemm_s);  // 2x, less the launch overheads' share
  BOOST_TEST(t.gemm_s < 2.0 * one.time->gemm_s);
  // The all_gather's cost at 4 ranks on one node: the measured size's link (1 GB/s, 30 us).
  const double ag_bytes = static_cast<double>(four.all_gather.bytes);
  BOOST_TEST(t.collective_s[0] == ag_bytes * 0.75 / 1e9 + static_cast<double>(four.all_gather.calls) * 3 * 30e-6,
             boost::test_tools::tolerance(1e-9));
  // Two nodes of 2: the inter-node link's bandwidth; 2 of the ring's 4 hops cross nodes (30 us),
  // 2 stay inside one (the 2-rank intra link's 10 us).
  const fsdp::MemoryPlan two_nodes = fsdp::plan_memory(cfg(kLm), req(4, cpu, 2));
  BOOST_TEST(two_nodes.time->nodes == 2);
  BOOST_TEST(two_nodes.time->collective_s[0] ==
                 ag_bytes * 0.75 / 0.5e9 + static_cast<double>(four.all_gather.calls) * 3 * (2 * 30e-6 + 2 * 10e-6) / 4,
             boost::test_tools::tolerance(1e-9));
  // MFU: the device's FLOPs (2 ranks' worth) over the step at its peak.
  BOOST_TEST(t.mfu() == 2 * t.gemm_flops / t.step_s / 0.02e12, boost::test_tools::tolerance(1e-12));
}

// Activation checkpointing repeats each wrapped block's forward: about 4/3 of the GEMM FLOPs.
BOOST_AUTO_TEST_CASE(recompute_costs_a_forward) {
  const fsdp::ClusterSpec cpu = fsdp::parse_cluster(kCpuNode, "t.yaml");
  const double plain = fsdp::plan_memory(cfg(kLm), req(2, cpu, 2)).time->gemm_flops;
  const double ac =
      fsdp::plan_memory(cfg(kLm, {"fsdp.activation_checkpointing=true"}), req(2, cpu, 2)).time->gemm_flops;
  BOOST_TEST(ac / plain > 1.2);
  BOOST_TEST(ac / plain < 1.34);
}

// NCCL on a GPU node overlaps: the prefetched all_gathers hide behind compute, so the step is
// shorter than compute plus communication, and never shorter than compute.
BOOST_AUTO_TEST_CASE(overlapping_backend_hides_communication) {
  const fsdp::ClusterSpec h100 = fsdp::load_cluster("dgx-h100");
  // comm.backend takes the built backends only: a build without CUDA (tests/sanitize.sh on a
  // machine without a GPU) has no nccl to plan with.
  if (!fsdp::cuda_built()) {
    BOOST_TEST_MESSAGE("skipped: this build has no nccl backend (built without CUDA)");
    return;
  }
  const std::vector<std::string> gpu = {"train.device=cuda", "comm.backend=nccl", "model.d_model=512",
                                        "model.d_ff=2048",   "model.seq_len=128", "train.batch_size=8"};
  const fsdp::MemoryPlan p = fsdp::plan_memory(cfg(kLm, gpu), req(8, h100));
  const fsdp::TimePlan& t = *p.time;
  BOOST_TEST_MESSAGE(t.text(8));
  BOOST_TEST(t.overlaps);
  BOOST_TEST(t.step_s >= t.compute_s() - 1e-12);
  BOOST_TEST(t.step_s < t.compute_s() + t.comm_s());
  BOOST_TEST(t.exposed_comm_s() < t.comm_s());
  // The same on MPI (host-staged, no overlap): kernels and collectives add up (only a copy on
  // the comm stream may run beside them).
  const fsdp::MemoryPlan m = fsdp::plan_memory(cfg(kLm, {"train.device=cuda", "comm.backend=mpi", "model.d_model=512",
                                                         "model.d_ff=2048", "model.seq_len=128", "train.batch_size=8"}),
                                               req(8, h100));
  BOOST_TEST(m.time->step_s <= m.time->compute_s() + m.time->comm_s() + 1e-12);
  BOOST_TEST(m.time->step_s >= m.time->compute_s() + m.time->comm_s() - m.time->copy_s - 1e-12);
  BOOST_TEST(m.time->step_s > t.step_s);
  // A cluster of CUDA devices for an input that trains on the CPU is one line.
  BOOST_TEST(error_of([&] { (void)fsdp::plan_memory(cfg(kLm), req(8, h100)); }) ==
             "plan: cluster dgx-h100 computes on cuda and the input trains on cpu (set train.device cuda)");
}

// --suggest: those that fit first, by step time; the rest after, with the refused last.
BOOST_AUTO_TEST_CASE(suggest_ranks_what_fits) {
  std::string text = kCpuNode;
  // Host memory for 4 ranks of a sharded model but not of a replicated one.
  const fsdp::Config c = cfg(kLm, {"model.d_model=256", "model.d_ff=1024"});
  const fsdp::ClusterSpec roomy = fsdp::parse_cluster(text, "t.yaml");
  const fsdp::MemoryPlan full = fsdp::plan_memory(c, req(4, roomy, 4));
  const fsdp::MemoryPlan none = fsdp::plan_memory(
      cfg(kLm, {"model.d_model=256", "model.d_ff=1024", "fsdp.sharding_strategy=NO_SHARD"}), req(4, roomy, 4));
  BOOST_REQUIRE(none.host_peak_bytes > full.host_peak_bytes);
  const double gib = static_cast<double>(4 * (full.host_peak_bytes + none.host_peak_bytes) / 2) / (1 << 30);
  text.replace(text.find("host_memory_GiB: 16"), 19, "host_memory_GiB: " + std::to_string(gib));
  const fsdp::ClusterSpec tight = fsdp::parse_cluster(text, "t.yaml");
  const std::vector<fsdp::StrategyChoice> choices = fsdp::suggest_strategies(c, req(4, tight, 4));
  BOOST_TEST_MESSAGE(fsdp::suggestions_text(choices, req(4, tight, 4)));
  BOOST_TEST(choices.size() == 8u);  // 4 strategies x activation checkpointing on the CPU
  BOOST_TEST(choices.front().fits);
  bool seen_unfit = false;
  for (size_t i = 0; i < choices.size(); ++i) {
    BOOST_REQUIRE(choices[i].plan.has_value());
    if (!choices[i].fits) seen_unfit = true;
    BOOST_TEST(!(seen_unfit && choices[i].fits));  // no fitting choice after one that does not
    if (i > 0 && choices[i].fits) BOOST_TEST(choices[i - 1].plan->time->step_s <= choices[i].plan->time->step_s);
    if (contains(choices[i].label, "NO_SHARD") && !contains(choices[i].label, "activation"))
      BOOST_TEST(!choices[i].fits);
  }
  BOOST_TEST(seen_unfit);
  BOOST_TEST(error_of([&] {
               fsdp::PlanRequest r;
               r.world_size = 4;
               (void)fsdp::suggest_strategies(c, r);
             }) == "--suggest needs --cluster (the ranking is by predicted step time)");
}
