// sgemm_peak [--threads N] [--size N] [--reps R] [--memory | --dropout]
// Measures the single-precision GEMM rate the project's BLAS (OpenBLAS) reaches on this machine:
// C = A * B with square N x N f32 matrices (default 2048), R timed repetitions after one
// warm-up, and prints the best and median GFLOP/s (2 N^3 flops per product). The core benchmark
// (jobs/bench-core.sh) reports achieved model FLOP rates as a fraction of this peak.
// --memory instead measures memcpy of 256 MiB split over N threads (default 1): the best rate in
// GB/s (1e9 bytes copied per second) and the memory traffic it is (read + write, 2x), which is
// what a cluster file's memory_GBps holds (jobs/calibrate-cluster.sh).
// --dropout instead times the CPU kernels' dropout_forward (a Philox4x32-10 block per element)
// on 4 Mi elements: the best rate in G elements/s, a cluster file's dropout_Gelem_per_s. Its
// threads are OpenMP's (OMP_NUM_THREADS).
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tensor/kernels.h"

namespace {

[[noreturn]] void usage(const char* problem) {
  std::fprintf(stderr, "sgemm_peak: %s\nusage: sgemm_peak [--threads N] [--size N] [--reps R] [--memory | --dropout]\n",
               problem);
  std::exit(1);
}

long parse_positive(const char* flag, const char* text) {
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v <= 0) usage((std::string(flag) + " needs a positive integer").c_str());
  return v;
}

// The best of R copies of 256 MiB, each split into `threads` contiguous parts copied at once.
int memory_rate(long threads, long reps) {
  const size_t bytes = size_t{256} << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  const size_t part = bytes / static_cast<size_t>(threads);
  auto copy = [&] {
    std::vector<std::thread> pool;
    for (long t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const size_t off = part * static_cast<size_t>(t);
        std::memcpy(dst.data() + off, src.data() + off, t + 1 == threads ? bytes - off : part);
      });
    for (auto& th : pool) th.join();
  };
  copy();  // warm-up: page faults
  double best = 0;
  for (long r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    copy();
    best = std::max(best, static_cast<double>(bytes) /
                              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9);
  }
  std::printf("memcpy 256 MiB, %ld threads, %ld reps: best %.2f GB/s copied, memory traffic %.2f GB/s\n", threads, reps,
              best, 2 * best);
  return 0;
}

// The best of R dropout_forward calls over 4 Mi elements (p 0.1), as the trainer calls it.
int dropout_rate(long reps) {
  const int64_t n = int64_t{1} << 22;
  std::vector<float> x(static_cast<size_t>(n), 1.0f), y(x.size());
  std::vector<uint8_t> mask(x.size());
  const std::unique_ptr<fsdp::Kernels> kernels = fsdp::make_cpu_kernels();
  auto call = [&](uint64_t stream) {
    kernels->dropout_forward(y.data(), mask.data(), x.data(), 1, n, 0.1f, 7, stream, 0);
  };
  call(0);  // warm-up: page faults
  double best = 0;
  for (long r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    call(static_cast<uint64_t>(r) + 1);
    best = std::max(best, static_cast<double>(n) /
                              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9);
  }
  std::printf("dropout_forward 4 Mi elements, %ld reps: best %.4f G elements/s\n", reps, best);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  long threads = 0, n = 2048, reps = 5;
  bool memory = false, dropout = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help")
      usage("measures OpenBLAS sgemm GFLOP/s (--memory: memcpy GB/s; --dropout: dropout G elements/s)");
    if (a == "--memory" || a == "--dropout") {
      (a == "--memory" ? memory : dropout) = true;
      continue;
    }
    if (i + 1 >= argc) usage(("missing value after " + a).c_str());
    if (a == "--threads")
      threads = parse_positive("--threads", argv[++i]);
    else if (a == "--size")
      n = parse_positive("--size", argv[++i]);
    else if (a == "--reps")
      reps = parse_positive("--reps", argv[++i]);
    else
      usage(("unknown option " + a).c_str());
  }
  if (memory && dropout) usage("--memory and --dropout are two measurements: give one");
  if (memory) return memory_rate(threads > 0 ? threads : 1, reps);
  if (dropout) return dropout_rate(reps);
  if (threads > 0) openblas_set_num_threads(static_cast<int>(threads));

  const size_t elems = static_cast<size_t>(n) * n;
  std::vector<float> a(elems), b(elems), c(elems, 0.0f);
  for (size_t i = 0; i < elems; ++i) {  // values in [-1, 1), no denormals
    a[i] = static_cast<float>((i * 2654435761u) % 2048) / 1024.0f - 1.0f;
    b[i] = static_cast<float>((i * 40503u + 7) % 2048) / 1024.0f - 1.0f;
  }
  auto gemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(n), static_cast<int>(n),
                static_cast<int>(n), 1.0f, a.data(), static_cast<int>(n), b.data(), static_cast<int>(n), 0.0f, c.data(),
                static_cast<int>(n));
  };
  gemm();  // warm-up: thread pool start, page faults
  std::vector<double> rates;
  for (long r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    gemm();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(2.0 * n * n * n / s / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  std::printf("sgemm %ldx%ldx%ld, %d threads, %ld reps: best %.1f GFLOP/s, median %.1f GFLOP/s\n", n, n, n,
              openblas_get_num_threads(), reps, rates.back(), rates[rates.size() / 2]);
  return 0;
}
