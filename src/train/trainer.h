#pragma once
// The training driver: builds data, model, process mesh, FSDP engine and optimizer from a Config
// (the set-up phase, which touches no training collective, so a failure there can be agreed on
// by all ranks and reported once) and then runs the loop — forward, backward, reduce, clip,
// step, schedule, evaluate, report (the run phase). Reads top-down in trainer.cpp.
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fsdp {

struct Config;
class Communicator;
class DeviceRuntime;
class MemoryTracker;
class Dataset;
struct MemoryPlan;
class Timeline;
struct GenerationOptions;
struct CheckpointMeta;
struct CheckpointStats;
struct StepBreakdown;
struct RunScheduleFacts;

struct RunEnv {
  int rank = 0;
  int world_size = 1;
  Communicator* world = nullptr;  // host values over all ranks; null: made by the trainer
  int node_color = 0;             // equal on ranks of one node (hybrid sharding)
  // Every rank's node_color. Empty: the trainer gathers them over `world`.
  std::vector<int> node_color_of_rank;
  int local_rank = 0;                 // rank within the node
  MPI_Comm mpi_comm = MPI_COMM_NULL;  // the same ranks for MPI-IO checkpoints; null: no MPI
  // Makes the runtime train.device names, charging the trainer's tracker. Empty: make_runtime.
  // Tests pass a driverless fake device here (tests/fake_device.h) to check stream order on the CPU.
  // The memory plan (train/plan.h) passes the meta device here.
  std::function<std::unique_ptr<DeviceRuntime>(MemoryTracker&, int local_rank)> make_runtime;
  // A plan's trainer (plan_memory): no files read or written, no output, no plan of its own;
  // Trainer::plan instead of run.
  bool planning = false;
  // A timed plan's clock (tensor/timeline.h), which the meta runtime and communicators advance:
  // Trainer::plan times its last training step on it. Null: memory only.
  Timeline* timeline = nullptr;
  // Tests only (installed by fsdp_app from FSDP_TEST_KILL_RANK_DURING_SAVE): called on every
  // rank in the middle of each save, after it wrote its pieces and before the file is complete.
  std::function<void(int64_t steps_done)> during_save;
  // Applied to the world the trainer makes (fsdp_app's FSDP_TEST_FAULT decorator); may be empty.
  std::function<std::unique_ptr<Communicator>(std::unique_ptr<Communicator>)> decorate_world;
  // Datasets already loaded (a plan made by a trainer gets the trainer's): not loaded again.
  std::shared_ptr<const Dataset> train_data, eval_data;
};

struct TrainSummary {
  int64_t start_step = 0;  // > 0 when resumed from a checkpoint
  int64_t steps = 0;       // steps done, counting those before a resume
  double last_loss = 0.0;
  double eval_loss = -1.0;  // -1 when no evaluation ran
  double eval_accuracy = -1.0;
  double eval_rougeL = -1.0;   // -1 when no ROUGE was scored
  double samples_per_s = 0.0;  // mean over the run, excluding the first step
};

class Trainer {
 public:
  // The set-up phase, in three steps: prepare (device, communicators, data, node map), the memory
  // plan on the meta device checked against this device (a run that cannot fit stops before any
  // of the model is allocated; skipped for a plan's own trainer, env.planning), then the model,
  // engine and optimizer.
  static std::unique_ptr<Trainer> create(const Config& config, const RunEnv& env);
  ~Trainer();
  Trainer(const Trainer&) = delete;  // owns the MPI communicators, engine and open files
  Trainer& operator=(const Trainer&) = delete;
  TrainSummary run();  // run phase
  // fsdp_app --generate N: decodes the first N validation samples (all of them when there are
  // fewer) and prints one JSON line each on rank 0 (train/generation.h); trains nothing.
  void generate(int64_t count);
  // The memory plan (env.planning): the run's own calls, in the shortest sequence that reaches
  // every peak the whole run reaches (train/plan.h).
  MemoryPlan plan();

 private:
  struct StepResult {
    double loss = 0.0;
    double grad_norm = -1.0;  // -1: not computed (no clipping)
    bool applied = true;      // false: an f16 overflow, the optimizer step was skipped
    double loss_scale = 1.0;  // the scale this step's backward ran with
  };
  // Forward and backward of every micro-batch, the reduction, loss scaling, clipping and the
  // optimizer step of global step `step` (0-based).
  StepResult train_step(int64_t step, double lr);
  // output.save_weights: every unit gathered in turn, written by rank 0.
  void write_weights();
  // What rank 0 prints when the run starts (banner.cpp; collective: the host names are gathered).
  void print_banner() const;
  struct EvalResult {
    double loss = 0.0, accuracy = 0.0;
  };
  // The validation set through the FSDP hooks, each rank its slice of every batch, the sums added
  // over all ranks (evaluate.cpp).
  EvalResult evaluate();
  // The events' calls (run() executes the schedule): the metrics line (with the step breakdown
  // when tracing) and progress of one step, an evaluation, a save, and the run's done line.
  void report_step(int64_t step, const StepResult& result, double step_s, const StepBreakdown& breakdown);
  void write_trace_file();  // the end of a traced run (collective)
  // The run's schedule (run_schedule.h) for the steps [start_step, end_step): run() executes
  // every event, plan() the filtered ones.
  RunScheduleFacts schedule_facts(int64_t start_step, int64_t end_step) const;
  void evaluate_and_report(int64_t step_done, int64_t epoch);
  void save_step(int64_t steps_done);
  void finish();  // the done line and metrics
  GenerationOptions generation_options() const;
  // generate.rouge_samples resolved: how many validation samples each evaluation scores.
  int64_t rouge_samples() const;
  void restore();  // the end of set-up: resume, or model.init_from (save_resume.cpp)
  void resume(const std::string& path);
  void init_from_hf();  // model.init_from as a .safetensors file or a Hugging Face folder
  // The root attributes of a checkpoint taken after `steps_done` steps.
  CheckpointMeta position(int64_t steps_done, double lr) const;
  // A non-finite state is not written (NonFiniteCheckpoint): an Error naming the step and the
  // last good checkpoint instead.
  CheckpointStats save(const std::string& path, int64_t steps_done, double lr);
  // "step N: WHAT; the run diverged and stops (last good checkpoint: PATH)".
  std::string diverged(int64_t step, const std::string& what) const;

  struct State;
  static std::unique_ptr<State> prepare(const Config& config, const RunEnv& env);
  explicit Trainer(std::unique_ptr<State> prepared);  // the model, engine, optimizer; restore()
  std::unique_ptr<State> s_;
};

TrainSummary train(const Config& config, const RunEnv& env);

}  // namespace fsdp
