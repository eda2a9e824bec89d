// Cluster descriptions: the presets (with their numbers' sources) and the YAML reader.
#include "config/cluster.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "config/yaml_text.h"
#include "tensor/error.h"

namespace fsdp {

namespace {

using config_internal::number;

struct Preset {
  const char* name;
  const char* yaml;
};

// GPU nodes: NVIDIA's datasheets for the peaks (dense, no sparsity) and memory; NCCL's links as
// nccl-tests reports them on such nodes (NVIDIA's DGX H100 user guide and nccl-tests' published
// all_reduce busbw: about 360-480 GB/s inside a DGX H100/H200 node over NVLink 4 without NVLS,
// 45-48 GB/s per GPU across nodes over 8 x 400 Gb/s ConnectX-7; A100: 230 GB/s over NVLink 3 and
// 22 GB/s per GPU over 8 x 200 Gb/s HDR). gemm_efficiency 0.75: large cuBLAS bf16 GEMMs on Hopper
// reach 700-750 of 989 TFLOP/s (our H200 run's sgemm table, docs/gpu.md). MPI and UCX on a GPU
// node here are Debian's, without CUDA support: their collectives go through host staging at the
// host link's rate and do not overlap compute (issue 40 brings the CUDA-aware ones).
// cpu-2core: this machine (2 cores of an AMD EPYC, AVX2), measured by jobs/calibrate-cluster.sh
// on 2026-11-28 (docs/performance.md, "The timed plan against measured steps"); one node, so its
// inter-node link is the 8-rank intra one, not a measurement. It predates gemm_half_dim and
// dropout_Gelem_per_s (not measured there): calibrate your own node with the script.
constexpr Preset kPresets[] = {
    {"dgx-h100", R"(
name: dgx-h100
device: cuda
devices_per_node: 8
device_memory_GiB: 80
host_memory_GiB: 2048
gemm_TFLOPs: {f32: 66.9, tf32: 494.7, bf16: 989.4}
gemm_efficiency: 0.75
memory_GBps: 3000
host_link_GBps: 50
kernel_overhead_us: 5
backends:
  nccl: {intra: {busbw_GBps: 360, latency_us: 7}, inter: {busbw_GBps: 45, latency_us: 15}, all_reduce_tree: true}
  mpi: {intra: {busbw_GBps: 20, latency_us: 20}, inter: {busbw_GBps: 20, latency_us: 30}, overlaps_compute: false,
        all_reduce_tree: true}
  ucx: {intra: {busbw_GBps: 20, latency_us: 20}, inter: {busbw_GBps: 20, latency_us: 30}, overlaps_compute: false}
)"},
    {"dgx-h200", R"(
name: dgx-h200
device: cuda
devices_per_node: 8
device_memory_GiB: 141
host_memory_GiB: 2048
gemm_TFLOPs: {f32: 66.9, tf32: 494.7, bf16: 989.4}
gemm_efficiency: 0.75
memory_GBps: 4300
host_link_GBps: 50
kernel_overhead_us: 5
backends:
  nccl: {intra: {busbw_GBps: 360, latency_us: 7}, inter: {busbw_GBps: 45, latency_us: 15}, all_reduce_tree: true}
  mpi: {intra: {busbw_GBps: 20, latency_us: 20}, inter: {busbw_GBps: 20, latency_us: 30}, overlaps_compute: false,
        all_reduce_tree: true}
  ucx: {intra: {busbw_GBps: 20, latency_us: 20}, inter: {busbw_GBps: 20, latency_us: 30}, overlaps_compute: false}
)"},
    {"a100-node", R"(
name: a100-node
device: cuda
devices_per_node: 8
device_memory_GiB: 80
host_memory_GiB: 1024
gemm_TFLOPs: {f32: 19.5, tf32: 156, bf16: 312}
gemm_efficiency: 0.8
memory_GBps: 1800
host_link_GBps: 25
kernel_overhead_us: 5
backends:
  nccl: {intra: {busbw_GBps: 230, latency_us: 8}, inter: {busbw_GBps: 22, latency_us: 15}, all_reduce_tree: true}
  mpi: {intra: {busbw_GBps: 12, latency_us: 20}, inter: {busbw_GBps: 12, latency_us: 30}, overlaps_compute: false,
        all_reduce_tree: true}
  ucx: {intra: {busbw_GBps: 12, latency_us: 20}, inter: {busbw_GBps: 12, latency_us: 30}, overlaps_compute: false}
)"},
    {"cpu-2core", R"(
name: cpu-2core
device: cpu
devices_per_node: 2
host_memory_GiB: 23
gemm_TFLOPs: {f32: 0.0193, tf32: 0.0193, bf16: 0.0193}
gemm_efficiency: 1
memory_GBps: 14.73
host_link_GBps: 14.73
kernel_overhead_us: 2
backends:
  mpi:
    intra: {busbw_GBps: 0.760, latency_us: 18.77}
    inter: {busbw_GBps: 0.760, latency_us: 18.77}
    intra_by_ranks: {2: {busbw_GBps: 1.808, latency_us: 5.64}, 3: {busbw_GBps: 1.282, latency_us: 6.08},
                     4: {busbw_GBps: 1.306, latency_us: 6.97}, 8: {busbw_GBps: 0.760, latency_us: 18.77}}
    overlaps_compute: false
  ucx:
    intra: {busbw_GBps: 0.447, latency_us: 95.56}
    inter: {busbw_GBps: 0.447, latency_us: 95.56}
    intra_by_ranks: {2: {busbw_GBps: 1.686, latency_us: 8.00}, 3: {busbw_GBps: 0.878, latency_us: 66.50},
                     4: {busbw_GBps: 0.867, latency_us: 48.35}, 8: {busbw_GBps: 0.447, latency_us: 95.56}}
    overlaps_compute: false
)"},
};

class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw Error("cluster " + source_ + ": " + (key.empty() ? "" : key + ": ") + what);
  }
  // Every key of `n` must be in `known`.
  void only(const YAML::Node& n, const std::string& path, const std::set<std::string>& known) const {
    if (!n.IsMap()) fail(path, "is not a mapping");
    for (const auto& kv : n) {
      const std::string k = kv.first.as<std::string>();
      if (!known.contains(k)) {
        std::string list;
        for (const std::string& s : known) {
          if (!list.empty()) list += ", ";
          list += s;
        }
        std::string key = path;
        if (!key.empty()) key += ".";
        key += k;
        fail(key, "unknown key (known: " + list + ")");
      }
    }
  }
  double positive(const YAML::Node& parent, const std::string& path, const std::string& key) const {
    const YAML::Node n = parent[key];
    const std::string full = path.empty() ? key : path + "." + key;
    if (!n) fail(full, "missing");
    const std::optional<double> v = number<double>(n);
    if (!v || *v <= 0) fail(full, "is not a positive number");
    return *v;
  }
  double non_negative(const YAML::Node& parent, const std::string& path, const std::string& key) const {
    const YAML::Node n = parent[key];
    const std::string full = path.empty() ? key : path + "." + key;
    if (!n) fail(full, "missing");
    const std::optional<double> v = number<double>(n);
    if (!v || *v < 0) fail(full, "is not a number >= 0");
    return *v;
  }
  LinkSpec link(const YAML::Node& n, const std::string& path) const {
    only(n, path, {"busbw_GBps", "latency_us"});
    return {positive(n, path, "busbw_GBps") * 1e9, non_negative(n, path, "latency_us") * 1e-6};
  }

