#include "fsdp/trace.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "tensor/error.h"

namespace fsdp {

namespace {

const char* group_name(CommGroup g) {
  switch (g) {
    case CommGroup::shard: return "shard";
    case CommGroup::replicate: return "replicate";
    default: return "world";
  }
}

bool is_compute(const TraceEvent& e) { return e.name == "forward" || e.name == "backward"; }
bool is_wait(const TraceEvent& e) { return e.name.starts_with("wait_"); }
bool is_optimizer(const TraceEvent& e) { return e.name == "optimizer" || e.name == "clip_grad_norm"; }

struct Interval {
  double begin, end;
};

// Length of the union of intervals (sorted in place).
double union_length(std::vector<Interval>& v) {
  std::sort(v.begin(), v.end(), [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
  double total = 0, cur_begin = 0, cur_end = -1e300;
  for (const Interval& i : v) {
    if (i.begin > cur_end) {
      if (cur_end > cur_begin) total += cur_end - cur_begin;
      cur_begin = i.begin;
      cur_end = i.end;
    } else {
      cur_end = std::max(cur_end, i.end);
    }
  }
  if (cur_end > cur_begin) total += cur_end - cur_begin;
  return total;
}

// The breakdown of one step from its spans (see trace.h for the definitions).
StepBreakdown breakdown(const std::vector<TraceEvent>& events, size_t first) {
  StepBreakdown b;
  std::vector<Interval> work, waits, comm;
  for (size_t i = first; i < events.size(); ++i) {
    const TraceEvent& e = events[i];
    const Interval span{e.begin_s, e.end_s};
    if (!e.complete) continue;
    if (e.track == Track::comm) {
      if (!e.scalar) comm.push_back(span);
    } else if (e.name == "step") {
      b.step_s = e.end_s - e.begin_s;
    } else if (e.track == Track::compute || e.track == Track::host) {
      if (is_compute(e)) work.push_back(span);
      if (is_wait(e)) waits.push_back(span);
      if (is_optimizer(e)) b.optimizer_s += e.end_s - e.begin_s;
    }
  }
  // Spans on one track nest: a wait lies inside an outermost forward/backward or outside all.
  const double work_s = union_length(work);
  std::vector<Interval> outer;
  for (const Interval& w : work)
    if (outer.empty() || w.begin >= outer.back().end)
      outer.push_back(w);
    else
      outer.back().end = std::max(outer.back().end, w.end);
  double waits_inside_s = 0;
  for (const Interval& w : waits) {
    b.exposed_comm_s += w.end - w.begin;
    auto it =
        std::upper_bound(outer.begin(), outer.end(), w.begin, [](double t, const Interval& o) { return t < o.begin; });
    if (it != outer.begin() && w.end <= std::prev(it)->end) waits_inside_s += w.end - w.begin;
  }
  b.compute_s = work_s - waits_inside_s;
  b.comm_s = union_length(comm);
  return b;
}

}  // namespace

double StepBreakdown::overlap() const {
  if (comm_s <= 0) return std::nan("");
  return std::clamp(1.0 - exposed_comm_s / comm_s, 0.0, 1.0);
}

// A host collective's Work: the comm span ends when a wait for it returns (or a test sees it done).
class Tracer::TracedWork final : public Work {
 public:
  TracedWork(Tracer& t, size_t at, std::unique_ptr<Work> inner) : t_(t), at_(at), inner_(std::move(inner)) {}
  ~TracedWork() override { done(); }
  TracedWork(const TracedWork&) = delete;
  TracedWork& operator=(const TracedWork&) = delete;
  bool test() override {
    const bool complete = inner_->test();
    if (complete) done();
    return complete;
  }
  void wait() override {
    inner_->wait();
    done();
  }
  void wait_on(Stream s) override {
    inner_->wait_on(s);
    done();
  }

 private:
  void done() {
    if (!ended_) t_.completed(at_);
    ended_ = true;
  }
  Tracer& t_;
  size_t at_;
  std::unique_ptr<Work> inner_;
  bool ended_ = false;
};

Tracer::Tracer(DeviceRuntime& runtime, bool trace, int64_t first_step, int64_t last_step)
    : rt_(&runtime),
      tracing_(trace),
      device_(runtime.device() != Device::cpu && runtime.holds_values()),
      first_(first_step),
      last_(last_step) {
  active_ = tracing_ || device_;  // a device gets NVTX ranges even when not tracing
  if (tracing_ && device_) {      // device times are read against this host time
    rt_->synchronize(rt_->compute_stream());
    anchor_ = rt_->record_timed(rt_->compute_stream());
    rt_->synchronize(rt_->compute_stream());
    anchor_s_ = now_s();
  }
}

Tracer::~Tracer() = default;

double Tracer::now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Tracer::begin_slow(Track track, const char* name, const std::string* unit) {
  if (device_) rt_->range_push(name);
  if (!tracing_) return;
  TraceEvent e;
  e.name = name;
  e.track = track;
  e.step = step_;
  if (unit) e.unit = *unit;
  Open o;
  o.event = events_.size();
  if (timed_on_device(track))
    o.begin_event = rt_->record_timed(rt_->compute_stream());
  else
    e.begin_s = now_s();
  events_.push_back(std::move(e));
  open_[static_cast<int>(track)].push_back(std::move(o));
}

void Tracer::end_slow(Track track) {
  if (device_) rt_->range_pop();
  if (!tracing_) return;
  std::vector<Open>& open = open_[static_cast<int>(track)];
  if (open.empty()) return;  // unbalanced only after an error unwound a hook pair
  Open o = std::move(open.back());
  open.pop_back();
  if (o.begin_event)
    pending_.push_back({o.event, std::move(o.begin_event), rt_->record_timed(rt_->compute_stream())});
  else
    completed(o.event);
}

size_t Tracer::begin_collective(const CollectiveInfo& info, uint64_t seq, Stream stream) {
  TraceEvent e;
  e.name = info.name;
  e.track = Track::comm;
  e.step = step_;
  if (info.unit) e.unit = *info.unit;
  e.group = group_name(info.group);
  e.bytes = info.bytes;
  e.dtype = info.dtype;
  e.seq = seq;
  e.scalar = info.scalar;
  const size_t at = events_.size();
  if (timed_on_device(stream)) {
    pending_.push_back({at, rt_->record_timed(stream), nullptr});
  } else {
    e.begin_s = now_s();
    e.end_s = e.begin_s;  // until the wait returns
  }
  events_.push_back(std::move(e));
  return at;
}

std::unique_ptr<Work> Tracer::end_issue(size_t at, Stream stream, std::unique_ptr<Work> work) {
  if (!timed_on_device(stream)) return std::make_unique<TracedWork>(*this, at, std::move(work));
  // The collective ran on `stream` between the two events: its span is the stream's time.
  for (auto it = pending_.rbegin(); it != pending_.rend(); ++it)
    if (it->event == at) {
      it->end = rt_->record_timed(stream);
      break;
    }
  return work;
}

void Tracer::completed(size_t at) {
  if (at >= events_.size()) return;  // taken already (a Work outlived the run)
  events_[at].end_s = now_s();
  events_[at].complete = true;
}

void Tracer::resolve() {
  for (Pending& p : pending_) {
    TraceEvent& e = events_[p.event];
    e.begin_s = anchor_s_ + rt_->elapsed_s(*anchor_, *p.begin);
    e.end_s = p.end ? anchor_s_ + rt_->elapsed_s(*anchor_, *p.end) : e.begin_s;
    e.complete = p.end != nullptr;
  }
  pending_.clear();
}

void Tracer::drop_unless_in_window() {
  if (in_window()) return;
  events_.resize(std::min(events_.size(), step_first_event_));
}

void Tracer::begin_step(int64_t step) {
  if (!active_) return;
  if (tracing_) {
    // What the last step left (its evaluation, its save) is complete: keep it or drop it.
    resolve();
    drop_unless_in_window();
    if (device_) {  // a fresh anchor bounds the drift of the device clock against the host's
      anchor_ = rt_->record_timed(rt_->compute_stream());
      rt_->synchronize(rt_->compute_stream());
      anchor_s_ = now_s();
    }
  }
  step_ = step + 1;
  step_first_event_ = events_.size();
  begin(Track::host, "step");
}

StepBreakdown Tracer::end_step() {
  if (!active_) return {};
  end(Track::host);
  if (!tracing_) return {};
  resolve();
  const StepBreakdown b = breakdown(events_, step_first_event_);
  // The step span (its first event) carries the breakdown, for jobs/plot-trace.py.
  events_[step_first_event_].breakdown = b;
  return b;
}

std::vector<TraceEvent> Tracer::take_events() {
  if (!tracing_) return {};
  try {
    resolve();
  } catch (const Error&) {  // a device that failed: its spans stay incomplete, the host's are kept
    pending_.clear();
  }
  drop_unless_in_window();
  for (auto& open : open_) open.clear();  // spans an error left open are incomplete: not written
  step_first_event_ = 0;
  return std::move(events_);
}

}  // namespace fsdp
