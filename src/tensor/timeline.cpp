#include "tensor/timeline.h"

#include <algorithm>

namespace fsdp {

Timeline::Timeline(const DeviceRates& rates, bool device_streams, bool comm_overlaps)
    : rates_(rates), device_streams_(device_streams), comm_overlaps_(comm_overlaps) {}

double Timeline::run(Lane lane, double seconds) {
  double& clock = clock_[static_cast<size_t>(lane)];
  clock = std::max(clock, now(Lane::host)) + seconds;
  return clock;
}

void Timeline::gemm(double flops, double bytes, double min_dim, MatmulPrecision precision, bool bf16_operands) {
  double rate = rates_.f32_gemm_flops_per_s;
  if (bf16_operands || precision == MatmulPrecision::medium)
    rate = rates_.bf16_gemm_flops_per_s;
  else if (precision == MatmulPrecision::high)
    rate = rates_.tf32_gemm_flops_per_s;
  if (rates_.gemm_half_dim > 0) rate *= min_dim / (min_dim + rates_.gemm_half_dim);
  const double s =
      std::max(flops / rate, bytes / rates_.memory_bytes_per_s) * rates_.ranks_per_device + rates_.kernel_overhead_s;
  busy_.gemm_s += s;
  busy_.gemm_flops += flops;
  ++busy_.kernels;
  run(kernel_lane(), s);
}

void Timeline::memory_bound(double bytes) { non_gemm_kernel(bytes / rates_.memory_bytes_per_s); }

void Timeline::dropout(double bytes, double elements) {
  double s = bytes / rates_.memory_bytes_per_s;
  if (rates_.dropout_elements_per_s > 0) s = std::max(s, elements / rates_.dropout_elements_per_s);
  non_gemm_kernel(s);
}

void Timeline::non_gemm_kernel(double alone_s) {
  const double s = alone_s * rates_.ranks_per_device + rates_.kernel_overhead_s;
  busy_.memory_bound_s += s;
  ++busy_.kernels;
  run(kernel_lane(), s);
}

void Timeline::copy_on(Lane lane, double bytes, bool crosses_host_link) {
  if (bytes <= 0) return;
  const double s = crosses_host_link ? bytes / rates_.host_link_bytes_per_s
                                     : 2 * bytes / rates_.memory_bytes_per_s * rates_.ranks_per_device;
  busy_.copy_s += s;
  run(device_streams_ ? lane : Lane::host, s);
}

double Timeline::collective(Lane lane, CollectiveKind kind, double seconds) {
  const auto k = static_cast<size_t>(kind);
  busy_.collective_s[k] += seconds;
  ++busy_.collective_calls[k];
  // Without background progress the collective holds up compute: the rank moves the data
  // itself (the CPU), or the device waits for host-staged copies.
  return run(comm_overlaps_ ? (device_streams_ ? lane : Lane::comm) : kernel_lane(), seconds);
}

void Timeline::wait_until(Lane lane, double t) {
  double& clock = clock_[static_cast<size_t>(device_streams_ || lane == Lane::comm ? lane : Lane::host)];
  clock = std::max(clock, t);
}

double Timeline::latest() const { return *std::max_element(clock_.begin(), clock_.end()); }

}  // namespace fsdp
