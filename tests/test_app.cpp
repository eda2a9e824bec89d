#define BOOST_TEST_MODULE app
#include <boost/test/unit_test.hpp>
// fsdp_app as a user meets it: every bad input gives exactly one line on stderr naming the
// problem and a non-zero exit, never a crash or a hang; good inputs train and write metrics.
// The binary's path is the first argument after `--`.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "config/config.h"
#include "tensor/device.h"

#include "ckpt/h5.h"
#include "models/mnist_cnn/mnist_cnn.h"
#include "models/model.h"
#include "nn/flat.h"

namespace fs = std::filesystem;

namespace {

std::string app_path() {
  auto& suite = boost::unit_test::framework::master_test_suite();
  BOOST_REQUIRE_MESSAGE(suite.argc >= 2, "pass the fsdp_app path after --");
  return suite.argv[suite.argc - 1];
}

struct Run {
  int exit_code = -1;
  std::string out, err;
};

// Runs `[launcher] fsdp_app ARGS` under a timeout, so a hang fails the test instead of the suite,
// and captures the exit code, stdout and stderr.
Run run_with(const std::string& launcher, const std::string& args, int timeout_s) {
  fs::path dir = fs::temp_directory_path() / ("fsdp_app_test_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::string cmd = "timeout " + std::to_string(timeout_s) + " " + launcher + app_path() + " " + args + " >" +
                    (dir / "out").string() + " 2>" + (dir / "err").string();
  int status = std::system(cmd.c_str());
  Run r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  auto slurp = [](const fs::path& p) {
    std::ifstream f(p);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  };
  r.out = slurp(dir / "out");
  r.err = slurp(dir / "err");
  fs::remove_all(dir);
  return r;
}

Run run(const std::string& args) { return run_with("", args, 120); }

struct TempDir {
  fs::path path;
  TempDir() {
    path =
        fs::temp_directory_path() / ("fsdp_app_case_" + std::to_string(getpid()) + "_" + std::to_string(counter()++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  static int& counter() {
    static int n = 0;
    return n;
  }
  std::string file(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return (path / name).string();
  }
};

// Asserts the one-line error contract: non-zero exit, one line on stderr, containing `what`.
void expect_error(const Run& r, const std::string& what) {
  BOOST_TEST(r.exit_code == 1);
  BOOST_TEST(r.err.find(what) != std::string::npos, "stderr: '" << r.err << "' lacks '" << what << "'");
  BOOST_TEST(std::count(r.err.begin(), r.err.end(), '\n') == 1, "stderr is not one line: '" << r.err << "'");
}

// The whole stderr line of a bad command line (apps/cli.h): exit 1 through the agreement path.
void expect_line(const Run& r, const std::string& line) {
  BOOST_TEST(r.exit_code == 1);
  BOOST_TEST(r.err == "fsdp_app: " + line + "\n");
  BOOST_TEST(r.out.empty(), r.out);
}

// Batches of 8: the cases check what the app says and writes, not learning (batches of 32 made
// this suite's CNN steps most of its 66 s under ASan).
const char* kTinyCnn =
    "model: {kind: mnist_cnn}\n"
    "data: {kind: synthetic, synthetic_samples: 256}\n"
    "train: {batch_size: 8, steps: 4, eval_every: never, optimizer: {kind: adadelta}}\n";

}  // namespace

BOOST_AUTO_TEST_CASE(no_arguments_and_bad_options) {
  expect_line(run(""), "no input file given (usage: fsdp_app INPUT.yaml [--set key=value ...])");
  expect_line(run("a.yaml --bogus"), "unknown option '--bogus' (try --help)");
  expect_line(run("a.yaml --bogus=3"), "unknown option '--bogus' (try --help)");
  expect_line(run("-x a.yaml"), "unknown option '-x' (try --help)");
  expect_line(run("a.yaml b.yaml"), "unexpected argument 'b.yaml' (try --help)");
  expect_line(run("a.yaml -- --plan"), "unexpected argument '--plan' (try --help)");  // after --: a word
  expect_line(run("a.yaml --set"), "--set: 1 required dotted.key=value missing (try --help)");
  expect_line(run("a.yaml --plan=2"), "plan was given a disallowed flag override (try --help)");
  expect_line(run("a.yaml --generate"), "--generate: 1 required N missing (try --help)");
  expect_line(run("a.yaml --generate 0"), "--generate: expected a positive number of samples, got '0' (try --help)");
  expect_line(run("a.yaml --generate 1e3"),
              "--generate: expected a positive number of samples, got '1e3' (try --help)");
  expect_line(run("a.yaml --generate 3 --plan"), "--plan and --generate do not go together");
}

// --world-size N: a whole number in [1, 9999999], and only with --plan.
BOOST_AUTO_TEST_CASE(world_size_is_a_positive_number_with_plan) {
  for (const char* bad : {"0", "x", "-3", "+3", "2.5", "10000000", "''"})
    expect_line(run(std::string("a.yaml --plan --world-size ") + bad),
                std::string("--world-size: expected a positive number of ranks, got '") +
                    (std::string(bad) == "''" ? "" : bad) + "' (try --help)");
  expect_line(run("a.yaml --plan --world-size"), "--world-size: 1 required N missing (try --help)");
  expect_line(run("a.yaml --world-size 3"), "--world-size goes with --plan");
  // Every value of a repeated option is checked and the last one counts, as before CLI11.
  expect_line(run("a.yaml --plan --world-size 0 --world-size 3"),
              "--world-size: expected a positive number of ranks, got '0' (try --help)");
  const std::string big = std::string(FSDP_SOURCE_DIR) + "/input/transformer_70b.yaml";
  const Run r = run(big + " --plan --world-size 3 --world-size 512");
  BOOST_TEST(r.exit_code == 0, r.err);
  BOOST_TEST(r.out.find("FULL_SHARD on 512 ranks") != std::string::npos, r.out);
}

// CLI11's --help: exit 0, stdout only, every option with its explanation; once under mpirun.
BOOST_AUTO_TEST_CASE(help_lists_every_option) {
  for (const std::string& args : {std::string("--help"), std::string("-h"), std::string("a.yaml --bogus --help")}) {
    const Run help = run(args);
    BOOST_TEST(help.exit_code == 0, args);
    BOOST_TEST(help.err.empty(), help.err);
    BOOST_TEST(help.out.find("Usage: fsdp_app [OPTIONS] [INPUT.yaml]\n") != std::string::npos, help.out);
    for (const char* option :
         {"-h,--help", "--set dotted.key=value", "--plan ", "--world-size N", "--generate N", "--keys ",
          "plan for N ranks instead of the ranks of this launch", "print the reference of every input file key"})
      BOOST_TEST(help.out.find(option) != std::string::npos, option << " missing from --help: " << help.out);
  }
  const Run once = run_with("mpirun --oversubscribe --bind-to none -np 2 ", "--help", 120);
  BOOST_TEST(once.exit_code == 0, once.err);
  BOOST_TEST(once.out == run("--help").out, "rank 0 alone prints the help: " << once.out);
}

// --set KEY=VALUE and --set=KEY=VALUE, repeated; the word after --set's value is the input file.
BOOST_AUTO_TEST_CASE(set_takes_one_value_in_either_spelling) {
  TempDir d;
  const std::string cfg = d.file("c.yaml", kTinyCnn);
  expect_line(run(cfg + " --set=train.nosuch=1"), "--set train.nosuch: unknown key 'train.nosuch'");
  expect_line(run("--set train.steps=2 --set=train.nosuch=1 " + cfg), "--set train.nosuch: unknown key 'train.nosuch'");
  expect_line(run("--set train.steps=1 /nonexistent/in.yaml"),
              "/nonexistent/in.yaml: cannot read input file (No such file or directory)");
}

// An argument error under mpirun goes through main's agreement: one line, from rank 0.
BOOST_AUTO_TEST_CASE(a_bad_option_under_mpirun_is_one_line) {
  const Run r = run_with("mpirun --oversubscribe --bind-to none -np 2 ", "a.yaml --world-size x --plan", 120);
  BOOST_TEST(r.exit_code == 1, r.err);
  const std::string line = "fsdp_app: --world-size: expected a positive number of ranks, got 'x' (try --help)\n";
  BOOST_TEST(r.err.find(line) != std::string::npos, r.err);
  size_t ours = 0;
  for (size_t at = r.err.find("fsdp_app:"); at != std::string::npos; at = r.err.find("fsdp_app:", at + 1)) ++ours;
  BOOST_TEST(ours == 1u, "one line from rank 0 only: " << r.err);
}

BOOST_AUTO_TEST_CASE(generate_needs_a_model_that_generates) {
  TempDir d;
  const std::string cfg = d.file("c.yaml", kTinyCnn);
  expect_error(run(cfg + " --generate 2"), "--generate needs a model that generates (model.kind t5 or llama); " + cfg +
                                               " has model.kind mnist_cnn");
}

BOOST_AUTO_TEST_CASE(missing_input_file) {
  expect_error(run("/nonexistent/input.yaml"), "/nonexistent/input.yaml: cannot read input file");
}

BOOST_AUTO_TEST_CASE(malformed_yaml) {
  TempDir d;
  std::string f = d.file("bad.yaml", "model:\n  kind: [mnist_cnn\ntrain: {batch_size: 1}\n");
  expect_error(run(f), "malformed YAML");
}

BOOST_AUTO_TEST_CASE(unknown_key_names_file_and_line) {
  TempDir d;
  std::string f = d.file("u.yaml", "model: {kind: mnist_cnn}\ntrain:\n  batchsize: 4\n");
  expect_error(run(f), f + ":3: unknown key 'train.batchsize'");
}

BOOST_AUTO_TEST_CASE(wrong_type) {
  TempDir d;
  std::string f = d.file("t.yaml", "train:\n  batch_size: sixty-four\n");
  expect_error(run(f), f + ":2: train.batch_size: expected an integer");
}

BOOST_AUTO_TEST_CASE(negative_batch_size) {
  TempDir d;
  std::string f = d.file("n.yaml", "train:\n  batch_size: -64\n");
  expect_error(run(f), f + ":2: train.batch_size");
  // The same through --set names the override.
  std::string ok = d.file("ok.yaml", kTinyCnn);
  expect_error(run(ok + " --set train.batch_size=-1"), "--set train.batch_size");
}

BOOST_AUTO_TEST_CASE(missing_data_package) {
  TempDir d;
  std::string f = d.file("m.yaml", "data: {kind: fashion_mnist, path: /nonexistent/fashion}\n");
  expect_error(run(f), "dataset-fashion-mnist");
}

BOOST_AUTO_TEST_CASE(missing_text_corpus) {
  TempDir d;
  std::string f = d.file("m.yaml",
                         "model: {kind: transformer, d_model: 16, n_layers: 1, n_heads: 2, d_ff: 32, seq_len: 8}\n"
                         "data: {kind: text, path: /nonexistent/corpus}\n");
  expect_error(run(f), "/nonexistent/corpus");
}

BOOST_AUTO_TEST_CASE(init_from_missing_and_misshaped) {
  TempDir d;
  std::string cfg = d.file("c.yaml", kTinyCnn);
  expect_error(run(cfg + " --set model.init_from=" + (d.path / "none.h5").string()), "cannot read the file");
  expect_error(run(cfg + " --set model.init_from=" + cfg), "not an HDF5 file");

  // A file holding all but fc2.bias, then one with fc1.weight mis-shaped.
  auto model = fsdp::make_mnist_cnn();
  fsdp::FlatLayout layout = fsdp::make_flat_layout(model->params());
  std::vector<float> flat(layout.numel, 0.5f);
  fsdp::bind_flat(layout, flat.data(), nullptr);
  std::vector<fsdp::Param*> all = layout.params;
  std::vector<fsdp::Param*> missing(all.begin(), all.end() - 1);
  std::string missing_h5 = (d.path / "missing.h5").string();
  fsdp::save_model_weights(missing_h5, missing);
  expect_error(run(cfg + " --set model.init_from=" + missing_h5), "missing tensor /model/fc2.bias");

  fsdp::Param wrong = *all[4];  // fc1.weight [128, 9216]
  wrong.shape = {128, 100};
  std::vector<fsdp::Param*> misshaped = all;
  misshaped[4] = &wrong;
  std::string misshaped_h5 = (d.path / "misshaped.h5").string();
  fsdp::save_model_weights(misshaped_h5, misshaped);
  expect_error(run(cfg + " --set model.init_from=" + misshaped_h5),
               "/model/fc1.weight has shape [128, 100], the model expects [128, 9216]");

  // A complete file loads and trains.
  std::string good_h5 = (d.path / "good.h5").string();
  fsdp::save_model_weights(good_h5, all);
  Run ok = run(cfg + " --set model.init_from=" + good_h5);
  BOOST_TEST(ok.exit_code == 0, ok.err);
}

BOOST_AUTO_TEST_CASE(model_data_mismatch) {
  TempDir d;
  std::string f = d.file("x.yaml",
                         "model: {kind: transformer, d_model: 16, n_layers: 1, n_heads: 2, d_ff: 32, seq_len: 8}\n"
                         "data: {kind: fashion_mnist}\n");
  expect_error(run(f), "model.kind transformer needs tokens");
}

BOOST_AUTO_TEST_CASE(trains_and_writes_metrics_under_mpirun_and_alone) {
  TempDir d;
  std::string cfg = d.file("c.yaml", kTinyCnn);
  std::string metrics = (d.path / "m.jsonl").string();
  for (const std::string& launcher : {std::string(""), std::string("mpirun -np 1 ")}) {
    Run r = run_with(launcher, cfg + " --set output.metrics=" + metrics + " --set train.eval_every=2", 120);
    BOOST_TEST(r.exit_code == 0, launcher << ": " << r.err);
    std::ifstream f(metrics);
    std::string line;
    int steps = 0, evals = 0;
    while (std::getline(f, line)) {
      if (line.find("\"loss\"") != std::string::npos) {
        ++steps;
        for (const char* key : {"\"step\"", "\"epoch\"", "\"lr\"", "\"step_time_s\"", "\"samples_per_s\"",
                                "\"mem_peak_bytes\"", "\"activations\"", "\"params\"", "\"optim\""})
          BOOST_TEST(line.find(key) != std::string::npos, key << " missing in " << line);
      }
      if (line.find("\"eval_loss\"") != std::string::npos) ++evals;
    }
    BOOST_TEST(steps == 4);
    BOOST_TEST(evals == 2);  // after steps 2 and 4
  }
}

BOOST_AUTO_TEST_CASE(a_reduced_matmul_precision_is_announced) {
  TempDir d;
  std::string cfg = d.file("c.yaml", kTinyCnn);
  const std::string line = "fsdp_app: train.matmul_precision medium: GEMM operands rounded to bf16, f32 accumulation";
  Run medium = run(cfg + " --set train.steps=1 --set train.matmul_precision=medium");
  BOOST_TEST(medium.exit_code == 0, medium.err);
  BOOST_TEST(medium.out.find(line) != std::string::npos, medium.out);
  Run highest = run(cfg + " --set train.steps=1");
  BOOST_TEST(highest.exit_code == 0, highest.err);
  BOOST_TEST(highest.out.find("matmul_precision") == std::string::npos, highest.out);
  expect_error(run(cfg + " --set train.matmul_precision=bf16"),
               "train.matmul_precision: expected one of [highest, high, medium], got 'bf16'");
}

Run run_mpi(int np, const std::string& args) {
  return run_with("mpirun --oversubscribe --bind-to none -np " + std::to_string(np) + " ", args, 300);
}

BOOST_AUTO_TEST_CASE(a_bad_input_under_mpirun_is_reported_once) {
  // Every rank sees the same bad key: rank 0 alone reports it, all ranks exit, nothing hangs.
  TempDir d;
  std::string cfg = d.file("c.yaml", kTinyCnn);
  for (int np : {2, 3}) {
    Run r = run_mpi(np, cfg + " --set train.batchsize=3");
    BOOST_TEST(r.exit_code != 0);
    BOOST_TEST(r.exit_code != 124, "mpirun hung until the timeout");
    BOOST_TEST(r.err.find("unknown key 'train.batchsize'") != std::string::npos, r.err);
    // mpirun adds its own banner about the exit code; ours is exactly one line.
    size_t ours = 0;
    for (size_t at = r.err.find("fsdp_app:"); at != std::string::npos; at = r.err.find("fsdp_app:", at + 1)) ++ours;
    BOOST_TEST(ours == 1u, "stderr: " << r.err);
  }
}

// The command line is answered before MPI starts: --help, --keys and a bad option need no MPI.
// With a PML that does not exist MPI_Init cannot succeed (the training run shows it fails), yet
// those three answer as usual; under mpirun the launcher's rank 0 alone prints.
BOOST_AUTO_TEST_CASE(command_line_answers_before_mpi_starts) {
  TempDir d;
  const std::string cfg = d.file("c.yaml", kTinyCnn);
  const std::string no_mpi = "env OMPI_MCA_pml=no_such_pml ";
  const Run train = run_with(no_mpi, cfg, 120);
  BOOST_TEST(train.exit_code != 0, "MPI started with OMPI_MCA_pml=no_such_pml: " << train.err);
  const Run help = run_with(no_mpi, "--help", 120);
  BOOST_TEST(help.exit_code == 0, help.err);
  BOOST_TEST(help.out == run("--help").out);
  const Run keys = run_with(no_mpi, "--keys", 120);
  BOOST_TEST(keys.exit_code == 0, keys.err);
  BOOST_TEST(keys.out.find("train.steps") != std::string::npos);
  expect_line(run_with(no_mpi, cfg + " --bogus", 120), "unknown option '--bogus' (try --help)");
  const Run once = run_mpi(3, cfg + " --bogus");
  BOOST_TEST(once.exit_code != 0);
  BOOST_TEST(once.exit_code != 124, "mpirun hung until the timeout");
  size_t ours = 0;
  for (size_t at = once.err.find("fsdp_app:"); at != std::string::npos; at = once.err.find("fsdp_app:", at + 1)) ++ours;
  BOOST_TEST(ours == 1u, "stderr: " << once.err);
  BOOST_TEST(once.err.find("fsdp_app: unknown option '--bogus' (try --help)\n") != std::string::npos, once.err);
}

// fsdp.node_shared_params is a request: the banner says whether it is on, and why not.
BOOST_AUTO_TEST_CASE(node_shared_params_says_whether_it_is_on) {
  TempDir d;
  const std::string cfg = d.file("c.yaml", kTinyCnn) + " --set train.steps=2 --set fsdp.node_shared_params=true";
  const std::string line = "fsdp_app: fsdp.node_shared_params ";
  const std::vector<std::pair<Run, std::string>> runs = {
      {run_mpi(2, cfg), "on: the node's copy of the parameters, "},
      {run_mpi(2, cfg + " --set comm.backend=ucx"),
       "off: the ucx backend maps no node-shared memory (the mpi backend does); all_gathers as usual"},
      {run_mpi(2, cfg + " --set fsdp.mixed_precision.param_dtype=bf16"), "on: the node's copy of the parameters, "},
      {run(cfg), "off: the shard group has one rank; all_gathers as usual"},
  };
  for (const auto& [r, says] : runs) {
    BOOST_TEST(r.exit_code == 0, r.err);
    BOOST_TEST(r.out.find(line + says) != std::string::npos, r.out);
  }
  Run plain = run_mpi(2, d.file("c.yaml", kTinyCnn) + " --set train.steps=2");
  BOOST_TEST(plain.exit_code == 0, plain.err);
  BOOST_TEST(plain.out.find("node_shared_params") == std::string::npos, plain.out);
}

BOOST_AUTO_TEST_CASE(trains_under_mpirun_with_several_ranks) {
  TempDir d;
  std::string cfg = d.file("c.yaml", kTinyCnn);
  Run r = run_mpi(3, cfg);
  BOOST_TEST(r.exit_code == 0, r.err);
}

BOOST_AUTO_TEST_CASE(unbuilt_backend_is_named_with_the_built_ones) {
  TempDir d;
  std::string cfg = d.file("c.yaml", kTinyCnn);
  // nccl is a valid config value; on a machine without a GPU (or a build without CUDA) it must
  // fail with one line, never crash.
  Run r = run(cfg + " --set comm.backend=nccl");
  if (r.exit_code != 0) {
    expect_error(r, "nccl");
  }
  Run ok = run(cfg + " --set comm.backend=mpi");
  BOOST_TEST(ok.exit_code == 0, ok.err);
}

BOOST_AUTO_TEST_CASE(cuda_device_without_a_gpu_is_one_line) {
  std::string why;
  if (fsdp::cuda_device_count(&why) > 0) {
    BOOST_TEST_MESSAGE("a GPU is present: the no-GPU message is not checked here (tests/test_gpu.cpp runs there)");
    return;
  }
  TempDir d;
  std::string cfg = d.file("c.yaml", kTinyCnn);
  // Built with CUDA: the driver's reason; built without: how to get a CUDA build.
  const std::string want = fsdp::cuda_built() ? "fsdp_app: device cuda: no CUDA device: " + why
                                              : "fsdp_app: device cuda: this binary was built without CUDA";
  expect_error(run(cfg + " --set train.device=cuda"), want);
  // A build without CUDA has no nccl backend: the key's own check names the built ones first.
  expect_error(run(cfg + " --set train.device=cuda --set comm.backend=nccl"),
               fsdp::cuda_built() ? want : "comm.backend: expected one of [mpi");
  expect_error(run(cfg + " --set train.device=tpu"), "train.device: expected one of [cpu, cuda], got 'tpu'");
}

// The shipped T5 jobs need files this checkout does not have (jobs/make-summaries.sh's corpus;
// the tutorial's t5-base folder and wikihowAll.csv): run from an empty folder, each says which
// file is missing in one line instead of failing later.
BOOST_AUTO_TEST_CASE(shipped_t5_jobs_without_their_files_name_the_missing_file) {
  TempDir d;
  const std::string in = std::string(FSDP_SOURCE_DIR) + "/input/",
                    cd = "env -C " + d.path.string() + " ";  // run from the empty folder
  expect_error(run_with(cd, in + "t5_summarize.yaml", 120),
               "fsdp_app: sentencepiece model summaries/spiece.model: cannot open");
  expect_error(run_with(cd, in + "t5_wikihow.yaml --set train.device=cpu --set comm.backend=mpi", 120),
               "fsdp_app: sentencepiece model t5-base/spiece.model: cannot open");
}

// A run whose plan exceeds the node's memory is refused at start with the numbers, before it
// allocates (without the check, NO_SHARD of a large model is killed by the OOM killer minutes in,
// with only mpirun's "exited on signal 9"). NO_SHARD of the 59.6 B-parameter input needs 16 bytes
// per parameter on the one rank: about 950 GB, more than any machine this runs on.
BOOST_AUTO_TEST_CASE(a_run_that_cannot_fit_is_refused_at_start) {
  const std::string big = std::string(FSDP_SOURCE_DIR) + "/input/transformer_70b.yaml";
  for (const char* launcher : {"", "mpirun --oversubscribe --bind-to none -np 2 "}) {
    Run r = run_with(launcher, big + " --set fsdp.sharding_strategy=NO_SHARD --set output.metrics=", 120);
    BOOST_TEST(r.exit_code != 0);
    BOOST_TEST(r.exit_code != 124, "hung");
    BOOST_TEST(r.err.find("memory plan: ") != std::string::npos, r.err);
    BOOST_TEST(r.err.find(" on this node would need ") != std::string::npos, r.err);
    BOOST_TEST(r.err.find("available (MemAvailable)") != std::string::npos, r.err);
    size_t ours = 0;
    for (size_t at = r.err.find("fsdp_app:"); at != std::string::npos; at = r.err.find("fsdp_app:", at + 1)) ++ours;
    BOOST_TEST(ours == 1u, "one line from rank 0 only: " << r.err);
  }
}

// --plan runs the real step on the meta device: a 59.6 B-parameter model at 512 ranks plans here
// without allocating it (the test's own timeout bounds the time; the units are the real ones).
BOOST_AUTO_TEST_CASE(plans_a_70b_class_model_at_512_ranks) {
  const std::string big = std::string(FSDP_SOURCE_DIR) + "/input/transformer_70b.yaml";
  Run r = run_with("", big + " --plan --world-size 512", 60);
  BOOST_TEST(r.exit_code == 0, r.err);
  BOOST_TEST(r.out.find("59,621,883,136 parameters") != std::string::npos, r.out);
  BOOST_TEST(r.out.find("FULL_SHARD on 512 ranks: shard group N = 512, 1 replica, 81 units") != std::string::npos,
             r.out);
  // Every block gathered twice (forward, and again in backward), the root once: 161 all_gathers.
  BOOST_TEST(r.out.find("all_gather      161 calls over 512 ranks") != std::string::npos, r.out);
}

// docs/input-file.md is `fsdp_app --keys` verbatim: the key table in src/config/config.cpp is the
// only place a key is described, and the file cannot drift from it.
BOOST_AUTO_TEST_CASE(keys_reference_is_docs_input_file) {
  const fs::path doc = fs::path(FSDP_SOURCE_DIR) / "docs" / "input-file.md";
  const Run r = run("--keys");
  BOOST_TEST(r.exit_code == 0, r.err);
  BOOST_TEST(r.err.empty(), r.err);
  std::ifstream in(doc);
  std::stringstream file;
  file << in.rdbuf();
  std::istringstream want(r.out), have(file.str());
  std::string a, b;
  int line = 1;
  while (std::getline(want, a) && std::getline(have, b) && a == b) ++line;
  BOOST_TEST(r.out == file.str(), doc.string() << " differs from fsdp_app --keys (first at line " << line
                                               << "); regenerate it: " << app_path() << " --keys > " << doc.string());
}

// Every key of the reader's table has its row in the reference; --keys goes alone.
BOOST_AUTO_TEST_CASE(keys_lists_every_key_and_goes_alone) {
  const Run r = run("--keys");
  BOOST_TEST(r.exit_code == 0, r.err);
  for (const std::string& key : fsdp::input_file_keys())
    BOOST_TEST(r.out.find("\n| `" + key + "` | ") != std::string::npos, key << " has no row in fsdp_app --keys");
  expect_line(run("--keys --bogus"), "unknown option '--bogus' (try --help)");
  const std::string alone = "--keys prints the key reference and goes alone (no input file or other options)";
  expect_line(run("--keys a.yaml"), alone);
  expect_line(run("a.yaml --keys --set train.epochs=2"), alone);
  expect_line(run("--keys --plan"), alone);
  Run help = run("--help");
  BOOST_TEST(help.out.find("--keys") != std::string::npos, help.out);
}
