// output.trace end to end, in-process under mpirun (tests/mpirun.sh NP test_trace ...): the file
// rank 0 writes is valid JSON in the trace-event format; spans nest and never overlap within a
// track; every collective the engine issued appears once, with the bytes of the engine's own
// StepTraffic (the memory plan runs the real engine and reports it); a FULL_SHARD step gathers
// each unit before its forward and its backward and reduce-scatters it after its backward; the
// window keeps exactly its steps; the metrics lines carry the breakdown that the step spans
// carry; a device run (the fake device of tests/fake_device.h) times compute and comm spans with
// events on their streams; a run stopped by an error leaves one valid file per rank.
//
// Only rank 0 checks the files; every rank runs every case.
#define BOOST_TEST_NO_MAIN
#include <mpi.h>
#include <unistd.h>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "comm/comm.h"
#include "comm/mpi_env.h"
#include "config/config.h"
#include "fake_device.h"
#include "mpi_test.h"
#include "tensor/error.h"
#include "train/plan.h"
#include "train/trainer.h"

namespace ut = boost::unit_test;
using fsdp::testing::FakeDevice;
using fsdp::testing::report;
using fsdp::testing::world_rank;
using fsdp::testing::world_size;
using json = nlohmann::json;

namespace {

const char* kLm =
    "model: {kind: transformer, vocab: 32, d_model: 32, n_layers: 2, n_heads: 4, d_ff: 64, seq_len: 16}\n"
    "data: {kind: synthetic, synthetic_samples: 192}\n"
    "train: {batch_size: 4, steps: 4, eval_every: 2, eval_batch_size: 8, clip_grad_norm: 0.5,\n"
    "        optimizer: {kind: adamw, lr: 0.003}}\n"
    "fsdp: {sharding_strategy: FULL_SHARD, auto_wrap: {policy: transformer_layer}}\n"
    "comm: {timeout_s: 120}\n";

// This job's folder (rank 0's pid names it), emptied first.
std::string job_dir(const std::string& name) {
  long pid = static_cast<long>(getpid());
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  const auto dir = std::filesystem::temp_directory_path() / ("fsdp_trace_" + std::to_string(pid) + "_" + name);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return dir.string();
}

struct Run {
  std::string error;          // "" when the run finished
  json trace;                 // rank 0: the parsed file (null when absent)
  std::vector<json> metrics;  // rank 0: the per-step lines
  fsdp::MemoryPlan plan;
};

// One training run in this process; the plan of the same config at this world size.
Run train_once(const std::string& dir, std::vector<std::string> overrides, bool fake_device = false,
               std::function<void(int64_t)> during_save = {}) {
  overrides.push_back("output.trace=" + dir + "/trace.json");
  overrides.push_back("output.metrics=" + dir + "/metrics.jsonl");
  overrides.push_back("checkpoint.dir=" + dir + "/ck");
  overrides.push_back("checkpoint.every_steps=2");
  if (fake_device) overrides.push_back("train.device=cuda");
  Run r;
  try {
    fsdp::Config c = fsdp::parse_config(kLm, "trace.yaml", overrides);
    auto world = fsdp::make_communicator(c.comm.backend, MPI_COMM_WORLD, {c.comm.timeout_s});
    fsdp::RunEnv env;
    env.rank = env.local_rank = world_rank();
    env.world_size = world_size();
    env.world = world.get();
    env.mpi_comm = MPI_COMM_WORLD;
    env.during_save = std::move(during_save);
    if (fake_device)
      env.make_runtime = [](fsdp::MemoryTracker& tracker, int) -> std::unique_ptr<fsdp::DeviceRuntime> {
        return std::make_unique<FakeDevice>(tracker);
      };
    fsdp::PlanRequest request;
    request.world_size = world_size();
    r.plan = fsdp::plan_memory(fsdp::for_world_size(c, world_size()), request);
    const std::unique_ptr<fsdp::Trainer> trainer = fsdp::Trainer::create(c, env);
    trainer->run();
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) {
    std::ifstream t(dir + "/trace.json");
    if (t) r.trace = json::parse(t);  // throws (the case fails) on invalid JSON
    std::ifstream m(dir + "/metrics.jsonl");
    std::string line;
    while (std::getline(m, line)) {
      json j = json::parse(line);
      if (j.contains("loss")) r.metrics.push_back(j);
    }
  }
  return r;
}

// An "X" event, times in whole nanoseconds (the file has microseconds with three decimals).
struct Span {
  std::string name;
  int pid = 0, tid = 0;
  int64_t begin = 0, end = 0;
  json args;
};

std::vector<Span> spans(const json& trace) {
  std::vector<Span> out;
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    Span s;
    s.name = e.at("name");
    s.pid = e.at("pid");
    s.tid = e.at("tid");
    s.begin = std::llround(e.at("ts").get<double>() * 1000.0);
    s.end = s.begin + std::llround(e.at("dur").get<double>() * 1000.0);
    s.args = e.at("args");
    out.push_back(std::move(s));
  }
  return out;
}

