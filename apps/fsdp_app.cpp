// fsdp_app INPUT.yaml [--set dotted.key=value ...]
// Trains the model an input file describes. Runs alone, under mpirun and under srun.
// fsdp_app --keys prints the input file's key reference (docs/input-file.md).
//
// Errors: every error a user can cause ends in one line on stderr and a non-zero exit. The command
// line is read before MPI starts (the same on every rank). Set-up (input file, backend, data,
// model, mesh) touches no training collective, so its
// failures are agreed on by all ranks first: if every rank failed the same way rank 0 alone
// reports it, otherwise each failing rank names itself; then all ranks exit cleanly. A failure
// while training aborts the whole job so no rank waits forever on one that is gone.
#include <mpi.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "cli.h"
#include "comm/agree.h"
#include "comm/comm.h"
#include "comm/mpi_env.h"
#include "config/cluster.h"
#include "config/config.h"
#include "test_faults.h"
#include "train/plan.h"
#include "train/trainer.h"

namespace {

struct Args {
  std::string input;
  std::vector<std::string> overrides;
  bool help = false;      // -h/--help: print help_text
  std::string help_text;  // CLI11's, from the options below
  bool keys = false;      // --keys: print the key reference
  bool plan = false;
  int plan_world_size = 0;  // 0: this launch's
  std::string cluster;      // --cluster: a timed plan on this preset or file
  int ranks_per_node = 0;   // 0: the cluster's devices_per_node
  bool suggest = false;     // --suggest: rank the strategies on the cluster
  int64_t generate = 0;     // --generate N: samples to decode instead of training
};

// Every rank parses the same argv, before MPI starts; an error is an fsdp::Error, which main
// reports on the launcher's rank 0.
Args parse_args(int argc, char** argv) {
  Args a;
  CLI::App app{"Trains the model described by INPUT.yaml (see input/ and the README).", "fsdp_app"};
  fsdp_cli::configure(app);
  app.add_option("INPUT.yaml", a.input, "the input file (one); --keys takes none")->type_name("");
  app.add_option("--set", a.overrides,
                 "set an input file key, overriding the file; repeatable,\n"
                 "also spelt --set=dotted.key=value")
      ->type_name("dotted.key=value")
      ->take_all()
      ->allow_extra_args(false);  // one value per --set: a later word is the input file
  app.add_flag("--plan", a.plan,
               "print the predicted per-rank memory by category and the bytes each\n"
               "collective moves per step, then exit without training");
  app.add_option("--world-size", a.plan_world_size, "plan for N ranks instead of the ranks of this launch")
      ->type_name("N")
      ->check(fsdp_cli::integer_in(1, 9'999'999, "a positive number of ranks"));
  app.add_option("--cluster", a.cluster,
                 "with --plan: also predict the step's time, tokens/s, MFU and exposed\n"
                 "communication on this cluster: a preset (dgx-h100, dgx-h200, a100-node,\n"
                 "cpu-2core) or a YAML file (docs/performance.md, Timed plan)")
      ->type_name("NAME|FILE");
  app.add_option("--ranks-per-node", a.ranks_per_node,
                 "with --plan --world-size: ranks on each node (default: the cluster's\n"
                 "devices per node, or one node for the whole world without --cluster)")
      ->type_name("N")
      ->check(fsdp_cli::integer_in(1, 9'999'999, "a positive number of ranks"));
  app.add_flag("--suggest", a.suggest,
               "with --plan --cluster: rank FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD and\n"
               "NO_SHARD, with and without activation checkpointing and cpu_offload, by\n"
               "predicted step time among those that fit in memory");
  app.add_option("--generate", a.generate,
                 "decode the first N validation samples (sequence-to-sequence models) and\n"
                 "print one JSON line each (index, source, reference, generated); no training")
      ->type_name("N")
      ->check(fsdp_cli::integer_in(1, 999'999'999, "a positive number of samples"));
  app.add_flag("--keys", a.keys,
               "print the reference of every input file key (Markdown: docs/input-file.md)\n"
               "and exit; takes no input file");
  if (fsdp_cli::parse(app, argc, argv)) {
    a.help = true;
    a.help_text = app.help();
    return a;
  }
  if (a.plan_world_size > 0 && !a.plan) throw fsdp::Error("--world-size goes with --plan");
  if (!a.cluster.empty() && !a.plan) throw fsdp::Error("--cluster goes with --plan");
  if (a.suggest && (!a.plan || a.cluster.empty())) throw fsdp::Error("--suggest goes with --plan --cluster C");
  if (a.ranks_per_node > 0 && a.plan_world_size == 0)
    throw fsdp::Error("--ranks-per-node goes with --plan --world-size (a launch's plan uses its own nodes)");
  if (a.plan && a.generate > 0) throw fsdp::Error("--plan and --generate do not go together");
  if (a.keys && (!a.input.empty() || !a.overrides.empty() || a.plan || a.generate > 0))
    throw fsdp::Error("--keys prints the key reference and goes alone (no input file or other options)");
  if (!a.keys && a.input.empty())
    throw fsdp::Error("no input file given (usage: fsdp_app INPUT.yaml [--set key=value ...])");
  return a;
}

// --plan (and --suggest): the real step on the meta device: a plan for any size runs anywhere,
// allocating nothing.
std::string plan_text(const Args& args, const fsdp::Config& config, const fsdp::MpiSession& mpi) {
  fsdp::PlanRequest request;
  request.world_size = args.plan_world_size > 0 ? args.plan_world_size : mpi.size();
  // HYBRID with shard_group_size 0 shards over a node: this launch's nodes, or one node for
  // a --world-size of its own.
  if (args.plan_world_size == 0) request.node_color_of_rank = mpi.node_color_of_rank();
  request.ranks_per_node = args.ranks_per_node;
  std::optional<fsdp::ClusterSpec> cluster;
  if (!args.cluster.empty()) cluster = fsdp::load_cluster(args.cluster);
  request.cluster = cluster ? &*cluster : nullptr;
  if (args.suggest) return fsdp::suggestions_text(fsdp::suggest_strategies(config, request), request);
  const fsdp::MemoryPlan plan = fsdp::plan_memory(config, request);
  std::string text = plan.text();
  if (plan.time) text += plan.time->text(plan.world_size);
  return text;
}

// The trainer makes the run's communicators (train/communicators.h) over MPI_COMM_WORLD.
std::unique_ptr<fsdp::Trainer> make_trainer(const fsdp::Config& config, const fsdp::MpiSession& mpi) {
  const fsdp_app::TestFaults faults = fsdp_app::test_faults_from_env(mpi.rank());  // tests only
  fsdp::RunEnv env;
  env.rank = mpi.rank();
  env.world_size = mpi.size();
  env.node_color = mpi.node_color();
  env.node_color_of_rank = mpi.node_color_of_rank();
  env.local_rank = mpi.local_rank();
  env.mpi_comm = MPI_COMM_WORLD;
  env.during_save = faults.during_save;
  if (faults.comm_faults)
    env.decorate_world = [comm = faults.comm](std::unique_ptr<fsdp::Communicator> world) {
      return fsdp::make_faulty_communicator(std::move(world), comm);
    };
  return fsdp::Trainer::create(config, env);
}

}  // namespace

