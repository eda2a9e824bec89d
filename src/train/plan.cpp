// plan_memory: the trainer on the meta device and a meta communicator (see plan.h); and the
// plan's text.
#include "train/plan.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "comm/meta_comm.h"
#include "config/cluster.h"
#include "config/config.h"
#include "tensor/error.h"
#include "tensor/meta_runtime.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace fsdp {

namespace {

std::string grouped(int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return (v < 0 ? "-" : "") + out;
}

}  // namespace

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024.0 && i < 4) {
    b /= 1024.0;
    ++i;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, i == 0 ? "%.0f %s" : "%.2f %s", b, units[i]);
  return buf;
}

namespace {

// Each rank's node (its color): the request's own list, else ranks_per_node (the request's, the
// cluster's devices per node, or every rank on one node) consecutive ranks per node.
std::vector<int> node_colors(const PlanRequest& request) {
  const int world = request.world_size;
  if (world < 1) throw Error("memory plan: world size " + std::to_string(world) + " is not >= 1");
  if (request.ranks_per_node < 0)
    throw Error("memory plan: ranks per node " + std::to_string(request.ranks_per_node) + " is not >= 1");
  std::vector<int> nodes = request.node_color_of_rank;
  if (nodes.empty()) {
    const int per_node = request.ranks_per_node > 0 ? request.ranks_per_node
                         : request.cluster          ? request.cluster->devices_per_node
                                                    : world;
    for (int r = 0; r < world; ++r) nodes.push_back(r / per_node);
  }
  if (nodes.size() != static_cast<size_t>(world))
    throw Error("memory plan: node colors of " + std::to_string(nodes.size()) + " ranks for " + std::to_string(world));
  return nodes;
}

// A timed plan's clock: one Timeline for the meta device and every communicator split from the
// world, and the cluster's side of the TimePlan (its layout of ranks on nodes and devices).
struct ClusterClock {
  std::unique_ptr<Timeline> timeline;
  std::shared_ptr<MetaTiming> timing;
  TimePlan frame;
};

ClusterClock cluster_clock(const Config& config, const ClusterSpec& cluster, const std::vector<int>& nodes) {
  if (cluster.device != config.train.device)
    throw Error("plan: cluster " + cluster.name + " computes on " + std::string(device_name(cluster.device)) +
                " and the input trains on " + std::string(device_name(config.train.device)) + " (set train.device " +
                std::string(device_name(cluster.device)) + ")");
  const FabricSpec& fabric = cluster.fabric(config.comm.backend);
  ClusterClock c;
  TimePlan& time = c.frame;
  time.cluster = cluster.name;
  time.backend = config.comm.backend;
  time.ranks_per_node = static_cast<int>(std::count(nodes.begin(), nodes.end(), nodes[0]));
  time.nodes = static_cast<int>(std::set<int>(nodes.begin(), nodes.end()).size());
  time.ranks_per_device = (time.ranks_per_node + cluster.devices_per_node - 1) / cluster.devices_per_node;
  time.overlaps = fabric.overlaps_compute;
  DeviceRates rates = cluster.rates;
  rates.ranks_per_device = time.ranks_per_device;
  c.timeline = std::make_unique<Timeline>(rates, cluster.device != Device::cpu, fabric.overlaps_compute);
  c.timing = std::make_shared<MetaTiming>(MetaTiming{c.timeline.get(), fabric, nodes});
  return c;
}

// The step the trainer measured on the timeline (step) put into the cluster's frame (where its
// ranks sit), with the peak it is compared against and what the model does and does not
// account for.
TimePlan timed_step(const Config& config, const ClusterSpec& cluster, const TimePlan& frame, const TimePlan& step) {
  TimePlan t = step;
  t.cluster = frame.cluster, t.backend = frame.backend;
  t.ranks_per_node = frame.ranks_per_node, t.nodes = frame.nodes, t.ranks_per_device = frame.ranks_per_device;
  t.overlaps = frame.overlaps;
  const bool bf16 = config.fsdp.mixed_precision.param_dtype == DType::bf16 ||
                    config.train.matmul_precision == MatmulPrecision::medium;
  const bool tf32 = !bf16 && config.train.matmul_precision == MatmulPrecision::high;
  t.precision = bf16 ? "bf16" : tf32 ? "tf32" : "f32";
  t.peak_flops_per_s = bf16   ? cluster.peak_bf16_flops_per_s
                       : tf32 ? cluster.peak_tf32_flops_per_s
                              : cluster.peak_f32_flops_per_s;
  t.modelled = {
      "every kernel of the step at max(FLOPs / GEMM rate, bytes / memory bandwidth) plus a launch "
      "overhead, in the order the real step calls them",
      std::string("every collective as a ring") +
          (cluster.fabric(config.comm.backend).all_reduce_tree ? " (all_reduce as a tree where that is faster)" : "") +
          " (comm/collective_cost.h) on the link its group crosses, issued and waited for where the engine does "
          "(prefetch, stream events)",
      std::string(t.overlaps ? "collectives overlap compute on their own stream"
                             : "collectives do not overlap compute (the backend progresses only "
                               "while its rank polls)") +
          (t.ranks_per_device > 1 ? "; " + std::to_string(t.ranks_per_device) + " ranks share each device's rates"
                                  : "")};
  t.not_modelled = {"host work between kernels (data loading, the trainer's bookkeeping)",
                    "contention between a rank's compute and its collectives for memory bandwidth or SMs",
                    "NVLS (NVLink SHARP) and NCCL's PAT all_gather, network congestion, stragglers"};
  return t;
}

}  // namespace