// Within one (pid, tid) spans form a forest: each one starts after its parent and ends before it.
void check_nesting(const std::vector<Span>& all) {
  std::map<std::pair<int, int>, std::vector<const Span*>> tracks;
  for (const Span& s : all) tracks[{s.pid, s.tid}].push_back(&s);
  for (auto& [key, list] : tracks) {
    std::stable_sort(list.begin(), list.end(), [](const Span* a, const Span* b) {
      return a->begin != b->begin ? a->begin < b->begin : a->end > b->end;
    });
    std::vector<const Span*> open;
    for (const Span* s : list) {
      BOOST_TEST(s->end >= s->begin);
      while (!open.empty() && open.back()->end <= s->begin) open.pop_back();
      if (!open.empty())
        BOOST_TEST(s->end <= open.back()->end, "rank " << key.first << " tid " << key.second << ": " << s->name
                                                       << " overlaps the end of " << open.back()->name);
      open.push_back(s);
    }
  }
}

bool is_collective(const Span& s) { return s.args.contains("group"); }
bool in(const Span& inner, const Span& outer) { return inner.begin >= outer.begin && inner.end <= outer.end; }

// The step spans of rank `pid`, by step.
std::map<int64_t, Span> step_spans(const std::vector<Span>& all, int pid) {
  std::map<int64_t, Span> out;
  for (const Span& s : all)
    if (s.pid == pid && s.name == "step") out[s.args.at("step").get<int64_t>()] = s;
  return out;
}

// Every rank's step `step`: the engine's collectives that start inside the step, by name, equal
// the plan's StepTraffic counts and bytes. On a device the host leaves the step span once it has
// queued the work, so the step's last reductions may start on the comm stream after it (seen
// under load: a reduce_scatter one short); the step's optimizer span (compute stream) ends after
// every reduction it waits for, and before the next all_gather (which gathers its update) starts:
// the window ends at whichever of the two ends later.
void check_traffic(const std::vector<Span>& all, const fsdp::MemoryPlan& plan, int64_t step) {
  for (int pid = 0; pid < world_size(); ++pid) {
    const Span step_span = step_spans(all, pid).at(step);
    int64_t window_end = step_span.end;
    for (const Span& s : all)
      if (s.pid == pid && s.name == "optimizer" && s.args.at("step").get<int64_t>() == step)
        window_end = std::max(window_end, s.end);
    std::map<std::string, std::pair<int64_t, int64_t>> seen;  // name -> calls, bytes
    for (const Span& s : all)
      if (s.pid == pid && is_collective(s) && !s.args.contains("scalar") && s.begin >= step_span.begin &&
          s.begin <= window_end) {
        seen[s.name].first += 1;
        seen[s.name].second += s.args.at("bytes").get<int64_t>();
      }
    for (const auto& [name, expected] :
         std::map<std::string, fsdp::CollectiveCount>{{"all_gather", plan.all_gather},
                                                      {"reduce_scatter", plan.reduce_scatter},
                                                      {"all_reduce", plan.all_reduce}}) {
      BOOST_TEST(seen[name].first == expected.calls, "rank " << pid << " step " << step << " " << name);
      BOOST_TEST(seen[name].second == expected.bytes, "rank " << pid << " step " << step << " " << name);
    }
  }
}