 private:
  std::string source_;
};

}  // namespace

const FabricSpec& ClusterSpec::fabric(const std::string& backend) const {
  const auto it = backends.find(backend);
  if (it != backends.end()) return it->second;
  std::string have;
  for (const auto& [k, v] : backends) {
    if (!have.empty()) have += ", ";
    have += k;
  }
  throw Error("cluster " + name + " describes no " + backend + " links (it has: " + have + ")");
}

std::vector<std::string> cluster_preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

ClusterSpec parse_cluster(const std::string& text, const std::string& source) {
  Reader r(source);
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    r.fail("", std::string("not YAML: ") + e.what());
  }
  r.only(
      root, "",
      {"name", "device", "devices_per_node", "device_memory_GiB", "host_memory_GiB", "gemm_TFLOPs", "gemm_efficiency",
       "gemm_half_dim", "dropout_Gelem_per_s", "memory_GBps", "host_link_GBps", "kernel_overhead_us", "backends"});
  ClusterSpec c;
  c.source = source;
  if (!root["name"] || !root["name"].IsScalar()) r.fail("name", "missing");
  c.name = root["name"].Scalar();
  if (!root["device"] || !root["device"].IsScalar()) r.fail("device", "missing (cpu or cuda)");
  const std::string device = root["device"].Scalar();
  if (device != "cpu" && device != "cuda") r.fail("device", "is '" + device + "', not cpu or cuda");
  c.device = device == "cpu" ? Device::cpu : Device::cuda;
  const double per_node = r.positive(root, "", "devices_per_node");
  if (per_node != static_cast<int>(per_node)) r.fail("devices_per_node", "is not a whole number");
  c.devices_per_node = static_cast<int>(per_node);
  if (c.device == Device::cuda) c.device_memory_bytes = r.positive(root, "", "device_memory_GiB") * (1 << 30);
  c.host_memory_bytes = r.positive(root, "", "host_memory_GiB") * (1 << 30);
  const YAML::Node g = root["gemm_TFLOPs"];
  if (!g) r.fail("gemm_TFLOPs", "missing");
  r.only(g, "gemm_TFLOPs", {"f32", "tf32", "bf16"});
  c.peak_f32_flops_per_s = r.positive(g, "gemm_TFLOPs", "f32") * 1e12;
  c.peak_tf32_flops_per_s = r.positive(g, "gemm_TFLOPs", "tf32") * 1e12;
  c.peak_bf16_flops_per_s = r.positive(g, "gemm_TFLOPs", "bf16") * 1e12;
  c.gemm_efficiency = r.positive(root, "", "gemm_efficiency");
  if (c.gemm_efficiency > 1) r.fail("gemm_efficiency", "is above 1");
  c.rates.f32_gemm_flops_per_s = c.peak_f32_flops_per_s * c.gemm_efficiency;
  c.rates.tf32_gemm_flops_per_s = c.peak_tf32_flops_per_s * c.gemm_efficiency;
  c.rates.bf16_gemm_flops_per_s = c.peak_bf16_flops_per_s * c.gemm_efficiency;
  c.rates.memory_bytes_per_s = r.positive(root, "", "memory_GBps") * 1e9;
  c.rates.host_link_bytes_per_s = r.positive(root, "", "host_link_GBps") * 1e9;
  c.rates.kernel_overhead_s = r.non_negative(root, "", "kernel_overhead_us") * 1e-6;
  if (root["gemm_half_dim"]) c.rates.gemm_half_dim = r.non_negative(root, "", "gemm_half_dim");
  if (root["dropout_Gelem_per_s"])
    c.rates.dropout_elements_per_s = r.non_negative(root, "", "dropout_Gelem_per_s") * 1e9;
  const YAML::Node b = root["backends"];
  if (!b || !b.IsMap() || b.size() == 0) r.fail("backends", "missing (a mapping of mpi, ucx, nccl to their links)");
  for (const auto& kv : b) {
    const std::string name = kv.first.as<std::string>();
    const std::string path = "backends." + name;
    if (name != "mpi" && name != "ucx" && name != "nccl") r.fail(path, "is not a backend (mpi, ucx, nccl)");
    const YAML::Node f = kv.second;
    r.only(f, path, {"intra", "inter", "intra_by_ranks", "overlaps_compute", "all_reduce_tree"});
    FabricSpec fabric;
    if (!f["intra"]) r.fail(path + ".intra", "missing");
    if (!f["inter"]) r.fail(path + ".inter", "missing");
    fabric.intra = r.link(f["intra"], path + ".intra");
    fabric.inter = r.link(f["inter"], path + ".inter");
    if (const YAML::Node m = f["intra_by_ranks"]) {
      if (!m.IsMap()) r.fail(path + ".intra_by_ranks", "is not a mapping of ranks to links");
      for (const auto& e : m) {
        const std::optional<int> n = number<int>(e.first);
        const std::string p = path + ".intra_by_ranks." + e.first.as<std::string>();
        if (!n || *n < 2) r.fail(p, "the key is not a number of ranks >= 2");
        fabric.intra_by_ranks.emplace_back(*n, r.link(e.second, p));
      }
      std::sort(fabric.intra_by_ranks.begin(), fabric.intra_by_ranks.end(),
                [](const auto& x, const auto& y) { return x.first < y.first; });
    }
    if (const YAML::Node o = f["overlaps_compute"]) {
      const std::optional<bool> v = config_internal::parse_bool(o);
      if (!v) r.fail(path + ".overlaps_compute", "is not true or false");
      fabric.overlaps_compute = *v;
    }
    if (const YAML::Node o = f["all_reduce_tree"]) {
      const std::optional<bool> v = config_internal::parse_bool(o);
      if (!v) r.fail(path + ".all_reduce_tree", "is not true or false");
      fabric.all_reduce_tree = *v;
    }
    c.backends[name] = std::move(fabric);
  }
  return c;
}

ClusterSpec load_cluster(const std::string& name_or_path) {
  for (const Preset& p : kPresets)
    if (name_or_path == p.name) return parse_cluster(p.yaml, "preset " + name_or_path);
  std::ifstream in(name_or_path);
  if (!in) {
    std::string names;
    for (const Preset& p : kPresets) {
      if (!names.empty()) names += ", ";
      names += p.name;
    }
    throw Error("--cluster " + name_or_path + ": no such preset (" + names + ") or readable file");
  }
  std::stringstream text;
  text << in.rdbuf();
  return parse_cluster(text.str(), name_or_path);
}

}  // namespace fsdp