MemoryPlan plan_memory(const Config& config, const PlanRequest& request) {
  const std::vector<int> nodes = node_colors(request);
  const ClusterSpec* cluster = request.cluster;
  ClusterClock clock;
  if (cluster) clock = cluster_clock(config, *cluster, nodes);
  // Node-shared memory as the run's backend would give it (only some backends map it).
  const std::optional<BackendEntry> backend = find_backend(config.comm.backend);
  std::unique_ptr<Communicator> meta_world =
      make_meta_communicator(request.world_size, 0, {}, backend && backend->maps_node_memory, clock.timing);
  RunEnv env;
  env.rank = 0;
  env.world_size = request.world_size;
  env.world = meta_world.get();
  env.node_color = nodes[0];
  env.node_color_of_rank = nodes;
  env.planning = true;
  env.make_runtime = [device = config.train.device, t = clock.timeline.get()](MemoryTracker& tracker, int) {
    return make_meta_runtime(device, tracker, t);
  };
  env.timeline = clock.timeline.get();
  env.train_data = request.train_data;
  env.eval_data = request.eval_data;
  MemoryPlan plan = Trainer::create(config, env)->plan();
  // The trainer measured its step on the timeline; the cluster's side is added here.
  if (cluster && plan.time) *plan.time = timed_step(config, *cluster, clock.frame, *plan.time);
  return plan;
}

