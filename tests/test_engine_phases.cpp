// The FSDP engine's phase order per strategy, driven directly: a small model (root unit: the
// head; units fc1 and fc2), one FsdpEngine on the meta device (tensor/meta_runtime.h) and the
// meta communicator (comm/meta_comm.h) standing for rank 0 of a world of 1 to 8 ranks, two
// training steps. A recording Communicator decorator (the fault_comm/device_comm pattern) logs
// every collective the engine issues on the shard and replicate groups and every wait on one,
// and a hooks decorator logs each module hook and every unit state change
// (UnitState: sharded -> gathering -> gathered -> sharded). Each unit's own sequence, per step,
// must be exactly what its strategy prescribes:
//   FULL_SHARD     all_gather before forward, reshard after it, all_gather again before
//                  backward, reduce_scatter of the gradient, reshard (the root unit stays
//                  gathered from forward to backward)
//   SHARD_GRAD_OP  all_gather once: kept from forward through backward, then reduce_scatter
//   NO_SHARD       no gather, no reduce_scatter: the shard is the whole unit, bound in place once
//                  (it stays "gathered"); one all_reduce of every unit's gradient over the world
//   HYBRID_SHARD   FULL_SHARD on the shard group, then that all_reduce over the replicate group,
//                  after every reduce_scatter has completed (_ZERO2: SHARD_GRAD_OP's, likewise)
// One rank in the shard group gathers and reduce_scatters nothing. Single process, no MPI.
#define BOOST_TEST_MODULE engine_phases
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm.h"
#include "comm/meta_comm.h"
#include "fsdp/fsdp.h"
#include "models/model.h"
#include "nn/layers.h"
#include "nn/loss.h"
#include "tensor/memory.h"
#include "tensor/meta_runtime.h"

using fsdp::Strategy;

namespace {

// Root unit: head (21 parameters); units fc1 (30) and fc2 (42), wrapped by name.
class PhaseNet : public fsdp::Model {
 public:
  PhaseNet() : Model("PhaseNet", std::make_unique<fsdp::CrossEntropyLoss>()) {
    add_layer<fsdp::Linear>("fc1", 4, 6);
    add_layer<fsdp::ReLU>("relu1");
    add_layer<fsdp::Linear>("fc2", 6, 6);
    add_layer<fsdp::ReLU>("relu2");
    add_layer<fsdp::Linear>("head", 6, 3);
  }
};

const char* state_name(fsdp::UnitState s) {
  switch (s) {
    case fsdp::UnitState::sharded: return "sharded";
    case fsdp::UnitState::gathering: return "gathering";
    case fsdp::UnitState::gathered: return "gathered";
  }
  return "?";
}

// The log: "unit: event" lines in the order they happened. Before each event it notes the units
// whose state changed since the last look, so a state shows up where the engine entered it (as
// close as the hooks and the collectives let one see: "gathering" between an all_gather's issue
// and its wait).
class Recorder {
 public:
  void attach(fsdp::FsdpEngine& engine) {
    engine_ = &engine;
    last_.assign(engine.units().size(), fsdp::UnitState::sharded);
  }
  void note(const std::string& unit, const std::string& event) {
    states();
    log_.push_back(unit + ": " + event);
  }
  void states() {
    if (!engine_) return;
    for (size_t i = 0; i < last_.size(); ++i) {
      const fsdp::Unit& u = *engine_->units()[i];
      if (u.state == last_[i]) continue;
      last_[i] = u.state;
      log_.push_back(u.spec.name + ": " + state_name(u.state));
    }
  }
  std::vector<std::string> take() { return std::exchange(log_, {}); }

