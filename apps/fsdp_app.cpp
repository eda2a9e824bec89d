// fsdp_app INPUT.yaml [--set dotted.key=value ...]
// Trains the model an input file describes. Runs alone, under mpirun and under srun.
// Every error a user can cause ends in one line on stderr and a non-zero exit; with several
// ranks the whole job is aborted so no rank waits forever on one that failed.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/mpi_env.h"
#include "config/config.h"
#include "train/trainer.h"

namespace {

constexpr const char* kUsage =
    "usage: fsdp_app INPUT.yaml [--set dotted.key=value ...]\n"
    "  trains the model described by INPUT.yaml (see input/ and the README)\n";

struct Args {
  std::string input;
  std::vector<std::string> overrides;
  bool help = false;
};

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s == "-h" || s == "--help") {
      a.help = true;
    } else if (s == "--set") {
      if (i + 1 >= argc) throw fsdp::Error("--set needs a dotted.key=value argument");
      a.overrides.push_back(argv[++i]);
    } else if (s.rfind("--set=", 0) == 0) {
      a.overrides.push_back(s.substr(6));
    } else if (s.rfind("-", 0) == 0) {
      throw fsdp::Error("unknown option '" + s + "' (try --help)");
    } else if (a.input.empty()) {
      a.input = s;
    } else {
      throw fsdp::Error("unexpected argument '" + s + "': one input file only");
    }
  }
  if (!a.help && a.input.empty()) throw fsdp::Error("no input file given (usage: fsdp_app INPUT.yaml [--set key=value ...])");
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  fsdp::MpiSession mpi(&argc, &argv);
  try {
    Args args = parse_args(argc, argv);
    if (args.help) {
      if (mpi.rank() == 0) std::fputs(kUsage, stdout);
      return 0;
    }
    fsdp::Config config = fsdp::load_config(args.input, args.overrides);
    // The backend is made before any data is read: an unbuilt or failing backend is the first
    // thing a user hears about.
    std::unique_ptr<fsdp::Communicator> world =
        fsdp::make_communicator(config.comm.backend, MPI_COMM_WORLD, {config.comm.timeout_s});
    fsdp::train(config, {mpi.rank(), mpi.size(), world.get()});
    return 0;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "fsdp_app: rank %d: out of memory\n", mpi.rank());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp_app: %s\n", e.what());
  }
  std::fflush(stderr);
  if (mpi.size() > 1) mpi.abort(1);
  return 1;
}
