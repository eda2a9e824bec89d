#define BOOST_TEST_MODULE fake_device
#include <boost/test/unit_test.hpp>
// The fake device of tests/fake_device.h, which test_engine_streams trusts to expose ordering
// bugs: work waits for the host or for events, pageable copies follow cudaMemcpyAsync's rules,
// freed and new memory is poison, a dropped stream wait is visible, and the host touching device
// memory ends the process with a message.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fake_device.h"

using fsdp::CopyKind;
using fsdp::MemCategory;
using fsdp::testing::FakeDevice;
using fsdp::testing::FakeDeviceOptions;

namespace {

constexpr size_t kCount = 1000;
constexpr size_t kBytes = kCount * sizeof(float);

bool all_poison(const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (!std::isnan(x[i])) return false;
  return true;
}

bool all_equal(const float* x, size_t n, float v) {
  for (size_t i = 0; i < n; ++i)
    if (x[i] != v) return false;
  return true;
}

}  // namespace

BOOST_AUTO_TEST_CASE(copies_run_only_when_the_host_waits) {
  fsdp::MemoryTracker mem;
  FakeDevice dev(mem);
  auto* pinned = static_cast<float*>(dev.allocate_pinned(kBytes));
  auto* out = static_cast<float*>(dev.allocate_pinned(kBytes));
  for (size_t i = 0; i < kCount; ++i) pinned[i] = static_cast<float>(i);
  void* d = dev.allocate(kBytes, MemCategory::activations, dev.compute_stream());
  BOOST_TEST(dev.is_device_pointer(d));
  BOOST_TEST(!dev.is_device_pointer(pinned));
  dev.copy_async(d, pinned, kBytes, CopyKind::host_to_device, dev.compute_stream());
  dev.copy_async(out, d, kBytes, CopyKind::device_to_host, dev.compute_stream());
  auto event = dev.record(dev.compute_stream());
  BOOST_TEST(dev.pending(dev.compute_stream()) == 2u);
  BOOST_TEST(!event->done());
  BOOST_TEST(all_poison(out, kCount));  // nothing ran yet
  dev.synchronize(*event, 1.0);
  BOOST_TEST(event->done());
  BOOST_TEST(out[0] == 0.0f);
  BOOST_TEST(out[kCount - 1] == static_cast<float>(kCount - 1));
  BOOST_TEST(dev.errors().empty());
  dev.deallocate(d, kBytes, MemCategory::activations, dev.compute_stream());
  dev.free_pinned(pinned);
  dev.free_pinned(out);
}

BOOST_AUTO_TEST_CASE(pageable_copies_follow_cuda_rules) {
  // cudaMemcpyAsync from pageable memory takes the bytes before returning; into pageable memory
  // it returns when the copy is done.
  fsdp::MemoryTracker mem;
  FakeDevice dev(mem);
  std::vector<float> src(kCount, 3.0f), dst(kCount, 0.0f);
  void* d = dev.allocate(kBytes, MemCategory::activations, dev.compute_stream());
  dev.copy_async(d, src.data(), kBytes, CopyKind::host_to_device, dev.compute_stream());
  std::fill(src.begin(), src.end(), 7.0f);  // too late to matter
  dev.copy_async(dst.data(), d, kBytes, CopyKind::device_to_host, dev.compute_stream());
  BOOST_TEST(dev.pending(dev.compute_stream()) == 0u);
  BOOST_TEST(all_equal(dst.data(), kCount, 3.0f));
  dev.deallocate(d, kBytes, MemCategory::activations, dev.compute_stream());
}

BOOST_AUTO_TEST_CASE(a_stream_wait_orders_the_other_stream) {
  for (bool drop : {false, true}) {
    fsdp::MemoryTracker mem;
    FakeDeviceOptions o;
    o.drop_stream_waits = drop;
    FakeDevice dev(mem, o);
    auto* out = static_cast<float*>(dev.allocate_pinned(kBytes));
    auto* d = static_cast<float*>(dev.allocate(kBytes, MemCategory::activations, dev.compute_stream()));
    dev.kernels().fill(d, 5.0f, kCount);  // on the compute stream
    dev.wait(dev.comm_stream(), *dev.record(dev.compute_stream()));
    dev.copy_async(out, d, kBytes, CopyKind::device_to_host, dev.comm_stream());
    dev.synchronize(dev.comm_stream());
    if (drop)
      BOOST_TEST(all_poison(out, kCount), "without the wait the copy read the block before the fill ran");
    else
      BOOST_TEST(all_equal(out, kCount, 5.0f));
    BOOST_TEST(dev.counts().stream_waits == 1u);
    dev.synchronize(dev.compute_stream());
    dev.deallocate(d, kBytes, MemCategory::activations, dev.compute_stream());
    dev.free_pinned(out);
  }
}