std::vector<StrategyChoice> suggest_strategies(const Config& config, const PlanRequest& request) {
  if (!request.cluster) throw Error("--suggest needs --cluster (the ranking is by predicted step time)");
  const ClusterSpec& cluster = *request.cluster;
  struct Candidate {
    Strategy strategy;
    const char* name;
  };
  const Candidate strategies[] = {{Strategy::full_shard, "FULL_SHARD"},
                                  {Strategy::shard_grad_op, "SHARD_GRAD_OP"},
                                  {Strategy::hybrid_shard, "HYBRID_SHARD"},
                                  {Strategy::no_shard, "NO_SHARD"}};
  const bool device = cluster.device != Device::cpu;
  std::vector<StrategyChoice> choices;
  for (const Candidate& cand : strategies)
    for (const bool ac : {false, true})
      for (const bool offload : device ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
        Config c = config;
        c.fsdp.sharding_strategy = cand.strategy;
        c.fsdp.shard_group_size = 0;  // HYBRID: a node's ranks
        c.fsdp.activation_checkpointing = ac;
        c.fsdp.cpu_offload = offload;
        StrategyChoice choice;
        choice.label =
            std::string(cand.name) + (ac ? " + activation checkpointing" : "") + (offload ? " + cpu_offload" : "");
        try {
          MemoryPlan plan = plan_memory(c, request);
          const int ranks_per_node = plan.time ? plan.time->ranks_per_node : 1;
          choice.per_rank_bytes = static_cast<double>(device ? plan.device_peak_bytes : plan.host_peak_bytes);
          choice.fits = static_cast<double>(ranks_per_node) * static_cast<double>(plan.host_peak_bytes) <=
                            cluster.host_memory_bytes &&
                        (!device || static_cast<double>(plan.device_peak_bytes) <= cluster.device_memory_bytes);
          choice.plan = std::move(plan);
        } catch (const std::exception& e) {
          choice.refused = describe(e);
        }
        choices.push_back(std::move(choice));
      }
  auto rank_of = [](const StrategyChoice& c) { return !c.plan ? 2 : c.fits ? 0 : 1; };
  std::stable_sort(choices.begin(), choices.end(), [&](const StrategyChoice& a, const StrategyChoice& b) {
    if (rank_of(a) != rank_of(b)) return rank_of(a) < rank_of(b);
    if (rank_of(a) == 0) return a.plan->time->step_s < b.plan->time->step_s;
    if (rank_of(a) == 1) return a.per_rank_bytes < b.per_rank_bytes;
    return false;
  });
  return choices;
}

std::string suggestions_text(const std::vector<StrategyChoice>& choices, const PlanRequest& request) {
  const ClusterSpec& cluster = *request.cluster;
  const bool device = cluster.device != Device::cpu;
  std::string t;
  char line[400];
  std::snprintf(line, sizeof line,
                "strategies on %s for %d ranks, ranked by predicted step time among those that fit (%s memory: "
                "%s per %s):\n",
                cluster.name.c_str(), request.world_size, device ? "device" : "host",
                human_bytes(device ? cluster.device_memory_bytes : cluster.host_memory_bytes).c_str(),
                device ? "GPU" : "node");
  t += line;
  std::snprintf(line, sizeof line, "  %-2s %-50s %10s %12s %6s %11s %s\n", "#", "strategy", "step (s)", "tokens/s/rank",
                "MFU", "peak/rank", "fits");
  t += line;
  int i = 0;
  for (const StrategyChoice& c : choices) {
    ++i;
    if (!c.plan) {
      std::snprintf(line, sizeof line, "  %-2d %-50s refused: %s\n", i, c.label.c_str(), c.refused.c_str());
      t += line;
      continue;
    }
    const TimePlan& tp = *c.plan->time;
    const double per_rank =
        tp.step_s > 0 ? tp.samples_per_step * std::max(tp.tokens_per_sample, 1.0) / tp.step_s / c.plan->world_size : 0;
    std::snprintf(line, sizeof line, "  %-2d %-50s %10.4f %12.0f %5.1f%% %11s %s\n", i, c.label.c_str(), tp.step_s,
                  per_rank, 100 * tp.mfu(), human_bytes(c.per_rank_bytes).c_str(), c.fits ? "yes" : "no");
    t += line;
  }
  t += "  (tokens/s/rank: samples/s for image models; peak/rank: the device's peak, or the host's on a CPU node; "
       "fits: that peak within the device, and every rank's host peak within the node's memory)\n";
  return t;
}

double TimePlan::comm_s() const {
  double s = 0;
  for (double c : collective_s) s += c;
  return s;
}

