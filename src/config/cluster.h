#pragma once
// A cluster description for the timed plan (`fsdp_app IN.yaml --plan --cluster C`, train/plan.h):
// what a node has and how fast its parts are. C is a preset's name (cluster_preset_names(); the
// numbers' sources are in config/cluster.cpp) or a YAML file of this shape (all keys required
// unless marked):
//
//   name: dgx-h100
//   device: cuda                  # cpu | cuda: where the planned ranks compute
//   devices_per_node: 8           # GPUs; on a CPU node, the cores ranks compute on
//   device_memory_GiB: 80         # cuda only
//   host_memory_GiB: 2048
//   gemm_TFLOPs: {f32: 66.9, tf32: 494.7, bf16: 989.4}   # dense peaks: MFU's denominator
//   gemm_efficiency: 0.75         # the fraction of the peak a large GEMM reaches (sgemm_peak,
//                                 # cuBLAS): the plan's GEMM time is FLOPs / (peak x this)
//   gemm_half_dim: 0              # optional: a GEMM of smallest dimension d runs at
//                                 # d / (d + this) of that rate (small GEMMs; 0: none)
//   dropout_Gelem_per_s: 0        # optional: dropout's random numbers per second (sgemm_peak
//                                 # --dropout; 0 or absent: dropout is memory-bound)
//   memory_GBps: 3350             # what a streaming kernel reaches (memory-bound ops)
//   host_link_GBps: 55            # host <-> device copies (cpu: unused)
//   kernel_overhead_us: 5         # per kernel (launch; on the CPU, the loop's start)
//   backends:                     # per comm.backend: the links (comm/collective_cost.h)
//     nccl:
//       intra: {busbw_GBps: 360, latency_us: 7}
//       inter: {busbw_GBps: 45, latency_us: 15}
//       intra_by_ranks: {2: {busbw_GBps: 5.1, latency_us: 12}, 4: {...}}   # optional
//       overlaps_compute: true    # optional (default true)
//       all_reduce_tree: true     # optional (default false): all_reduce may run as a tree
//
// GB = 1e9 bytes, GiB = 2^30. Errors name the file and key.
#include <map>
#include <string>
#include <vector>

#include "comm/collective_cost.h"
#include "tensor/tensor.h"  // Device
#include "tensor/timeline.h"

namespace fsdp {

struct ClusterSpec {
  std::string name;
  std::string source;  // the file, or "preset"
  Device device = Device::cpu;
  int devices_per_node = 1;
  double device_memory_bytes = 0;  // 0 on a CPU node
  double host_memory_bytes = 0;
  // Dense GEMM peaks (MFU) and the rates the timeline runs at (peaks x gemm_efficiency).
  double peak_f32_flops_per_s = 0, peak_tf32_flops_per_s = 0, peak_bf16_flops_per_s = 0;
  double gemm_efficiency = 1;
  DeviceRates rates;  // ranks_per_device 1: the plan sets it from the ranks per node
  std::map<std::string, FabricSpec> backends;

  // The backend's links, or Error naming the backends the description has.
  const FabricSpec& fabric(const std::string& backend) const;
};

std::vector<std::string> cluster_preset_names();
// A preset's name or a YAML file's path; Error with one line naming the problem.
ClusterSpec load_cluster(const std::string& name_or_path);
ClusterSpec parse_cluster(const std::string& yaml_text, const std::string& source);

}  // namespace fsdp