int main(int argc, char** argv) {
  // The command line first, before MPI starts: every rank parses the same argv, so --help,
  // --keys and a bad option are the same answer on each, and the launcher's rank 0 gives it.
  Args args;
  try {
    args = parse_args(argc, argv);
  } catch (const std::exception& e) {
    if (fsdp_cli::launcher_rank() == 0) std::fprintf(stderr, "fsdp_app: %s\n", fsdp::describe(e).c_str());
    return 1;
  }
  if (args.help || args.keys) {
    if (fsdp_cli::launcher_rank() == 0)
      std::fputs(args.help ? args.help_text.c_str() : fsdp::input_file_reference().c_str(), stdout);
    return 0;
  }
  fsdp::MpiSession mpi(&argc, &argv);
  std::unique_ptr<fsdp::Trainer> trainer;
  std::string setup_error;
  int64_t generate = 0;
  try {
    fsdp::Config config = fsdp::load_config(args.input, args.overrides);
    generate = args.generate;
    if (generate > 0 && !config.model.family().generates)
      throw fsdp::Error("--generate needs a model that generates (model.kind " + fsdp::generating_family_names() +
                        "); " + args.input + " has model.kind " + config.model.kind);
    if (args.plan) {
      const std::string text = plan_text(args, config, mpi);
      if (mpi.rank() == 0) std::fputs(text.c_str(), stdout);
      return 0;
    }
    trainer = make_trainer(config, mpi);
  } catch (const std::exception& e) {
    setup_error = fsdp::describe(e);
    if (setup_error.empty()) setup_error = "unknown error";
  }
  const fsdp::Agreement setup = fsdp::agree_on_error(MPI_COMM_WORLD, setup_error);
  if (!setup.ok()) {
    const bool failed = !setup_error.empty();
    if (setup.all_failed() && mpi.rank() == 0) std::fprintf(stderr, "fsdp_app: %s\n", setup_error.c_str());
    if (failed && !setup.all_failed()) std::fprintf(stderr, "fsdp_app: rank %d: %s\n", mpi.rank(), setup_error.c_str());
    return 1;
  }
  try {
    if (generate > 0)
      trainer->generate(generate);
    else
      trainer->run();
    return 0;
  } catch (const fsdp::AgreedError& e) {
    // Every rank stopped here with this message: one line, and a normal end on every rank.
    if (mpi.rank() == 0) std::fprintf(stderr, "fsdp_app: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    if (mpi.size() > 1)
      std::fprintf(stderr, "fsdp_app: rank %d: %s\n", mpi.rank(), fsdp::describe(e).c_str());
    else
      std::fprintf(stderr, "fsdp_app: %s\n", fsdp::describe(e).c_str());
  }
  std::fflush(stderr);
  if (mpi.size() > 1) mpi.abort(1);
  return 1;
}
