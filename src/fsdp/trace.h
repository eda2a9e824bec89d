#pragma once
// The step's timeline (output.trace): named spans of every FSDP phase on per-rank tracks, kept
// as Chrome trace events (train/trace_file.h gathers and writes them), and the step breakdown
// the metrics report. The engine and the trainer call it in one line per phase: a Scope (RAII),
// a begin/end pair where a phase opens in one hook and closes in another, or collective().
//
// Tracks (Chrome "tid"; the "pid" is the rank):
//   compute (1)  host runs: the host thread, every span. Device runs: the compute stream, its
//                spans timed with events recorded on it (forward, backward, the waits, optimizer).
//   comm    (2)  collectives, from issue to completion: host runs, the host clock at the call and
//                when the wait for it returned; device runs, events on the stream it ran on.
//                Collectives in flight together go to further lanes (tid 3, 4, ...: "comm #2").
//   host    (0)  device runs only: the host thread's spans (step, data, unshard's issue, ...).
//
// Off (the default, and a plan's trainer): every call returns after one test of a flag, with no
// clock read and no allocation. On a device with tracing off the spans still push and pop NVTX
// ranges of the same names (DeviceRuntime::range_push: a null-pointer check without Nsight).
//
// The step breakdown (seconds, this rank, one training step; the metrics line's fields):
//   compute_s       the outermost forward and backward spans on the compute track, minus the
//                   waits nested in them
//   exposed_comm_s  the wait spans (wait_for_unshard, wait_reduce_scatter, wait_all_reduce): the
//                   host (host runs) or the compute stream (device runs) stood still until a
//                   collective completed
//   optimizer_s     the optimizer and clip_grad_norm spans
//   comm_s          the length of the union of the step's collective spans (time with at least
//                   one of the engine's collectives in flight)
//   overlap         1 - exposed_comm_s / comm_s: the share of communication time hidden behind
//                   other work (0: every collective waited for in full; absent without collectives)
//   step_s          the step span; other = step_s - compute_s - exposed_comm_s - optimizer_s is
//                   data loading, the loss all_reduce, issuing collectives, bookkeeping
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "tensor/device.h"

namespace fsdp {

enum class Track : uint8_t { host = 0, compute = 1, comm = 2 };
enum class CommGroup : uint8_t { shard, replicate, world };

// One collective as the trace names it: bytes are the whole array (StepTraffic's convention).
struct CollectiveInfo {
  const char* name = "";  // all_gather, reduce_scatter, all_reduce
  CommGroup group = CommGroup::world;
  int64_t bytes = 0;
  DType dtype = DType::f32;
  const std::string* unit = nullptr;  // the unit it is for (null: several, or none)
  // A host value (the loss, the grad norm, finiteness): traced, but not FSDP's traffic, so
  // outside comm_s and exposed_comm_s.
  bool scalar = false;
};

struct StepBreakdown {
  double step_s = 0, compute_s = 0, exposed_comm_s = 0, optimizer_s = 0, comm_s = 0;
  double overlap() const;  // NaN when comm_s is 0
};

// One finished span, times in seconds on this rank's steady_clock.
struct TraceEvent {
  std::string name;
  Track track = Track::host;
  double begin_s = 0, end_s = 0;
  int64_t step = 0;  // 1-based training step it belongs to (evaluation, saves: the last step)
  std::string unit;  // "" when none
  // Collectives only.
  const char* group = nullptr;
  int64_t bytes = -1;
  DType dtype = DType::f32;
  uint64_t seq = 0;
  bool scalar = false;
  std::optional<StepBreakdown> breakdown;  // the step span's (its first event's)
  bool complete = false;                   // both times known (a run that stopped early leaves some open)
};

class Tracer {
 public:
  Tracer() = default;  // off
  // runtime: where compute-track spans are timed (events when it is a device); trace: keep
  // spans (and the step breakdown) for steps first..last (1-based, inclusive); false: only NVTX
  // ranges on a device.
  Tracer(DeviceRuntime& runtime, bool trace, int64_t first_step = 1,
         int64_t last_step = std::numeric_limits<int64_t>::max());
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  bool tracing() const { return tracing_; }