// Every rank traced the same collectives: (group, seq) -> name, bytes, unit, and each seq once.
void check_same_collectives_on_every_rank(const std::vector<Span>& all) {
  std::vector<std::map<std::pair<std::string, uint64_t>, std::string>> by_rank(static_cast<size_t>(world_size()));
  for (const Span& s : all) {
    if (!is_collective(s)) continue;
    const auto key = std::make_pair(s.args.at("group").get<std::string>(), s.args.at("seq").get<uint64_t>());
    const std::string what = s.name + " " + s.args.at("bytes").dump() + " " + s.args.value("unit", std::string());
    const bool fresh = by_rank[static_cast<size_t>(s.pid)].emplace(key, what).second;
    BOOST_TEST(fresh, "rank " << s.pid << ": " << key.first << " seq " << key.second << " twice");
  }
  for (size_t r = 1; r < by_rank.size(); ++r) BOOST_TEST((by_rank[r] == by_rank[0]), "rank " << r << " vs rank 0");
}

std::set<std::string> units_of(const std::vector<Span>& all) {
  std::set<std::string> out;
  for (const Span& s : all)
    if (s.name == "forward") out.insert(s.args.at("unit").get<std::string>());
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(full_shard_trace_nests_counts_and_orders_the_collectives) {
  const std::string dir = job_dir("full_shard");
  const Run r = train_once(dir, {"output.trace_steps=[2, 3]"});
  report(r.error.empty(), "run failed: " + r.error);
  if (world_rank() != 0) return;
  BOOST_REQUIRE(r.trace.is_object());
  const std::vector<Span> all = spans(r.trace);
  check_nesting(all);
  check_same_collectives_on_every_rank(all);
  std::set<int> pids;
  std::set<int64_t> steps;
  for (const Span& s : all) {
    pids.insert(s.pid);
    steps.insert(s.args.at("step").get<int64_t>());
    if (is_collective(s)) {
      BOOST_TEST(s.tid >= 2);  // the comm lanes
      BOOST_TEST(s.args.at("dtype") == (s.args.contains("scalar") ? s.args.at("dtype") : json("f32")));
    } else {
      BOOST_TEST(s.tid == 1);  // a host run: every other span is the host thread's
    }
  }
  BOOST_TEST(pids.size() == static_cast<size_t>(world_size()));
  // The window: steps 2 and 3, and what followed step 2 (its evaluation and save), nothing else.
  BOOST_TEST((steps == std::set<int64_t>{2, 3}));
  std::multiset<std::pair<std::string, int64_t>> tails;
  for (const Span& s : all)
    if (s.pid == 0 && (s.name == "evaluate" || s.name == "checkpoint_save"))
      tails.insert({s.name, s.args.at("step").get<int64_t>()});
  BOOST_TEST((tails == std::multiset<std::pair<std::string, int64_t>>{{"checkpoint_save", 2}, {"evaluate", 2}}));
  for (int64_t step : {2, 3}) check_traffic(all, r.plan, step);

  // FULL_SHARD order, per rank and step: each unit's all_gather completes before its forward
  // starts; a non-root unit (freed after forward) is gathered again between its forward and its
  // backward; its reduce_scatter is issued after its backward ends.
  if (world_size() > 1) {
    const std::set<std::string> units = units_of(all);
    BOOST_TEST(units.size() == 3u);  // root, blocks.0, blocks.1
    for (int pid = 0; pid < world_size(); ++pid)
      for (const auto& [step, step_span] : step_spans(all, pid))
        for (const std::string& unit : units) {
          std::vector<const Span*> gathers, reductions, forwards, backwards;
          for (const Span& s : all) {
            if (s.pid != pid || !in(s, step_span) || s.args.value("unit", std::string()) != unit) continue;
            if (s.name == "all_gather") gathers.push_back(&s);
            if (s.name == "reduce_scatter") reductions.push_back(&s);
            if (s.name == "forward") forwards.push_back(&s);
            if (s.name == "backward") backwards.push_back(&s);
          }
          const std::string where = "rank " + std::to_string(pid) + " step " + std::to_string(step) + " " + unit;
          const size_t expected_gathers = unit == "root" ? 1 : 2;  // the root stays gathered for backward
          BOOST_REQUIRE_MESSAGE(gathers.size() == expected_gathers && reductions.size() == 1 && forwards.size() == 1 &&
                                    backwards.size() == 1,
                                where << ": " << gathers.size() << " all_gathers, " << reductions.size()
                                      << " reduce_scatters, " << forwards.size() << " forwards, " << backwards.size()
                                      << " backwards");
          std::sort(gathers.begin(), gathers.end(), [](const Span* a, const Span* b) { return a->begin < b->begin; });
          BOOST_TEST(gathers[0]->end <= forwards[0]->begin, where);
          if (unit != "root") {
            BOOST_TEST(gathers[1]->begin >= forwards[0]->end, where);
            BOOST_TEST(gathers[1]->end <= backwards[0]->begin, where);
          }
          BOOST_TEST(reductions[0]->begin >= backwards[0]->end, where);
        }
  }

  // The metrics lines carry rank 0's breakdown, the same numbers as its step spans.
  BOOST_REQUIRE(r.metrics.size() == 4u);
  const std::map<int64_t, Span> rank0 = step_spans(all, 0);
  for (const json& m : r.metrics) {
    const double compute = m.at("compute_s"), exposed = m.at("exposed_comm_s"), optimizer = m.at("optimizer_s");
    BOOST_TEST(compute > 0.0);
    BOOST_TEST(exposed >= 0.0);
    BOOST_TEST(optimizer > 0.0);
    // Disjoint parts of the step: their sum cannot exceed it.
    BOOST_TEST(compute + exposed + optimizer <= m.at("step_time_s").get<double>());
    if (world_size() > 1) {
      BOOST_TEST(m.at("comm_s").get<double>() > 0.0);
      const double overlap = m.at("overlap");
      BOOST_TEST((overlap >= 0.0 && overlap <= 1.0));
    } else {  // FULL_SHARD on one rank gathers nothing: no overlap to speak of
      BOOST_TEST(m.at("comm_s").get<double>() == 0.0);
      BOOST_TEST(m.at("overlap").is_null());
    }
    const int64_t step = m.at("step");
    if (rank0.contains(step))
      for (const char* key : {"compute_s", "exposed_comm_s", "optimizer_s", "comm_s"})
        BOOST_TEST(rank0.at(step).args.at(key).get<double>() == m.at(key).get<double>(), key);
  }
}

BOOST_AUTO_TEST_CASE(hybrid_replicate_all_reduce_and_a_one_step_window) {
  if (world_size() < 2) return;  // one rank has no replicas
  const std::string dir = job_dir("hybrid");
  const Run r = train_once(
      dir, {"fsdp.sharding_strategy=HYBRID_SHARD", "fsdp.hybrid.shard_group_size=1", "output.trace_steps=[3, 3]"});
  report(r.error.empty(), "run failed: " + r.error);
  if (world_rank() != 0) return;
  const std::vector<Span> all = spans(r.trace);
  check_nesting(all);
  check_same_collectives_on_every_rank(all);
  for (const Span& s : all) BOOST_TEST(s.args.at("step").get<int64_t>() == 3);
  BOOST_TEST(r.plan.all_reduce.calls == static_cast<int64_t>(r.plan.units.size()));  // one per unit's grad shard
  check_traffic(all, r.plan, 3);
  for (const Span& s : all)
    if (s.name == "all_reduce" && !s.args.contains("scalar")) BOOST_TEST(s.args.at("group") == "replicate");
}

BOOST_AUTO_TEST_CASE(device_run_times_the_streams_with_events) {
  const std::string dir = job_dir("device");
  const Run r = train_once(dir, {"output.trace_steps=[2, 3]"}, true);
  report(r.error.empty(), "run failed: " + r.error);
  if (world_rank() != 0) return;
  const std::vector<Span> all = spans(r.trace);
  check_nesting(all);
  check_same_collectives_on_every_rank(all);
  for (int64_t step : {2, 3}) check_traffic(all, r.plan, step);
  std::map<std::string, std::set<int>> tids;
  for (const Span& s : all) tids[s.name].insert(s.tid);
  // The compute stream (tid 1): kernels' spans and the stream's waits; the host (tid 0): the rest.
  for (const char* name : {"forward", "backward", "optimizer", "clip_grad_norm"})
    BOOST_TEST((tids[name] == std::set<int>{1}), name);
  for (const char* name : {"step", "data", "reshard", "evaluate", "checkpoint_save"})
    BOOST_TEST((tids[name] == std::set<int>{0}), name);
  if (world_size() > 1) {
    BOOST_TEST((tids["wait_for_unshard"] == std::set<int>{1}));
    BOOST_TEST(*tids["all_gather"].begin() >= 2);
  }
  std::set<std::string> names;
  for (const json& e : r.trace.at("traceEvents"))
    if (e.at("ph") == "M" && e.at("name") == "thread_name" && e.at("pid") == 0) names.insert(e.at("args").at("name"));
  BOOST_TEST(names.contains("host"));
  BOOST_TEST(names.contains("compute stream"));
  BOOST_TEST(r.metrics.size() == 4u);
  for (const json& m : r.metrics) BOOST_TEST(m.at("compute_s").get<double>() > 0.0);
}

BOOST_AUTO_TEST_CASE(an_error_leaves_one_file_per_rank) {
  const std::string dir = job_dir("error");
  // Every rank fails in the middle of the save after step 2.
  const Run r = train_once(dir, {}, false, [](int64_t steps) {
    if (steps == 2) throw fsdp::Error("injected failure during the save");
  });
  report(r.error.find("injected failure") != std::string::npos, "expected the injected error, got: " + r.error);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() != 0) return;
  BOOST_TEST(!std::filesystem::exists(dir + "/trace.json"));
  for (int rank = 0; rank < world_size(); ++rank) {
    const std::string path = dir + "/trace.rank" + std::to_string(rank) + ".json";
    std::ifstream f(path);
    BOOST_REQUIRE_MESSAGE(f, path << " missing");
    const std::vector<Span> all = spans(json::parse(f));
    check_nesting(all);
    std::set<int64_t> steps;
    for (const Span& s : all) {
      BOOST_TEST(s.pid == rank);
      steps.insert(s.args.at("step").get<int64_t>());
    }
    BOOST_TEST((steps == std::set<int64_t>{1, 2}));
  }
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    BOOST_TEST(entry.path().extension() != ".tmp", entry.path().string());
}

