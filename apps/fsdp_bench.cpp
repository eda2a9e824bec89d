// fsdp_bench [--backend mpi,ucx,nccl|all] [--op all_gather,reduce_scatter,all_reduce|all]
//            [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-n ITERS] [-w WARMUP] [-d DTYPE]
//            [--csv FILE] [--timeout S] [--device cpu|cuda]
// Compares the collective backends with each other and with the MPI library called directly,
// in nccl-tests' terms: for each op and size, the average time of one collective, the
// algorithm bandwidth and the bus bandwidth, and the number of wrong elements in the output.
//
//   size  = the whole array in bytes: the all_gather output, the reduce_scatter input, the
//           all_reduce buffer. count = the Communicator's count argument (elements per rank
//           for all_gather and reduce_scatter, the whole array for all_reduce).
//   algbw = size / time
//   busbw = algbw * (n-1)/n for all_gather and reduce_scatter, algbw * 2(n-1)/n for
//           all_reduce: what each rank's link carries in a bandwidth-optimal ring, so the
//           numbers compare across world sizes and with the hardware's bandwidth.
//   time  = average over -n iterations after -w warmup ones, started after a barrier, the
//           maximum over ranks.
// Reductions are sums. Every size is checked: inputs are small integers that depend on the
// rank and the index, so every sum is exact in every dtype (bf16 holds integers up to 256
// exactly, and |sum| <= nranks) and each output element has one right value.
//
// --device cuda: the backends' buffers are the rank's GPU memory (the device runtime of
// tensor/device.h, GPU local_rank % count); inputs are uploaded before and outputs copied back
// for the check after the timed loop. Backends without native device buffers (mpi, ucx) take
// them through comm/device_comm.h (staged through pinned host memory unless the MPI is
// CUDA-aware), so their rows include those copies. mpi-raw always runs on host buffers.
#include <mpi.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cli.h"
#include "comm/agree.h"
#include "comm/comm.h"
#include "comm/mpi_env.h"
#include "mpi/mpi_types.h"
#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/memory.h"

namespace {

using fsdp::DType;
using fsdp::Error;

constexpr const char* kDescription =
    "Measures the collectives of every built backend and of the MPI library called directly, in\n"
    "nccl-tests' terms: time, algorithm and bus bandwidth, wrong elements.";
constexpr const char* kFooter =
    "Sizes take K, M, G suffixes (powers of 1024). Run under mpirun/srun for more than one rank.\n"
    "--device cuda: the backends' buffers live on the rank's GPU (mpi-raw stays on the host).";

// ---- values: every dtype through double (all values used here are exact in it) ----

// An unsigned result wraps; every other dtype holds these small integers exactly.
double as_stored(double v, DType d) { return d == DType::u8 ? static_cast<double>(static_cast<int64_t>(v) & 0xff) : v; }

// all_gather: any rank- and index-dependent value in [0, 240] (exact in every dtype).
double gather_value(int rank, size_t i) {
  return static_cast<double>((static_cast<uint64_t>(rank) * 131 + i * 7) % 241);
}
// sums: one of -1, 0, 1 (u8: 0, 1, 2), so any partial sum has |s| <= 2 nranks.
double sum_value(int rank, size_t i, DType d) {
  double v = static_cast<double>((static_cast<uint64_t>(rank) * 3 + i) % 3);
  return d == DType::u8 ? v : v - 1;
}
double expected_sum(int nranks, size_t i, DType d) {
  double s = 0;
  for (int r = 0; r < nranks; ++r) s += sum_value(r, i, d);
  return as_stored(s, d);
}

// A value no correct output holds, so an element never written is counted wrong (u8: gathers
// are <= 240 and sums <= 2 nranks).
double sentinel(DType d) { return d == DType::u8 ? 255 : -77; }

void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(std::string("raw ") + what + ": " + std::string(msg, len));
}

// ---- one descriptor per collective: the only place that knows its shape and formula ----

struct Collective {
  const char* name;
  double (*factor)(int n);                                           // busbw = algbw * factor(nranks)
  size_t (*count_for)(size_t size_bytes, int n, size_t elem_bytes);  // the Communicator's count
  size_t (*size_of)(size_t count, int n, size_t elem_bytes);         // whole array in bytes
  size_t (*in_count)(size_t count, int n);
  size_t (*out_count)(size_t count, int n);
  void (*fill_in)(void* in, size_t count, DType d, int rank, int n);
  double (*expected)(size_t j, size_t count, DType d, int rank, int n);  // out[j]
  std::unique_ptr<fsdp::Work> (*issue)(fsdp::Communicator& c, const void* in, void* out, size_t count, DType d);
  // The raw-MPI baseline; type and sum from mpi_types.h, as the MPI backend uses them.
  void (*raw)(const void* in, void* out, size_t count, MPI_Datatype type, MPI_Op sum, MPI_Comm comm);
};