std::string TimePlan::text(int world_size) const {
  std::string t;
  char line[320];
  auto add = [&](const char* fmt, auto... args) {
    std::snprintf(line, sizeof line, fmt, args...);
    t += line;
  };
  const double samples_s = step_s > 0 ? samples_per_step / step_s : 0;
  add("time plan on %s (%s; %d rank%s per node, %d node%s), one training step, per rank:\n", cluster.c_str(),
      backend.c_str(), ranks_per_node, ranks_per_node == 1 ? "" : "s", nodes, nodes == 1 ? "" : "s");
  add("  step          %10.4f s   %.1f samples/s", step_s, samples_s);
  if (tokens_per_sample > 0)
    add("   %.0f tokens/s (%.0f per rank)", samples_s * tokens_per_sample, samples_s * tokens_per_sample / world_size);
  add("\n  MFU           %9.1f %%   %.3g GEMM FLOPs per rank at the %s peak %.3g TFLOP/s\n", 100 * mfu(), gemm_flops,
      precision.c_str(), peak_flops_per_s / 1e12);
  add("  compute       %10.4f s   GEMM %.4f s, memory-bound %.4f s, copies %.4f s; %lld kernels\n", compute_s(), gemm_s,
      memory_bound_s, copy_s, static_cast<long long>(kernels));
  const char* names[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast"};
  for (size_t k = 0; k < collective_s.size(); ++k)
    if (collective_calls[k] > 0)
      add("  %-14s%10.4f s   %lld call%s\n", names[k], collective_s[k], static_cast<long long>(collective_calls[k]),
          collective_calls[k] == 1 ? "" : "s");
  add("  exposed comm  %10.4f s   of %.4f s communication (%s)\n", exposed_comm_s(), comm_s(),
      overlaps ? "overlapped where the engine's prefetch allows" : "not overlapped by this backend");
  for (const std::string& m : modelled) t += "  modelled: " + m + "\n";
  for (const std::string& m : not_modelled) t += "  not modelled: " + m + "\n";
  return t;
}

namespace {

// Host memory this node can still give (MemAvailable), or 0 when /proc/meminfo does not say.
int64_t host_available_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  long long kib = 0;
  while (std::fgets(line, sizeof line, f))
    // NOLINTNEXTLINE(cert-err34-c): a kernel file's fixed format; no match leaves kib 0
    if (std::sscanf(line, "MemAvailable: %lld kB", &kib) == 1) break;
  (void)std::fclose(f);  // opened for reading: nothing to lose
  return kib * 1024;
}

}  // namespace

void check_plan_fits(const MemoryPlan& plan, int ranks_on_node, DeviceRuntime& runtime) {
  const auto ranks_here = static_cast<int64_t>(ranks_on_node);
  const int64_t available = host_available_bytes();
  const int64_t host_need = ranks_here * plan.host_peak_bytes;
  if (available > 0 && host_need > available)
    throw Error("memory plan: " + std::to_string(ranks_here) + " rank" + (ranks_here == 1 ? "" : "s") +
                " on this node would need " + std::to_string(ranks_here) + " x " +
                human_bytes(static_cast<double>(plan.host_peak_bytes)) + " = " +
                human_bytes(static_cast<double>(host_need)) + " at their peak, and the node has " +
                human_bytes(static_cast<double>(available)) +
                " available (MemAvailable); see fsdp_app --plan: shard more (FULL_SHARD, more ranks or nodes) or "
                "lower train.batch_size");
  if (runtime.device() == Device::cpu) return;
  const DeviceRuntime::DeviceMemory dev = runtime.device_memory();
  if (dev.free_bytes < 0) return;
  const int64_t devices = std::max(dev.devices, 1);
  const int64_t sharing = (ranks_here + devices - 1) / devices;
  const int64_t need = sharing * plan.device_peak_bytes;
  if (need <= dev.free_bytes) return;
  throw Error("memory plan: " + std::to_string(sharing) + " rank" + (sharing == 1 ? "" : "s") + " on " + dev.name +
              " would need " + std::to_string(sharing) + " x " +
              human_bytes(static_cast<double>(plan.device_peak_bytes)) + " = " +
              human_bytes(static_cast<double>(need)) + " of device memory at their peak, and the device has " +
              human_bytes(static_cast<double>(dev.free_bytes)) +
              " free; see fsdp_app --plan: shard more (FULL_SHARD, more ranks or nodes), fsdp.cpu_offload, or lower "
              "train.batch_size");
}

JsonLine MemoryPlan::peaks_json() const {
  JsonLine j;
  for (size_t i = 0; i < kMemCategoryCount; ++i)
    j.integer(std::string(mem_category_name(static_cast<MemCategory>(i))), peak_bytes[i]);
  return j.integer("total", total_peak_bytes);
}

