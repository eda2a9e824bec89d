#include "train/trace_file.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "comm/comm.h"
#include "tensor/error.h"
#include "train/metrics.h"

namespace fsdp {

namespace {

constexpr int kClockRounds = 5;

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Microseconds with three decimals from whole nanoseconds: a child's span never pokes out of
// its parent's through rounding.
// Trace timestamps are microseconds; to the nanosecond.
double micros(int64_t ns) { return static_cast<double>(ns) / 1000.0; }

const char* track_name(Track t, bool device) {
  if (t == Track::comm) return device ? "comm stream" : "comm";
  if (t == Track::compute) return device ? "compute stream" : "compute (host thread)";
  return "host";
}

// A metadata event (a process's or a thread's name, a sort index); tid -1: the process's.
std::string metadata(const char* what, int rank, int tid, const JsonLine& args) {
  JsonLine e;
  e.str("name", what).str("ph", "M").integer("pid", rank);
  if (tid >= 0) e.integer("tid", tid);
  return e.object("args", args).text();
}

JsonLine named(const std::string& name) { return JsonLine().str("name", name); }

std::string file_body(const std::string& events, const TraceClock& clock) {
  std::vector<double> offsets;
  std::vector<int64_t> applied;
  for (size_t r = 0; r < clock.measured_s.size(); ++r) {
    offsets.push_back(micros(std::llround(clock.measured_s[r] * 1e9)));
    applied.push_back(r < clock.applied.size() ? clock.applied[r] : 0);
  }
  JsonLine other;
  other.str("clock", "steady_clock; ts in us since rank 0's start");
  other.numbers("clock_offsets_us", offsets).integers("clock_offsets_applied", applied);
  // The outer object: the events, then the rest of its fields.
  const std::string rest = JsonLine().str("displayTimeUnit", "ms").object("otherData", other).text();
  return R"({"traceEvents": [)" + std::string("\n") + events + "\n], " + rest.substr(1) + "\n";
}

void write_file(const std::string& path, const std::string& text) {
  std::error_code ec;  // a missing parent folder is created; failure shows up in fopen below
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) throw Error("output.trace: cannot open " + tmp + " (" + std::strerror(errno) + ")");
  const bool wrote = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int saved = errno;
  if (std::fclose(f) != 0 || !wrote) {
    (void)std::remove(tmp.c_str());
    throw Error("output.trace: cannot write " + tmp + " (" + std::strerror(wrote ? errno : saved) + ")");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw Error("output.trace: cannot rename " + tmp + " to " + path + " (" + std::strerror(errno) + ")");
}

}  // namespace

TraceClock align_trace_clock(Communicator& world, const std::vector<int>& node_color_of_rank) {
  const int n = world.size();
  std::vector<std::vector<double>> rounds(kClockRounds, std::vector<double>(static_cast<size_t>(n)));
  for (auto& readings : rounds) {
    world.barrier();
    double mine = now_s();
    world.all_gather(&mine, readings.data(), 1, DType::f64)->wait();
  }
  TraceClock c;
  c.origin_s = rounds[0][0];
  c.measured_s.resize(static_cast<size_t>(n));
  c.applied.resize(static_cast<size_t>(n));
  for (size_t r = 0; r < static_cast<size_t>(n); ++r) {
    std::vector<double> d;
    d.reserve(rounds.size());
    for (const auto& readings : rounds) d.push_back(readings[r] - readings[0]);
    std::nth_element(d.begin(), d.begin() + kClockRounds / 2, d.end());
    c.measured_s[r] = d[kClockRounds / 2];
    // One host, one CLOCK_MONOTONIC: the exact offset is 0, better than any estimate.
    c.applied[r] = r < node_color_of_rank.size() && node_color_of_rank[r] != node_color_of_rank[0] ? 1 : 0;
  }
  const auto me = static_cast<size_t>(world.rank());
  c.offset_s = c.applied[me] ? c.measured_s[me] : 0.0;
  // Rank 0's origin in this rank's clock.
  c.origin_s += c.offset_s;
  return c;
}

std::string trace_events_json(const std::vector<TraceEvent>& events, int rank, const TraceClock& clock, bool device) {
  std::string out = metadata("process_name", rank, -1, named("rank " + std::to_string(rank)));
  out += ",\n" + metadata("process_sort_index", rank, -1, JsonLine().integer("sort_index", rank));
  for (Track t : {Track::host, Track::compute}) {
    if (t == Track::host && !device) continue;  // host runs: the host thread is the compute track
    out += ",\n" + metadata("thread_name", rank, static_cast<int>(t), named(track_name(t, device)));
  }
  // Parents before children: by track, start, then the longer span first.
  std::vector<const TraceEvent*> sorted;
  for (const TraceEvent& e : events)
    if (e.complete) sorted.push_back(&e);
  auto ns = [&](double t) { return static_cast<int64_t>(std::llround((t - clock.origin_s) * 1e9)); };
  auto tid = [&](const TraceEvent& e) { return e.track == Track::host && !device ? Track::compute : e.track; };
  std::stable_sort(sorted.begin(), sorted.end(), [&](const TraceEvent* a, const TraceEvent* b) {
    if (tid(*a) != tid(*b)) return tid(*a) < tid(*b);
    if (ns(a->begin_s) != ns(b->begin_s)) return ns(a->begin_s) < ns(b->begin_s);
    return ns(a->end_s) > ns(b->end_s);
  });
  // Collectives in flight together (a prefetch issued while a reduction runs) would overlap on
  // one track, which the format cannot draw: each goes to the first comm lane free at its start
  // (tid 2, 3, ...). On a device the comm stream runs them one at a time: one lane.
  std::vector<int64_t> lane_end;
  for (const TraceEvent* e : sorted) {
    const int64_t begin = ns(e->begin_s), end = std::max(begin, ns(e->end_s));
    const Track track = tid(*e);
    int thread = static_cast<int>(track);
    if (track == Track::comm) {
      size_t lane = 0;
      while (lane < lane_end.size() && lane_end[lane] > begin) ++lane;
      if (lane == lane_end.size()) {
        lane_end.push_back(end);
        const std::string name = track_name(track, device);
        out += ",\n" + metadata("thread_name", rank, thread + static_cast<int>(lane),
                                named(lane == 0 ? name : name + " #" + std::to_string(lane + 1)));
      }
      lane_end[lane] = end;
      thread += static_cast<int>(lane);
    }
    JsonLine args;
    args.integer("step", e->step);
    if (!e->unit.empty()) args.str("unit", e->unit);
    if (e->group) {
      args.integer("bytes", e->bytes).str("dtype", std::string(dtype_name(e->dtype))).str("group", e->group);
      args.integer("seq", static_cast<int64_t>(e->seq));
      if (e->scalar) args.boolean("scalar", true);
    }
    if (const std::optional<StepBreakdown>& b = e->breakdown) {
      args.num("compute_s", b->compute_s).num("exposed_comm_s", b->exposed_comm_s);
      args.num("optimizer_s", b->optimizer_s).num("comm_s", b->comm_s);
    }
    JsonLine x;
    x.str("name", e->name).str("cat", track_name(track, device)).str("ph", "X").integer("pid", rank);
    x.integer("tid", thread).exact("ts", micros(begin)).exact("dur", micros(end - begin)).object("args", args);
    out += ",\n" + x.text();
  }
  return out;
}

void write_trace(Communicator& world, const std::string& path, const std::vector<TraceEvent>& events,
                 const TraceClock& clock, bool device) {
  const std::string mine = trace_events_json(events, world.rank(), clock, device);
  // Sizes first, then each rank's text from it in turn (the Communicator has no gatherv).
  const auto n = static_cast<size_t>(world.size());
  std::vector<int64_t> sizes(n);
  auto my_size = static_cast<int64_t>(mine.size());
  world.all_gather(&my_size, sizes.data(), 1, DType::i64)->wait();
  std::string all = world.rank() == 0 ? mine : std::string();
  for (size_t r = 1; r < n; ++r) {
    std::string text = world.rank() == static_cast<int>(r) ? mine : std::string(static_cast<size_t>(sizes[r]), '\0');
    if (sizes[r] > 0) world.broadcast(text.data(), text.size(), DType::u8, static_cast<int>(r))->wait();
    if (world.rank() == 0) all += ",\n" + text;
  }
  // Rank 0's verdict on the write reaches everyone by the exception only on rank 0: the others
  // have finished their part, and the run's end does not wait on the file.
  if (world.rank() == 0) write_file(path, file_body(all, clock));
}

std::string rank_trace_path(const std::string& path, int rank) {
  const std::string suffix = ".json";
  const bool json = path.size() > suffix.size() && path.ends_with(suffix);
  return (json ? path.substr(0, path.size() - suffix.size()) : path) + ".rank" + std::to_string(rank) + ".json";
}

std::string write_rank_trace(const std::string& path, int rank, const std::vector<TraceEvent>& events,
                             const TraceClock& clock, bool device) {
  std::string out = rank_trace_path(path, rank);
  write_file(out, file_body(trace_events_json(events, rank, clock, device), clock));
  return out;
}

}  // namespace fsdp