int to_int(size_t count) {
  if (count > static_cast<size_t>(INT32_MAX))
    throw Error("count " + std::to_string(count) + " exceeds MPI's int range");
  return static_cast<int>(count);
}

constexpr Collective kAllGather = {
    "all_gather",
    [](int n) { return (n - 1) / static_cast<double>(n); },
    [](size_t bytes, int n, size_t b) { return bytes / (static_cast<size_t>(n) * b); },
    [](size_t count, int n, size_t b) { return count * static_cast<size_t>(n) * b; },
    [](size_t count, int) { return count; },
    [](size_t count, int n) { return count * static_cast<size_t>(n); },
    [](void* in, size_t count, DType d, int rank, int) {
      for (size_t i = 0; i < count; ++i) fsdp::store_element(in, d, i, gather_value(rank, i));
    },
    [](size_t j, size_t count, DType, int, int) { return gather_value(static_cast<int>(j / count), j % count); },
    [](fsdp::Communicator& c, const void* in, void* out, size_t count, DType d) {
      return c.all_gather(in, out, count, d);
    },
    [](const void* in, void* out, size_t count, MPI_Datatype type, MPI_Op, MPI_Comm comm) {
      mpi_check(MPI_Allgather(in, to_int(count), type, out, to_int(count), type, comm), "MPI_Allgather");
    },
};

constexpr Collective kReduceScatter = {
    "reduce_scatter",
    [](int n) { return (n - 1) / static_cast<double>(n); },
    [](size_t bytes, int n, size_t b) { return bytes / (static_cast<size_t>(n) * b); },
    [](size_t count, int n, size_t b) { return count * static_cast<size_t>(n) * b; },
    [](size_t count, int n) { return count * static_cast<size_t>(n); },
    [](size_t count, int) { return count; },
    [](void* in, size_t count, DType d, int rank, int n) {
      for (size_t i = 0; i < count * static_cast<size_t>(n); ++i) fsdp::store_element(in, d, i, sum_value(rank, i, d));
    },
    [](size_t j, size_t count, DType d, int rank, int n) {
      return expected_sum(n, static_cast<size_t>(rank) * count + j, d);
    },
    [](fsdp::Communicator& c, const void* in, void* out, size_t count, DType d) {
      return c.reduce_scatter(in, out, count, d, fsdp::ReduceOp::sum);
    },
    [](const void* in, void* out, size_t count, MPI_Datatype type, MPI_Op sum, MPI_Comm comm) {
      mpi_check(MPI_Reduce_scatter_block(in, out, to_int(count), type, sum, comm), "MPI_Reduce_scatter_block");
    },
};

constexpr Collective kAllReduce = {
    "all_reduce",
    [](int n) { return 2.0 * (n - 1) / static_cast<double>(n); },
    [](size_t bytes, int, size_t b) { return bytes / b; },
    [](size_t count, int, size_t b) { return count * b; },
    [](size_t count, int) { return count; },
    [](size_t count, int) { return count; },
    [](void* in, size_t count, DType d, int rank, int) {
      for (size_t i = 0; i < count; ++i) fsdp::store_element(in, d, i, sum_value(rank, i, d));
    },
    [](size_t j, size_t, DType d, int, int n) { return expected_sum(n, j, d); },
    [](fsdp::Communicator& c, const void* in, void* out, size_t count, DType d) {
      return c.all_reduce(in, out, count, d, fsdp::ReduceOp::sum);
    },
    [](const void* in, void* out, size_t count, MPI_Datatype type, MPI_Op sum, MPI_Comm comm) {
      mpi_check(MPI_Allreduce(in, out, to_int(count), type, sum, comm), "MPI_Allreduce");
    },
};

const Collective* const kCollectives[] = {&kAllGather, &kReduceScatter, &kAllReduce};

// ---- options ----

