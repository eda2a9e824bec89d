#pragma once
// The clock of a timed plan (train/plan.h, `fsdp_app --plan --cluster C`): the meta device's
// kernels (tensor/meta_runtime.h) and the meta communicator's collectives (comm/meta_comm.h)
// advance it instead of working, in the order the real trainer issues them. So the plan's step
// time follows the engine's actual schedule: every unit's all_gather where it is issued
// (prefetch included), every wait where the engine waits, every kernel on its stream.
//
// Lanes and their rules (those of the runtime being planned):
//   host     the calling thread. On the CPU it is also the compute stream (HostRuntime has one
//            stream); on a GPU it only waits (synchronize, host values): launches are asynchronous
//            and their host cost is in each kernel's overhead.
//   compute  a GPU's compute stream: a kernel starts when the lane and the host have reached it.
//   comm     the communication stream: a collective starts when the lane (which waited for
//            compute's events) and the host have reached it. Where the cluster says the backend
//            does not progress in the background (MPI and UCX on the CPU: a nonblocking collective
//            moves when its rank polls; Debian's MPI on a GPU node stages through the host),
//            collectives run on the compute lane instead: no overlap.
// An event carries its lane's time; waiting on it moves the waiting lane forward to it.
#include <array>
#include <cstdint>

#include "tensor/matmul_precision.h"

namespace fsdp {

// One device's rates. GEMMs take max(flops / rate, bytes / memory bandwidth); every other kernel
// is memory-bound: bytes / memory bandwidth. Each kernel adds kernel_overhead_s (a GPU launch,
// an OpenMP fork on the CPU).
struct DeviceRates {
  double f32_gemm_flops_per_s = 0;   // matmul_precision highest (plain f32 FMAs)
  double tf32_gemm_flops_per_s = 0;  // high: TF32 tensor cores on CUDA (the CPU's f32 rate there)
  double bf16_gemm_flops_per_s = 0;  // medium, and param_dtype bf16's GEMMs
  double memory_bytes_per_s = 0;
  double host_link_bytes_per_s = 0;  // host <-> device copies (PCIe/C2C); the CPU: memory
  double kernel_overhead_s = 0;
  // Small GEMMs reach less of the rate: one whose smallest dimension is d runs at
  // d / (d + gemm_half_dim) of it (0: every GEMM at the full rate).
  double gemm_half_dim = 0;
  // Dropout's random numbers (a Philox4x32-10 block per element): elements per second one
  // kernel reaches; 0: dropout is memory-bound like the rest (the GPU presets: not measured on
  // a GPU). On a CPU core they are 40x slower than its traffic (sgemm_peak --dropout).
  double dropout_elements_per_s = 0;
  // Ranks that share this device's rates (CPU ranks on shared cores): each kernel takes this
  // many times longer.
  int ranks_per_device = 1;
};

enum class Lane : uint8_t { host, compute, comm };
constexpr int kLaneCount = 3;

enum class CollectiveKind : uint8_t { all_gather, reduce_scatter, all_reduce, broadcast };
constexpr int kCollectiveKindCount = 4;

class Timeline {
 public:
  // device_streams: a GPU plan (separate compute and comm lanes); false: the CPU's one stream.
  // comm_overlaps: whether collectives progress on their own lane (see above).
  Timeline(const DeviceRates& rates, bool device_streams, bool comm_overlaps);

  // Kernels (on the compute lane; the host lane on the CPU).
  // min_dim: the GEMM's smallest dimension (M, N or K).
  void gemm(double flops, double bytes, double min_dim, MatmulPrecision precision, bool bf16_operands);
  void memory_bound(double bytes);
  // Dropout's forward: memory-bound, or bound by its random numbers where the rate is set.
  void dropout(double bytes, double elements);
  // A copy or memset on `lane` (a staging copy may be on the comm stream); host <-> device copies
  // at the host link's rate, the rest at memory bandwidth (read and write: 2 x bytes).
  void copy_on(Lane lane, double bytes, bool crosses_host_link);
  // A collective issued on `lane` now, taking `seconds`: returns the time it ends.
  double collective(Lane lane, CollectiveKind kind, double seconds);

  // Stream::native of a planned GPU's compute and comm streams (the meta runtime hands these
  // out); null is the host's.
  void* tag(Lane lane) { return lane == Lane::host ? nullptr : &tags_[static_cast<size_t>(lane)]; }
  Lane lane_of(const void* native) const {
    return native == &tags_[1] ? Lane::compute : native == &tags_[2] ? Lane::comm : Lane::host;
  }

  double now(Lane lane) const { return clock_[static_cast<size_t>(lane)]; }
  void wait_until(Lane lane, double t);  // the lane waits for an event at time t
  double latest() const;                 // the time every lane has reached

  // Busy seconds so far: kernels (GEMMs and the rest) and collectives by kind.
  struct Busy {
    double gemm_s = 0, memory_bound_s = 0, copy_s = 0;
    double gemm_flops = 0;
    int64_t kernels = 0;  // GEMMs and memory-bound kernels: each paid kernel_overhead_s
    std::array<double, kCollectiveKindCount> collective_s{};
    std::array<int64_t, kCollectiveKindCount> collective_calls{};
  };
  const Busy& busy() const { return busy_; }
  const DeviceRates& rates() const { return rates_; }
  bool device_streams() const { return device_streams_; }

 private:
  Lane kernel_lane() const { return device_streams_ ? Lane::compute : Lane::host; }
  // Runs `seconds` of work on `lane`: starts when the lane and the host have reached it.
  double run(Lane lane, double seconds);
  // A kernel other than a GEMM taking alone_s on a device of its own: the ranks sharing the
  // device and the launch overhead added, counted as memory-bound.
  void non_gemm_kernel(double alone_s);

  DeviceRates rates_;
  bool device_streams_, comm_overlaps_;
  std::array<double, kLaneCount> clock_{};
  std::array<char, kLaneCount> tags_{};
  Busy busy_;
};

}  // namespace fsdp