  // Which unit a collective is for, from its buffers (the gathered buffer; the unit's grad
  // shard), its count checked against the unit's shard.
  std::string gather_unit(const void* out, size_t count) const {
    for (const auto& u : engine_->units())
      if (u->gathered.defined() && u->gathered.raw() == out) return checked(*u, count);
    return "an unknown buffer";
  }
  std::string reduce_scatter_unit(const void* out, size_t count) const {
    for (const auto& u : engine_->units())
      if (u->grad_shard.defined() && u->grad_shard.raw() == out) return checked(*u, count);
    return "an unknown buffer";
  }
  std::string all_reduce_unit(const void* in, const void* out, size_t count) const {
    for (const auto& u : engine_->units())  // a unit's grad shard, in place
      if (u->grad_shard.defined() && in == u->grad_shard.raw() && out == in)
        return count == static_cast<size_t>(u->shard_numel) ? "grads" : "grads of " + checked(*u, count);
    return "an unknown buffer";
  }
  std::string unit_of(const fsdp::Module& m) const {
    for (const auto& u : engine_->units())
      if (u->spec.module == &m) return u->spec.name;
    return "a module of no unit";
  }

 private:
  static std::string checked(const fsdp::Unit& u, size_t count) {
    if (count == static_cast<size_t>(u.shard_numel)) return u.spec.name;
    return u.spec.name + " (count " + std::to_string(count) + ", its shard " + std::to_string(u.shard_numel) + ")";
  }
  fsdp::FsdpEngine* engine_ = nullptr;
  std::vector<fsdp::UnitState> last_;
  std::vector<std::string> log_;
};

// A Work whose waits are logged ("wait all_gather") before they run.
class RecordingWork final : public fsdp::Work {
 public:
  RecordingWork(std::unique_ptr<fsdp::Work> inner, Recorder& rec, std::string unit, std::string what)
      : inner_(std::move(inner)), rec_(rec), unit_(std::move(unit)), what_(std::move(what)) {}
  bool test() override { return inner_->test(); }
  void wait() override {
    rec_.note(unit_, "wait " + what_);
    inner_->wait();
  }
  void wait_on(fsdp::Stream stream) override {
    rec_.note(unit_, "wait " + what_);
    inner_->wait_on(stream);
  }