  // A span opened here and closed by end(track) (spans on one track close in reverse order).
  void begin(Track track, const char* name, const std::string* unit = nullptr) {
    if (active_) begin_slow(track, name, unit);
  }
  void end(Track track) {
    if (active_) end_slow(track);
  }
  class Scope {
   public:
    Scope(Tracer& t, Track track, const char* name, const std::string* unit = nullptr) : t_(t), track_(track) {
      t_.begin(track, name, unit);
    }
    ~Scope() { t_.end(track_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Tracer& t_;
    Track track_;
  };
  Scope scope(Track track, const char* name, const std::string* unit = nullptr) { return {*this, track, name, unit}; }

  // issue() starts a collective on `stream` and returns its Work; traced, the collective is a
  // comm-track span: on a device from an event before the call to one after it on `stream`,
  // on the host from the call to the return of the Work's wait (the Work is wrapped for that).
  template <class Issue>
  std::unique_ptr<Work> collective(const CollectiveInfo& info, Stream stream, Issue&& issue) {
    const uint64_t seq = seq_[static_cast<int>(info.group)]++;  // counted traced or not: same on every rank
    if (!tracing_) return issue();
    const size_t at = begin_collective(info, seq, stream);
    return end_issue(at, stream, issue());
  }

  // The training loop: steps are 0-based here and 1-based in the trace and the window.
  // end_step closes the step span, times what the device ran, and returns the breakdown
  // (all zero when not tracing).
  void begin_step(int64_t step);
  StepBreakdown end_step();

  // Every span kept so far (the window's steps; device times resolved; collectives still in
  // flight end now); then the caller owns them.
  std::vector<TraceEvent> take_events();
  bool on_device() const { return device_; }

 private:
  struct Open {
    size_t event = 0;  // index in events_
    std::unique_ptr<Event> begin_event;
  };
  struct Pending {  // a device span whose times are events until resolved
    size_t event = 0;
    std::unique_ptr<Event> begin, end;
  };
  class TracedWork;
  void begin_slow(Track track, const char* name, const std::string* unit);
  void end_slow(Track track);
  size_t begin_collective(const CollectiveInfo& info, uint64_t seq, Stream stream);
  std::unique_ptr<Work> end_issue(size_t at, Stream stream, std::unique_ptr<Work> work);
  void completed(size_t at);     // a host collective's wait returned
  void resolve();                // device events -> seconds, on the host clock of the anchor
  void drop_unless_in_window();  // the spans of the current step, when it is outside first..last
  bool in_window() const { return step_ >= first_ && step_ <= last_; }
  bool timed_on_device(Track track) const { return device_ && track != Track::host; }
  // Collectives on a stream are timed there; host-value ones (no stream) on the host clock.
  bool timed_on_device(Stream stream) const { return device_ && stream.native; }
  static double now_s();

  DeviceRuntime* rt_ = nullptr;
  bool active_ = false;   // tracing, or NVTX ranges on a device
  bool tracing_ = false;  // output.trace is set
  bool device_ = false;
  int64_t first_ = 1, last_ = 0;
  int64_t step_ = 0;             // 1-based, the current or last step
  size_t step_first_event_ = 0;  // events_ index where the current step's spans start
  std::vector<TraceEvent> events_;
  std::vector<Open> open_[3];      // per track
  std::vector<Pending> pending_;   // device spans to resolve
  std::unique_ptr<Event> anchor_;  // a compute-stream event whose host time is anchor_s_
  double anchor_s_ = 0;
  uint64_t seq_[3] = {0, 0, 0};  // per CommGroup
};

}  // namespace fsdp