BOOST_AUTO_TEST_CASE(no_trace_no_breakdown) {
  const std::string dir = job_dir("off");
  std::string error;
  try {
    fsdp::Config c = fsdp::parse_config(kLm, "trace.yaml", {"output.metrics=" + dir + "/metrics.jsonl"});
    auto world = fsdp::make_communicator(c.comm.backend, MPI_COMM_WORLD, {c.comm.timeout_s});
    fsdp::RunEnv env;
    env.rank = env.local_rank = world_rank();
    env.world_size = world_size();
    env.world = world.get();
    env.mpi_comm = MPI_COMM_WORLD;
    const std::unique_ptr<fsdp::Trainer> trainer = fsdp::Trainer::create(c, env);
    trainer->run();
  } catch (const std::exception& e) {
    error = e.what();
  }
  report(error.empty(), "run failed: " + error);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() != 0) return;
  std::ifstream m(dir + "/metrics.jsonl");
  std::string line;
  int steps = 0;
  while (std::getline(m, line)) {
    const json j = json::parse(line);
    if (!j.contains("loss")) continue;
    ++steps;
    BOOST_TEST(!j.contains("compute_s"));
  }
  BOOST_TEST(steps == 4);
  BOOST_TEST(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()) == 1);
}

int main(int argc, char** argv) {
  fsdp::MpiSession mpi(&argc, &argv);
  return ut::unit_test_main(
      [] {
        fsdp::testing::init_mpi_suite("trace");
        return true;
      },
      argc, argv);
}