 private:
  std::unique_ptr<fsdp::Work> inner_;
  Recorder& rec_;
  std::string unit_, what_;
};

// Logs each collective as "unit: <collective> <group>" and passes it on.
class RecordingComm final : public fsdp::Communicator {
 public:
  RecordingComm(std::unique_ptr<fsdp::Communicator> inner, std::string group, Recorder& rec)
      : Communicator(inner->options()), inner_(std::move(inner)), group_(std::move(group)), rec_(rec) {}
  std::string_view backend() const override { return inner_->backend(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::unique_ptr<fsdp::Communicator> split(int color, int key) const override {
    return std::make_unique<RecordingComm>(inner_->split(color, key), group_ + " split", rec_);
  }
  std::unique_ptr<fsdp::Communicator> split_by(const std::vector<int>& colors) const override {
    return std::make_unique<RecordingComm>(inner_->split_by(colors), group_ + " split", rec_);
  }
  std::unique_ptr<fsdp::Work> all_gather(const void* in, void* out, size_t count, fsdp::DType dtype,
                                         fsdp::Stream stream) override {
    return issued(rec_.gather_unit(out, count), "all_gather", inner_->all_gather(in, out, count, dtype, stream));
  }
  std::unique_ptr<fsdp::Work> reduce_scatter(const void* in, void* out, size_t count, fsdp::DType dtype,
                                             fsdp::ReduceOp op, fsdp::Stream stream) override {
    return issued(rec_.reduce_scatter_unit(out, count), "reduce_scatter",
                  inner_->reduce_scatter(in, out, count, dtype, op, stream));
  }
  std::unique_ptr<fsdp::Work> all_reduce(const void* in, void* out, size_t count, fsdp::DType dtype, fsdp::ReduceOp op,
                                         fsdp::Stream stream) override {
    return issued(rec_.all_reduce_unit(in, out, count), "all_reduce",
                  inner_->all_reduce(in, out, count, dtype, op, stream));
  }
  std::unique_ptr<fsdp::Work> broadcast(void* buf, size_t count, fsdp::DType dtype, int root,
                                        fsdp::Stream stream) override {
    return issued("no unit", "broadcast", inner_->broadcast(buf, count, dtype, root, stream));
  }
  void barrier() override {
    rec_.note("no unit", "barrier " + group_);
    inner_->barrier();
  }

 private:
  std::unique_ptr<fsdp::Work> issued(const std::string& unit, const std::string& what,
                                     std::unique_ptr<fsdp::Work> work) {
    // Noted after the call: the engine marks the unit "gathering" only once it returns.
    rec_.note(unit, what + " " + group_);
    return std::make_unique<RecordingWork>(std::move(work), rec_, unit, what);
  }
  std::unique_ptr<fsdp::Communicator> inner_;
  std::string group_;
  Recorder& rec_;
};

// The engine's hooks, each logged before it runs and followed by a look at the states.
class RecordingHooks final : public fsdp::ModuleHooks {
 public:
  RecordingHooks(fsdp::FsdpEngine& engine, Recorder& rec) : engine_(engine), rec_(rec) {}
  void pre_forward(fsdp::Module& m) override { around(m, "pre_forward", &fsdp::FsdpEngine::pre_forward); }
  void post_forward(fsdp::Module& m) override { around(m, "post_forward", &fsdp::FsdpEngine::post_forward); }
  void pre_backward(fsdp::Module& m) override { around(m, "pre_backward", &fsdp::FsdpEngine::pre_backward); }
  void post_backward(fsdp::Module& m) override { around(m, "post_backward", &fsdp::FsdpEngine::post_backward); }

 private:
  void around(fsdp::Module& m, const char* hook, void (fsdp::FsdpEngine::*call)(fsdp::Module&)) {
    rec_.note(rec_.unit_of(m), hook);
    (engine_.*call)(m);
    rec_.states();
  }
  fsdp::FsdpEngine& engine_;
  Recorder& rec_;
};

struct Setup {
  Strategy strategy = Strategy::full_shard;
  int world = 1;
  int shard_group_size = 0;  // hybrid: ranks per shard group
  fsdp::BackwardPrefetch backward_prefetch = fsdp::BackwardPrefetch::none;
  std::string text() const {
    return std::string(fsdp::enum_name(strategy)) + " world " + std::to_string(world) +
           (shard_group_size ? " shard group " + std::to_string(shard_group_size) : "") + " prefetch " +
           std::string(fsdp::enum_name(backward_prefetch));
  }
};

std::string joined(const std::vector<std::string>& v);

struct Run {
  std::vector<std::vector<std::string>> steps;  // each step's log
  std::vector<int64_t> shard_numel;             // per unit: root, fc1, fc2
};

// Training steps of PhaseNet on rank 0 of `s.world` meta ranks (one node), each step's log
// printed at --log_level=message.
Run run_steps(const Setup& s, int steps = 2) {
  fsdp::MemoryTracker tracker;
  auto rt = fsdp::make_meta_runtime(fsdp::Device::cpu, tracker);
  PhaseNet model;
  Recorder rec;
  auto world = fsdp::make_meta_communicator(s.world, 0);
  const fsdp::MeshColors colors =
      fsdp::mesh_colors(s.strategy, s.shard_group_size, std::vector<int>(static_cast<size_t>(s.world), 0));
  fsdp::ProcessMesh mesh;
  mesh.shard = std::make_unique<RecordingComm>(world->split_by(colors.shard), "shard", rec);
  mesh.replicate = std::make_unique<RecordingComm>(world->split_by(colors.replicate), "replicate", rec);
  mesh.shard_group_on_one_node = true;
  RecordingComm recorded_world(std::move(world), "world", rec);
  fsdp::FsdpOptions o;
  o.strategy = s.strategy;
  o.wrap_policy = fsdp::WrapPolicy::manual;
  o.wrap_modules = {"fc1", "fc2"};
  o.backward_prefetch = s.backward_prefetch;
  o.shard_group_size = s.shard_group_size;
  fsdp::FsdpEngine engine(model, recorded_world, std::move(mesh), o, tracker, rt.get());
  rec.attach(engine);
  Run r;
  BOOST_REQUIRE_EQUAL(engine.units().size(), 3u);
  for (const auto& u : engine.units()) r.shard_numel.push_back(u->shard_numel);
  BOOST_REQUIRE(engine.units()[0]->spec.name == "root" && engine.units()[1]->spec.name == "fc1" &&
                engine.units()[2]->spec.name == "fc2");

  RecordingHooks hooks(engine, rec);
  fsdp::RunCtx ctx;
  ctx.mem = &tracker;
  ctx.runtime = rt.get();
  ctx.hooks = &hooks;
  ctx.loss_normalizer = 2;
  const fsdp::Tensor x = fsdp::Tensor::zeros(*rt, {2, 4}, fsdp::DType::f32, fsdp::MemCategory::other);
  const fsdp::Tensor y = fsdp::Tensor::zeros(*rt, {2}, fsdp::DType::i32, fsdp::MemCategory::other);
  for (int step = 0; step < steps; ++step) {
    ctx.step = step;
    engine.begin_step();
    model.forward(ctx, x, y);
    model.backward(ctx);
    rec.note("engine", "finish_backward");
    engine.finish_backward();
    rec.states();
    r.steps.push_back(rec.take());
    BOOST_TEST_MESSAGE(s.text() << ", step " << step << ":\n  " << joined(r.steps.back()));
  }
  return r;
}

std::vector<std::string> of_unit(const std::vector<std::string>& log, const std::string& unit) {
  std::vector<std::string> out;
  const std::string prefix = unit + ": ";
  for (const std::string& line : log)
    if (line.rfind(prefix, 0) == 0) out.push_back(line.substr(prefix.size()));
  return out;
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : " | ") + s;
  return out;
}

// Building blocks of the expected sequences.
using Seq = std::vector<std::string>;
Seq cat(std::initializer_list<Seq> parts) {
  Seq out;
  for (const Seq& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}
Seq gather(const std::string& group = "shard") {
  return {"all_gather " + group, "gathering", "wait all_gather", "gathered"};
}
const Seq kReduceScatter = {"reduce_scatter shard"};

// Every line of the step's log belongs to a unit, to the engine's finish_backward or to the
// gradients' all_reduce: nothing else (a broadcast, a barrier, a world collective) was issued.
void check_nothing_else(const std::vector<std::string>& log, const std::string& where) {
  for (const std::string& line : log) {
    const bool known = line.rfind("root: ", 0) == 0 || line.rfind("fc1: ", 0) == 0 || line.rfind("fc2: ", 0) == 0 ||
                       line == "engine: finish_backward" || line.rfind("grads: ", 0) == 0;
    BOOST_CHECK_MESSAGE(known, where << ": unexpected '" << line << "'");
  }
}

void expect(const Setup& s, int step, const std::vector<std::string>& log, const std::string& unit, const Seq& want) {
  const std::string got = joined(of_unit(log, unit));
  BOOST_TEST(got == joined(want),
             s.text() << ", step " << step << ", unit " << unit << ":\n  got  " << got << "\n  want " << joined(want));
}

// The gradients' all_reduces, one per unit's grad shard (3), all issued before the first wait:
// after finish_backward has waited for every reduce_scatter, and before it returns.
void expect_grads_all_reduce(const Setup& s, int step, const std::vector<std::string>& log, bool present) {
  Seq want;
  if (present)
    want = {"all_reduce replicate", "all_reduce replicate", "all_reduce replicate",
            "wait all_reduce",      "wait all_reduce",      "wait all_reduce"};
  expect(s, step, log, "grads", want);
  if (!present) return;
  size_t finish = log.size(), reduce = log.size(), last_rs_wait = 0;
  for (size_t i = 0; i < log.size(); ++i) {
    if (log[i] == "engine: finish_backward") finish = i;
    if (log[i] == "grads: all_reduce replicate" && reduce == log.size()) reduce = i;  // the first
    if (log[i].find(": wait reduce_scatter") != std::string::npos) last_rs_wait = i;
  }
  BOOST_TEST((finish < reduce && last_rs_wait < reduce),
             s.text() << ", step " << step << ": the replicate all_reduce (line " << reduce
                      << ") is not inside finish_backward (line " << finish
                      << ") after every reduce_scatter's wait (last line " << last_rs_wait << ")");
}

// The root unit, under every strategy that shards: gathered for forward and kept until its
// backward is done, then its gradients reduce_scattered.
void expect_root_kept(const Setup& s, int step, const std::vector<std::string>& log) {
  expect(s, step, log, "root",
         cat({{"pre_forward"},
              gather(),
              {"post_forward", "pre_backward", "post_backward"},
              kReduceScatter,
              {"sharded", "wait reduce_scatter"}}));
}

// FULL_SHARD-style units (FULL_SHARD, HYBRID_SHARD) over a shard group of more than one rank.
void expect_full_shard(const Setup& s, const Run& r) {
  for (int step = 0; step < 2; ++step) {
    const auto& log = r.steps[static_cast<size_t>(step)];
    expect_root_kept(s, step, log);
    for (const char* unit : {"fc1", "fc2"})
      expect(s, step, log, unit,
             cat({{"pre_forward"},
                  gather(),
                  {"post_forward", "sharded", "pre_backward"},
                  gather(),
                  {"post_backward"},
                  kReduceScatter,
                  {"sharded", "wait reduce_scatter"}}));
    check_nothing_else(log, s.text());
  }
}

// SHARD_GRAD_OP-style units (SHARD_GRAD_OP, HYBRID_SHARD_ZERO2) over a shard group of more than one.
void expect_shard_grad_op(const Setup& s, const Run& r) {
  for (int step = 0; step < 2; ++step) {
    const auto& log = r.steps[static_cast<size_t>(step)];
    for (const char* unit : {"root", "fc1", "fc2"})
      expect(s, step, log, unit,
             cat({{"pre_forward"},
                  gather(),
                  {"post_forward", "pre_backward", "post_backward"},
                  kReduceScatter,
                  {"sharded", "wait reduce_scatter"}}));
    check_nothing_else(log, s.text());
  }
}

// A shard group of one rank: the shard is the unit, bound in place at the first forward and
// never resharded (so "gathered" from then on); no all_gather, no reduce_scatter.
void expect_unsharded(const Setup& s, const Run& r) {
  for (int step = 0; step < 2; ++step) {
    const auto& log = r.steps[static_cast<size_t>(step)];
    const Seq first = step == 0 ? Seq{"gathered"} : Seq{};
    for (const char* unit : {"root", "fc1", "fc2"})
      expect(s, step, log, unit, cat({{"pre_forward"}, first, {"post_forward", "pre_backward", "post_backward"}}));
    check_nothing_else(log, s.text());
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(full_shard_gathers_before_forward_and_backward_and_reduce_scatters) {
  for (int world : {3, 8}) {
    const Setup s{Strategy::full_shard, world};
    const Run r = run_steps(s);
    expect_full_shard(s, r);
    for (int step = 0; step < 2; ++step) expect_grads_all_reduce(s, step, r.steps[static_cast<size_t>(step)], false);
  }
  // One rank: nothing to gather or reduce.
  const Setup one{Strategy::full_shard, 1};
  const Run r = run_steps(one);
  expect_unsharded(one, r);
  for (int step = 0; step < 2; ++step) expect_grads_all_reduce(one, step, r.steps[static_cast<size_t>(step)], false);
}

BOOST_AUTO_TEST_CASE(shard_grad_op_gathers_once) {
  for (int world : {3, 8}) {
    const Setup s{Strategy::shard_grad_op, world};
    const Run r = run_steps(s);
    expect_shard_grad_op(s, r);
    for (int step = 0; step < 2; ++step) expect_grads_all_reduce(s, step, r.steps[static_cast<size_t>(step)], false);
  }
  const Setup one{Strategy::shard_grad_op, 1};
  expect_unsharded(one, run_steps(one));
}

BOOST_AUTO_TEST_CASE(no_shard_all_reduces) {
  for (int world : {1, 3, 8}) {
    const Setup s{Strategy::no_shard, world};
    const Run r = run_steps(s);
    expect_unsharded(s, r);
    // Every unit's gradient in one all_reduce over the world (the replicate group); one rank
    // has nothing to reduce.
    for (int step = 0; step < 2; ++step)
      expect_grads_all_reduce(s, step, r.steps[static_cast<size_t>(step)], world > 1);
  }
}

BOOST_AUTO_TEST_CASE(hybrid_shard_adds_the_replicate_all_reduce) {
  for (auto [world, group] : {std::pair{4, 2}, std::pair{8, 4}, std::pair{8, 2}}) {
    const Setup s{Strategy::hybrid_shard, world, group};
    const Run r = run_steps(s);
    expect_full_shard(s, r);
    for (int step = 0; step < 2; ++step) expect_grads_all_reduce(s, step, r.steps[static_cast<size_t>(step)], true);
  }
  // A shard group of the whole world: one replica, no all_reduce (FULL_SHARD); groups of one
  // rank: NO_SHARD.
  const Setup whole{Strategy::hybrid_shard, 4, 4};
  const Run w = run_steps(whole);
  expect_full_shard(whole, w);
  for (int step = 0; step < 2; ++step) expect_grads_all_reduce(whole, step, w.steps[static_cast<size_t>(step)], false);
  const Setup ones{Strategy::hybrid_shard, 4, 1};
  const Run o = run_steps(ones);
  expect_unsharded(ones, o);
  for (int step = 0; step < 2; ++step) expect_grads_all_reduce(ones, step, o.steps[static_cast<size_t>(step)], true);
}

BOOST_AUTO_TEST_CASE(hybrid_shard_zero2_gathers_once_and_adds_the_replicate_all_reduce) {
  const Setup s{Strategy::hybrid_shard_zero2, 4, 2};
  const Run r = run_steps(s);
  expect_shard_grad_op(s, r);
  for (int step = 0; step < 2; ++step) expect_grads_all_reduce(s, step, r.steps[static_cast<size_t>(step)], true);
}

// Every all_gather and reduce_scatter moves the unit's shard (count = shard_numel), and the
// shards are the padded units split evenly: the recorder names a collective by its buffers and
// adds "(count N, its shard M)" when they disagree, which the sequences above would show.
BOOST_AUTO_TEST_CASE(shards_are_the_padded_units_split_evenly) {
  const int64_t numel[] = {21, 30, 42};  // head, fc1, fc2
  for (int world : {1, 2, 3, 8}) {
    const Run r = run_steps({Strategy::full_shard, world}, 1);
    for (size_t i = 0; i < 3; ++i)
      BOOST_TEST(r.shard_numel[i] == (numel[i] + world - 1) / world,
                 "world " << world << " unit " << i << ": shard " << r.shard_numel[i]);
  }
}

// BACKWARD_PRE: a unit's pre_backward issues the all_gather of the unit backward reaches next, so
// that unit arrives at its own pre_backward already "gathering" and only waits there. The first
// backward follows the reverse forward order (root, fc2, fc1); at most two non-root units are
// gathered at once, so fc1's gather goes out in fc2's pre_backward, not earlier.
BOOST_AUTO_TEST_CASE(backward_prefetch_issues_the_next_gather_early) {
  const Setup s{Strategy::full_shard, 3, 0, fsdp::BackwardPrefetch::pre};
  const Run r = run_steps(s);
  for (int step = 0; step < 2; ++step) {
    const auto& log = r.steps[static_cast<size_t>(step)];
    expect_root_kept(s, step, log);
    for (const char* unit : {"fc1", "fc2"})
      expect(s, step, log, unit,
             cat({{"pre_forward"},
                  gather(),
                  {"post_forward", "sharded", "all_gather shard", "gathering", "pre_backward", "wait all_gather",
                   "gathered", "post_backward"},
                  kReduceScatter,
                  {"sharded", "wait reduce_scatter"}}));
    // Where the prefetches were issued: fc2's in the root's pre_backward, fc1's in fc2's.
    const size_t at = static_cast<size_t>(std::find(log.begin(), log.end(), "root: pre_backward") - log.begin());
    const Seq want = {"root: pre_backward",        "fc2: all_gather shard", "fc2: gathering",
                      "fc2: pre_backward",         "fc2: wait all_gather",  "fc2: gathered",
                      "fc1: all_gather shard",     "fc1: gathering",        "fc2: post_backward",
                      "fc2: reduce_scatter shard", "fc2: sharded",          "fc1: pre_backward",
                      "fc1: wait all_gather",      "fc1: gathered"};
    const Seq got(log.begin() + static_cast<std::ptrdiff_t>(at),
                  log.begin() + static_cast<std::ptrdiff_t>(std::min(at + want.size(), log.size())));
    BOOST_TEST(joined(got) == joined(want),
               s.text() << ", step " << step << ", backward:\n  got  " << joined(got) << "\n  want " << joined(want));
    check_nothing_else(log, s.text());
  }
}