struct Args {
  std::vector<std::string> backends;  // empty until resolved; "all" expands to built_backends()
  std::vector<const Collective*> ops;
  size_t min_bytes = 1024, max_bytes = 64u << 20;
  uint64_t factor = 2;
  int iters = 20, warmup = 5;
  DType dtype = DType::f32;
  std::string csv;
  double timeout_s = 60;
  fsdp::Device device = fsdp::Device::cpu;
  fsdp::DeviceBuffers device_buffers = fsdp::DeviceBuffers::automatic;  // --device cuda on mpi/ucx
  bool help = false;                                                    // -h/--help: print help_text
  std::string help_text;                                                // CLI11's, from the options in parse_args
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    if (comma > start) out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// "1K" -> 1024 (K, M, G: powers of 1024); the option's text as CLI11 then reads it.
std::string parse_bytes(const std::string& v) {
  if (v.empty() || !std::isdigit(static_cast<unsigned char>(v[0])))
    throw Error("expected a size in bytes like 1024, 1K, 64M or 1G, got '" + v + "'");
  errno = 0;
  char* end = nullptr;
  unsigned long long n = std::strtoull(v.c_str(), &end, 10);
  std::string suffix(end);
  unsigned shift = 0;
  if (suffix == "K" || suffix == "k")
    shift = 10;
  else if (suffix == "M" || suffix == "m")
    shift = 20;
  else if (suffix == "G" || suffix == "g")
    shift = 30;
  else if (!suffix.empty())
    throw Error("unknown size suffix '" + suffix + "' in '" + v + "' (use K, M or G)");
  if (errno == ERANGE || n > (~0ull >> shift)) throw Error("'" + v + "' is too large");
  return std::to_string(n << shift);
}

std::string parse_timeout(const std::string& v) {
  char* end = nullptr;
  const double s = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !(s > 0) || !std::isfinite(s))
    throw Error("expected a positive number of seconds, got '" + v + "'");
  return v;
}

fsdp::DeviceBuffers parse_device_buffers(const std::string& v) {
  for (const auto& [value, name] : fsdp::kDeviceBuffers)
    if (v == name) return value;
  throw Error("expected auto, staged or direct, got '" + v + "'");
}

// The options, their checks and help. Values of the library's own types (dtype, device) are
// checked by the library's parsers here and converted after parsing.
void add_options(CLI::App& app, Args& a, std::string& backends, std::string& ops, std::string& dtype,
                 std::string& device_buffers, std::string& device) {
  app.add_option("--backend", backends, "comma-separated mpi, ucx, nccl, or all (every built one)")
      ->type_name("LIST")
      ->capture_default_str();
  app.add_option("--op", ops, "comma-separated all_gather, reduce_scatter, all_reduce, or all")
      ->type_name("LIST")
      ->capture_default_str();
  app.add_option("-b,--minbytes", a.min_bytes, "smallest size (the whole array, bytes)")
      ->type_name("SIZE")
      ->capture_default_str()
      ->transform(fsdp_cli::parsed_by(parse_bytes));
  app.add_option("-e,--maxbytes", a.max_bytes, "largest size")
      ->type_name("SIZE")
      ->capture_default_str()
      ->transform(fsdp_cli::parsed_by(parse_bytes));
  app.add_option("-f,--stepfactor", a.factor, "multiply the size by this from one size to the next")
      ->capture_default_str()
      ->check(fsdp_cli::integer_in(2, 1 << 20));
  app.add_option("-n,--iters", a.iters, "timed iterations per size")
      ->capture_default_str()
      ->check(fsdp_cli::integer_in(1, 1 << 30));
  app.add_option("-w,--warmup_iters", a.warmup, "untimed iterations before them")
      ->capture_default_str()
      ->check(fsdp_cli::integer_in(0, 1 << 30));
  app.add_option("-d,--datatype", dtype, "element type")
      ->type_name("f32|bf16|f16|f64|i32|i64|u8")
      ->capture_default_str()
      ->check(fsdp_cli::accepted_by([](const std::string& v) { fsdp::parse_dtype(v); }));
  app.add_option("--csv", a.csv, "also write the rows to FILE as CSV (jobs/plot-bench.sh draws it)")->type_name("FILE");
  app.add_option("--timeout", a.timeout_s, "seconds a collective may take before the job ends")
      ->type_name("S")
      ->capture_default_str()
      ->check(fsdp_cli::parsed_by(parse_timeout));
  app.add_option("--device", device, "where the backends' buffers live (mpi-raw stays on the host)")
      ->type_name("cpu|cuda")
      ->capture_default_str()
      ->check(fsdp_cli::accepted_by([](const std::string& v) { fsdp::parse_device(v); }));
  app.add_option("--device-buffers", device_buffers,
                 "--device cuda on mpi/ucx: auto (device pointers where the library reads device memory, else "
                 "pinned staging), staged, or direct (device pointers without asking); as comm.device_buffers")
      ->type_name("auto|staged|direct")
      ->capture_default_str()
      ->check(fsdp_cli::accepted_by([](const std::string& v) { parse_device_buffers(v); }));
}