std::string MemoryPlan::text() const {
  std::string t;
  char line[256];
  auto add = [&](const char* fmt, auto... args) {
    std::snprintf(line, sizeof line, fmt, args...);
    t += line;
  };
  const double psi_bytes = 4.0 * static_cast<double>(num_params);
  add("memory plan: %s, %s parameters (%s in f32), %s on %d rank%s: shard group N = %d, %d replica%s, %zu units\n",
      model.c_str(), grouped(num_params).c_str(), human_bytes(psi_bytes).c_str(), strategy.c_str(), world_size,
      world_size == 1 ? "" : "s", shard_group_size, replicas, replicas == 1 ? "" : "s", units.size());
  add("  %-20s %14s %14s %14s\n", "unit", "params", "padded", "shard/rank");
  for (const UnitPlan& u : units)
    add("  %-20s %14s %14s %14s\n", u.name.c_str(), grouped(u.numel).c_str(), grouped(u.padded_numel).c_str(),
        grouped(u.shard_numel).c_str());
  add("per-rank memory, predicted peaks (each category's own peak, as mem_peak_bytes reports them):\n");
  int64_t sum = 0;
  for (size_t i = 0; i < kMemCategoryCount; ++i) {
    sum += peak_bytes[i];
    add("  %-12s %12s %17s\n", std::string(mem_category_name(static_cast<MemCategory>(i))).c_str(),
        human_bytes(static_cast<double>(peak_bytes[i])).c_str(), grouped(peak_bytes[i]).c_str());
  }
  add("  %-12s %12s %17s  peak of the sum (mem_peak_bytes.total); sum of the peaks %s\n", "total",
      human_bytes(static_cast<double>(total_peak_bytes)).c_str(), grouped(total_peak_bytes).c_str(),
      grouped(sum).c_str());
  if (device_peak_bytes > 0)
    add("  %-12s %12s %17s  of which on the device (its own peak); host %s\n", "device",
        human_bytes(static_cast<double>(device_peak_bytes)).c_str(), grouped(device_peak_bytes).c_str(),
        human_bytes(static_cast<double>(host_peak_bytes)).c_str());
  // The grad shards are the params' size: what stays between steps is params + grads + optim
  // shards, 16 Psi / N with Adam (padding included); full gradients and gathered units come on top.
  const int64_t at_rest = 2 * peak(MemCategory::params) + peak(MemCategory::optim);
  add("  model states between steps (param + grad shards + optimizer state): %s = %.2f x Psi/N bytes\n",
      human_bytes(static_cast<double>(at_rest)).c_str(),
      num_params ? static_cast<double>(at_rest * shard_group_size) / static_cast<double>(num_params) : 0.0);
  add("communication per training step (size: whole arrays, nccl-tests convention; wire: bytes each rank sends;\n"
      "  Psi = parameters x 4 bytes):\n");
  int64_t size_sum = 0, wire_sum = 0;
  auto psi = [&](int64_t b) { return psi_bytes > 0 ? static_cast<double>(b) / psi_bytes : 0.0; };
  auto coll = [&](const char* name, const CollectiveCount& p) {
    size_sum += p.bytes;
    wire_sum += p.wire_bytes;
    add("  %-15s %3lld calls over %3d ranks  size %11s = %.2f Psi  wire %11s = %.2f Psi\n", name,
        static_cast<long long>(p.calls), p.group_size, human_bytes(static_cast<double>(p.bytes)).c_str(), psi(p.bytes),
        human_bytes(static_cast<double>(p.wire_bytes)).c_str(), psi(p.wire_bytes));
  };
  coll("all_gather", all_gather);
  coll("reduce_scatter", reduce_scatter);
  coll("all_reduce", all_reduce);
  add("  %-38s size %11s = %.2f Psi  wire %11s = %.2f Psi\n", "total",
      human_bytes(static_cast<double>(size_sum)).c_str(), psi(size_sum),
      human_bytes(static_cast<double>(wire_sum)).c_str(), psi(wire_sum));
  for (const std::string& note : notes) t += "  note: " + note + "\n";
  return t;
}

}  // namespace fsdp