BOOST_AUTO_TEST_CASE(freed_blocks_are_poisoned_in_stream_order) {
  fsdp::MemoryTracker mem;
  FakeDevice dev(mem);
  auto* out = static_cast<float*>(dev.allocate_pinned(kBytes));
  const fsdp::Stream s = dev.compute_stream();
  auto* a = static_cast<float*>(dev.allocate(kBytes, MemCategory::activations, s));
  dev.kernels().fill(a, 1.0f, kCount);
  dev.copy_async(out, a, kBytes, CopyKind::device_to_host, s);  // before the free: sees 1
  dev.deallocate(a, kBytes, MemCategory::activations, s);
  auto* b = static_cast<float*>(dev.allocate(kBytes, MemCategory::activations, s));
  BOOST_TEST(b == a);  // same stream: the cached block comes back at once
  dev.synchronize(s);
  BOOST_TEST(all_equal(out, kCount, 1.0f));
  dev.copy_async(out, b, kBytes, CopyKind::device_to_host, s);
  dev.synchronize(s);
  BOOST_TEST(all_poison(out, kCount), "a reused block must not hold its last owner's values");
  BOOST_TEST(mem.current_bytes(MemCategory::activations) == kBytes);
  dev.deallocate(b, kBytes, MemCategory::activations, s);
  BOOST_TEST(mem.current_bytes(MemCategory::activations) == 0u);
  dev.free_pinned(out);
}

BOOST_AUTO_TEST_CASE(host_value_kernels_wait_for_the_stream) {
  fsdp::MemoryTracker mem;
  FakeDevice dev(mem);
  auto* d = static_cast<float*>(dev.allocate(kBytes, MemCategory::activations, dev.compute_stream()));
  dev.kernels().fill(d, 2.0f, kCount);
  BOOST_TEST(dev.kernels().sum_squares(d, kCount) == 4.0 * kCount);
  BOOST_TEST(dev.kernels().all_finite(d, kCount));
  dev.kernels().scale(d, INFINITY, 1);
  BOOST_TEST(!dev.kernels().all_finite(d, kCount));
  BOOST_TEST(dev.counts().kernels == 5u);
  dev.deallocate(d, kBytes, MemCategory::activations, dev.compute_stream());
}

BOOST_AUTO_TEST_CASE(the_host_touching_device_memory_ends_the_process) {
  int pipe_fds[2];
  BOOST_REQUIRE(pipe(pipe_fds) == 0);
  pid_t child = fork();
  BOOST_REQUIRE(child >= 0);
  if (child == 0) {
    dup2(pipe_fds[1], STDERR_FILENO);
    close(pipe_fds[0]);
    fsdp::MemoryTracker mem;
    FakeDevice dev(mem);
    auto* d = static_cast<volatile float*>(dev.allocate(kBytes, MemCategory::activations, dev.compute_stream()));
    float v = d[3];  // a host read of a device pointer: faults
    _exit(v == v ? 0 : 1);
  }
  close(pipe_fds[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = read(pipe_fds[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
  close(pipe_fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  BOOST_TEST(WIFEXITED(status));
  BOOST_TEST(WEXITSTATUS(status) == fsdp::testing::kHostTouchExit);
  BOOST_TEST(text.find("fake device: host code touched device memory (arena offset 12) outside any stream "
                       "operation") != std::string::npos,
             text);
}

BOOST_AUTO_TEST_CASE(copies_between_the_wrong_spaces_are_noted) {
  fsdp::MemoryTracker mem;
  FakeDevice dev(mem);
  std::vector<float> a(4), b(4);
  dev.copy_async(a.data(), b.data(), 16, CopyKind::host_to_device, dev.compute_stream());
  BOOST_REQUIRE(dev.errors().size() == 1u);
  BOOST_TEST(dev.errors()[0] == "host_to_device copy between the wrong memory spaces");
  dev.synchronize(dev.compute_stream());
}