// CLI11 over the options above, then the checks that span options and the lists' names.
Args parse_args(int argc, char** argv) {
  Args a;
  std::string backend_list = "all", op_list = "all", dtype = "f32", device = "cpu", device_buffers = "auto";
  CLI::App app{kDescription, "fsdp_bench"};
  fsdp_cli::configure(app);
  app.footer(kFooter);
  add_options(app, a, backend_list, op_list, dtype, device_buffers, device);
  if (fsdp_cli::parse(app, argc, argv)) {
    a.help = true;
    a.help_text = app.help();
    return a;
  }
  a.dtype = fsdp::parse_dtype(dtype);
  a.device = fsdp::parse_device(device);
  a.device_buffers = parse_device_buffers(device_buffers);
  if (a.min_bytes == 0) throw Error("-b 0: the smallest size must be at least 1 byte");
  if (a.max_bytes < a.min_bytes)
    throw Error("-e " + std::to_string(a.max_bytes) + " is smaller than -b " + std::to_string(a.min_bytes));

  std::vector<std::string> built = fsdp::built_backends();
  for (const std::string& b : split_list(backend_list)) {
    if (b == "all") {
      for (const auto& x : built)
        if (std::find(a.backends.begin(), a.backends.end(), x) == a.backends.end()) a.backends.push_back(x);
    } else if (std::find(built.begin(), built.end(), b) == built.end()) {
      throw Error("--backend " + b + ": not built in this binary (built: " + join(built) + ")");
    } else if (std::find(a.backends.begin(), a.backends.end(), b) == a.backends.end()) {
      a.backends.push_back(b);
    }
  }
  if (split_list(backend_list).empty()) throw Error("--backend: empty list (built: " + join(built) + ")");
  for (const std::string& o : split_list(op_list)) {
    bool found = false;
    for (const Collective* c : kCollectives) {
      if (o == "all" || o == c->name) {
        found = true;
        if (std::find(a.ops.begin(), a.ops.end(), c) == a.ops.end()) a.ops.push_back(c);
      }
    }
    if (!found) throw Error("--op " + o + ": unknown (all_gather, reduce_scatter, all_reduce or all)");
  }
  if (a.ops.empty()) throw Error("--op: empty list (all_gather, reduce_scatter, all_reduce or all)");
  // Keep the descriptor order whatever order the user named them in.
  std::sort(a.ops.begin(), a.ops.end(), [](const Collective* x, const Collective* y) {
    return std::find(std::begin(kCollectives), std::end(kCollectives), x) <
           std::find(std::begin(kCollectives), std::end(kCollectives), y);
  });
  return a;
}

// ---- measurement ----

struct Row {
  std::string backend, op;
  size_t size_bytes = 0, count = 0;
  DType dtype = DType::f32;
  double time_us = 0, algbw_GBps = 0, busbw_GBps = 0;
  uint64_t wrong = 0;
};

// A buffer the collective works on: host memory (aligned, untouched until filled), or device
// memory of `rt` with a host copy that values are written to and checked in.
class BenchBuffer {
 public:
  BenchBuffer(size_t bytes, fsdp::DeviceRuntime* rt)
      : host_(static_cast<char*>(std::aligned_alloc(64, std::max<size_t>(64, (bytes + 63) / 64 * 64))), std::free),
        rt_(rt),
        bytes_(bytes) {
    if (!host_) throw std::bad_alloc();
    if (rt_) device_ = rt_->allocate(bytes_, fsdp::MemCategory::comm, rt_->compute_stream());
  }
  ~BenchBuffer() {
    if (rt_) rt_->deallocate(device_, bytes_, fsdp::MemCategory::comm, rt_->compute_stream());
  }
  BenchBuffer(const BenchBuffer&) = delete;
  BenchBuffer& operator=(const BenchBuffer&) = delete;
  char* host() const { return host_.get(); }
  void* data() const { return rt_ ? device_ : host_.get(); }  // what the collective gets
  void upload() { copy(data(), host_.get(), fsdp::CopyKind::host_to_device); }
  void download() { copy(host_.get(), data(), fsdp::CopyKind::device_to_host); }

 private:
  void copy(void* dst, const void* src, fsdp::CopyKind kind) {
    if (!rt_) return;
    rt_->copy_async(dst, src, bytes_, kind, rt_->compute_stream());
    rt_->synchronize(rt_->compute_stream());
  }
  std::unique_ptr<char, decltype(&std::free)> host_;
  fsdp::DeviceRuntime* rt_;
  size_t bytes_;
  void* device_ = nullptr;
};

// One (op, size) on one backend, or on raw MPI when comm is null. rt: the device runtime of
// --device cuda (raw MPI ignores it).
Row measure(const Collective& c, size_t count, const Args& a, fsdp::Communicator* comm, const fsdp::MpiHalfTypes& raw,
            MPI_Comm world, int rank, int n, fsdp::DeviceRuntime* rt) {
  const DType d = a.dtype;
  const size_t b = fsdp::dtype_bytes(d);
  const size_t in_n = c.in_count(count, n), out_n = c.out_count(count, n);
  fsdp::DeviceRuntime* const device = comm ? rt : nullptr;
  BenchBuffer in(in_n * b, device), out(out_n * b, device);
  c.fill_in(in.host(), count, d, rank, n);
  for (size_t j = 0; j < out_n; ++j) fsdp::store_element(out.host(), d, j, sentinel(d));
  in.upload();
  out.upload();

  auto once = [&] {
    if (comm)
      c.issue(*comm, in.data(), out.data(), count, d)->wait();
    else
      c.raw(in.host(), out.host(), count, raw.datatype(d), raw.op(d, fsdp::ReduceOp::sum), world);
  };
  for (int i = 0; i < a.warmup; ++i) once();
  MPI_Barrier(world);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < a.iters; ++i) once();
  double local_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / a.iters;
  MPI_Barrier(world);

  // Every iteration writes the same output, so the last one's is checked whole.
  out.download();
  uint64_t wrong = 0;
  for (size_t j = 0; j < out_n; ++j)
    if (fsdp::load_element(out.host(), d, j) != c.expected(j, count, d, rank, n)) ++wrong;

  double max_s = 0;
  uint64_t wrong_total = 0;
  MPI_Reduce(&local_s, &max_s, 1, MPI_DOUBLE, MPI_MAX, 0, world);
  MPI_Reduce(&wrong, &wrong_total, 1, MPI_UINT64_T, MPI_SUM, 0, world);

  Row r;
  r.backend = comm ? std::string(comm->backend()) : "mpi-raw";
  r.op = c.name;
  r.size_bytes = c.size_of(count, n, b);
  r.count = count;
  r.dtype = d;
  r.time_us = max_s * 1e6;
  r.algbw_GBps = max_s > 0 ? r.size_bytes / max_s / 1e9 : 0;
  r.busbw_GBps = r.algbw_GBps * c.factor(n);
  r.wrong = wrong_total;
  return r;
}

// The row's fields in `format`'s order: kTableRow on stdout, kCsvRow in --csv.
constexpr const char* kTableRow = "%14s %15s %12zu %11zu %6s %12.2f %11.3f %11.3f %7llu\n";
constexpr const char* kCsvRow = "%s,%s,%zu,%zu,%s,%.3f,%.6f,%.6f,%llu\n";

void write_row(FILE* f, const char* format, const Row& r) {
  std::fprintf(f, format, r.backend.c_str(), r.op.c_str(), r.size_bytes, r.count,
               std::string(fsdp::dtype_name(r.dtype)).c_str(), r.time_us, r.algbw_GBps, r.busbw_GBps,
               static_cast<unsigned long long>(r.wrong));
  std::fflush(f);
}

// Distinct host names across the job, gathered on rank 0.
std::vector<std::string> host_names(MPI_Comm world, int rank, int n) {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> all(rank == 0 ? static_cast<size_t>(n) * MPI_MAX_PROCESSOR_NAME : 1);
  MPI_Gather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0, world);
  std::set<std::string> hosts;
  if (rank == 0)
    for (int r = 0; r < n; ++r) hosts.insert(std::string(&all[static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME]));
  return {hosts.begin(), hosts.end()};
}

// The sizes -b..-e by -f, as counts; sizes too small for one element per rank are left out
// and two sizes that round to the same count are measured once.
std::vector<size_t> counts_for(const Collective& c, const Args& a, int n) {
  std::vector<size_t> counts;
  const size_t b = fsdp::dtype_bytes(a.dtype);
  for (size_t s = a.min_bytes; s <= a.max_bytes;) {
    size_t count = c.count_for(s, n, b);
    if (count > 0 && (counts.empty() || counts.back() != count)) counts.push_back(count);
    if (s > a.max_bytes / a.factor) break;
    s *= a.factor;
  }
  return counts;
}

fsdp::CommOptions comm_options(const Args& a, fsdp::DeviceRuntime* rt) {
  fsdp::CommOptions o{a.timeout_s};
  o.runtime = rt;
  o.device_buffers = a.device_buffers;
  return o;
}

// The benchmark's driver, read top-down like llm.c's main: hosts and backends, then per backend
// and collective the size sweep, then the report. Over 80 lines because the sweep's bookkeeping
// (raw MPI reference, check, CSV row) stays in one place per size.
// NOLINTNEXTLINE(readability-function-size): the reason is above
int run(const Args& a, MPI_Comm world, int rank, int n, fsdp::DeviceRuntime* rt) {
  std::vector<std::string> hosts = host_names(world, rank, n);
  FILE* csv = nullptr;
  int csv_ok = 1;
  if (rank == 0 && !a.csv.empty()) {
    csv = std::fopen(a.csv.c_str(), "w");
    csv_ok = csv != nullptr;
    if (!csv) std::fprintf(stderr, "fsdp_bench: --csv %s: cannot write (%s)\n", a.csv.c_str(), std::strerror(errno));
  }
  MPI_Bcast(&csv_ok, 1, MPI_INT, 0, world);
  if (!csv_ok) return 1;  // every rank knows: no abort needed
  if (csv) std::fprintf(csv, "backend,op,size_bytes,count,dtype,time_us,algbw_GBps,busbw_GBps,wrong\n");

  // Each backend is started once first, so one that cannot start is reported before any
  // numbers; one that fails on any rank is skipped on every rank. Its row sets then get a
  // communicator of their own, alive only while they run: a backend's progress threads or
  // polling must not slow the raw-MPI rows or another backend's.
  std::vector<std::string> started;
  std::vector<std::string> paths;  // per started backend: how it takes device buffers
  for (const std::string& name : a.backends) {
    std::unique_ptr<fsdp::Communicator> comm;
    std::string reason;
    try {
      comm = fsdp::make_communicator(name, world, comm_options(a, rt));
    } catch (const std::exception& e) {
      reason = e.what();
    }
    // The lowest rank where it failed tells every rank why, so the skip line carries the reason.
    if (!comm && reason.empty()) reason = "could not start";
    const fsdp::Agreement agreed = fsdp::agree_on_error(world, comm ? "" : reason);
    if (agreed.ok()) {
      started.push_back(name);
      paths.push_back(comm->device_path().text);
      comm.reset();
      continue;
    }
    if (rank == 0)
      std::printf("# skipped backend %s: rank %d: %s\n", name.c_str(), agreed.first_failed, agreed.message.c_str());
  }

  // mpi-raw's datatypes and sum ops are the MPI backend's (bf16/f16: an f32 user op).
  const fsdp::MpiHalfTypes raw;
  if (rank == 0) {
    std::printf("# fsdp_bench: nranks %d, hosts %zu (%s), dtype %s, iters %d, warmup %d, timeout %g s\n", n,
                hosts.size(), join(hosts).c_str(), std::string(fsdp::dtype_name(a.dtype)).c_str(), a.iters, a.warmup,
                a.timeout_s);
    std::printf("# backends: mpi-raw (MPI_Allgather, MPI_Reduce_scatter_block, MPI_Allreduce%s)%s%s\n",
                a.dtype == DType::bf16 || a.dtype == DType::f16 ? " with an f32 user op for the sum" : "",
                started.empty() ? "" : ", ", join(started).c_str());
    if (rt) {
      std::printf("# device: %s (backends on device buffers, mpi-raw on host)\n", rt->describe().c_str());
      for (size_t k = 0; k < started.size(); ++k) std::printf("# %s: %s\n", started[k].c_str(), paths[k].c_str());
    }
    std::printf(
        "# size = whole array (bytes); count = elements per call; time = mean of %d, max over ranks;\n"
        "# busbw = algbw*(n-1)/n (all_gather, reduce_scatter), algbw*2(n-1)/n (all_reduce); wrong = bad elements\n",
        a.iters);
    std::printf("%14s %15s %12s %11s %6s %12s %11s %11s %7s\n", "backend", "op", "size(B)", "count", "dtype", "time_us",
                "algbw_GBps", "busbw_GBps", "wrong");
    std::fflush(stdout);
  }

  uint64_t wrong_total = 0;
  try {
    for (const Collective* c : a.ops) {
      std::vector<size_t> counts = counts_for(*c, a, n);
      for (size_t k = 0; k <= started.size(); ++k) {
        std::unique_ptr<fsdp::Communicator> comm;
        if (k > 0) comm = fsdp::make_communicator(started[k - 1], world, comm_options(a, rt));
        for (size_t count : counts) {
          Row r = measure(*c, count, a, comm.get(), raw, world, rank, n, rt);
          wrong_total += r.wrong;
          if (rank == 0) write_row(stdout, kTableRow, r);
          if (csv) write_row(csv, kCsvRow, r);
        }
      }
    }
  } catch (const std::exception& e) {
    // A timeout or a failed collective leaves the other ranks inside some collective. End the
    // job from here: unwinding would destroy communicators, and a backend's teardown may itself
    // be collective (and wait for ranks that never come).
    std::fprintf(stderr, "fsdp_bench: rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    if (csv) std::fflush(csv);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  const bool csv_failed = csv && std::fclose(csv) != 0;  // a full disk shows here: the rows were buffered
  if (csv_failed)
    std::fprintf(stderr, "fsdp_bench: --csv %s: cannot write (%s)\n", a.csv.c_str(), std::strerror(errno));
  if (wrong_total > 0) {
    if (rank == 0)
      std::fprintf(stderr, "fsdp_bench: %llu wrong elements in total: a collective returned wrong data\n",
                   static_cast<unsigned long long>(wrong_total));
    return 1;
  }
  return csv_failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  // Option errors happen identically on every rank, before MPI starts: each rank exits 2 (a
  // usage error, as fsdp_ckpt's) by itself and the launcher's rank 0 prints the one line.
  try {
    args = parse_args(argc, argv);
  } catch (const std::exception& e) {
    if (fsdp_cli::launcher_rank() == 0) std::fprintf(stderr, "fsdp_bench: %s\n", e.what());
    return 2;
  }
  if (args.help) {
    if (fsdp_cli::launcher_rank() == 0) std::fputs(args.help_text.c_str(), stdout);
    return 0;
  }
  fsdp::MpiSession mpi(&argc, &argv);
  const int rank = mpi.rank(), n = mpi.size();
  // --device cuda: every rank needs its GPU. The lowest rank without one says why, in one line;
  // every rank exits 1 (no abort needed: they all know).
  fsdp::MemoryTracker tracker;
  std::unique_ptr<fsdp::DeviceRuntime> runtime;
  if (args.device == fsdp::Device::cuda) {
    std::string why;
    try {
      runtime = fsdp::make_runtime(fsdp::Device::cuda, tracker, mpi.local_rank());
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (!runtime && why.empty()) why = "no CUDA device";
    const fsdp::Agreement agreed = fsdp::agree_on_error(MPI_COMM_WORLD, runtime ? "" : why);
    if (!agreed.ok()) {
      if (rank == 0 && agreed.first_failed == 0) std::fprintf(stderr, "fsdp_bench: %s\n", agreed.message.c_str());
      if (rank == 0 && agreed.first_failed != 0)
        std::fprintf(stderr, "fsdp_bench: rank %d: %s\n", agreed.first_failed, agreed.message.c_str());
      return 1;
    }
  }
  MPI_Comm world = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &world);  // the bench's own traffic never matches a backend's
  MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN);
  int rc = 1;
  try {
    rc = run(args, world, rank, n, runtime.get());
    MPI_Comm_free(&world);
    return rc;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "fsdp_bench: rank %d: out of memory\n", rank);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp_bench: rank %d: %s\n", rank, e.what());
  }
  // A failure past start-up (a timeout, a failed collective) may leave other ranks inside a
  // collective: end the whole job rather than let them wait.
  std::fflush(stderr);
  if (n > 1) mpi.abort(1);
  return 1;
}
