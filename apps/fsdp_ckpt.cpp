// fsdp_ckpt COMMAND ARGS: looks into, checks and converts fsdp_app's training checkpoints.
//   inspect FILE                 root attributes, every dataset, the sharded index
//   verify FILE                  every tensor's CRC-32, chunk by chunk
//   consolidate IN OUT           sharded -> consolidated
//   reshard IN OUT [--format F]  any format -> any format
//   export-hf CKPT DIR [--dtype D] [--max-shard-size S] a Hugging Face model folder: config.json,
//                                model.safetensors or its shards with their index
// inspect and verify run on one process (rank 0 under mpirun). consolidate and reshard run alone
// or under mpirun -np K for any K: each rank holds 1/K of every unit, loads its slice with
// load_checkpoint and writes it with save_checkpoint, so no rank ever holds the whole state.
// export-hf likewise: each rank loads its slice of the parameters and pwrites it into its place
// in the safetensors file(s).
//
// Errors: one line on stderr (rank 0's) and a non-zero exit, never a crash or a hang: 2 for bad
// arguments, 1 for a bad file or a failed check. A conversion's set-up failures are agreed on by
// all ranks like fsdp_app's; the load and save agree on their own errors.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/safetensors.h"
#include "ckpt/tools.h"
#include "cli.h"
#include "comm/agree.h"
#include "comm/mpi_env.h"
#include "tensor/error.h"
#include "train/model_from_config.h"

namespace {

using fsdp::Error;

// Each command's description in --help: its arguments, then what it does.
constexpr const char* kInspect =
    "FILE: print the root attributes (step, epoch, world size, optimizer,\n"
    "the input file's text, ...), every dataset with its shape, dtype,\n"
    "bytes and crc32, and a sharded file's index; any HDF5 file is listed";
constexpr const char* kVerify =
    "FILE: recompute the CRC-32 of every tensor dataset (and in a sharded\n"
    "file of every parameter and optimizer state in its unit) against the\n"
    "stored ones, reading in 4 MiB chunks; exit 1 on any mismatch";
constexpr const char* kConsolidate =
    "IN OUT [--force]: write sharded checkpoint IN as a consolidated one:\n"
    "/model/<name> and /optim/<name>/<state> at full shape, for h5py and\n"
    "PyTorch users";
constexpr const char* kReshard =
    "IN OUT [--format sharded|consolidated] [--force]: write IN (either\n"
    "format) in the given format (default sharded). A consolidated IN\n"
    "becomes one unit per parameter; a sharded IN keeps its units and\n"
    "their padding";
constexpr const char* kExportHf =
    "CKPT DIR [--dtype f32|bf16|f16] [--max-shard-size S] [--force]: write\n"
    "the parameters of checkpoint CKPT (either format) as a Hugging Face\n"
    "model folder: DIR/model.safetensors (default f32), or past S (default\n"
    "5GB) model-0000K-of-0000N.safetensors and model.safetensors.index.json,\n"
    "and DIR/config.json from the model keys of the checkpoint's config_yaml.\n"
    "t5, llama: from_pretrained(DIR) loads it; the transformer: our names,\n"
    "model_type fsdp_transformer (no HF class)";
constexpr const char* kFooter =
    "consolidate, reshard and export-hf run alone or under mpirun -np K for any K (each rank\n"
    "holds 1/K of the state). fsdp_app itself loads either format at any world size, strategy and wrap\n"
    "policy (checkpoint.resume), so these two only matter for handing files to other tools.\n"
    "OUT is written as OUT.tmp and renamed when complete and verified; an existing OUT is\n"
    "replaced only with --force. Exit status: 0 ok, 1 bad file or failed check, 2 bad arguments.";

struct Args {
  std::string command;
  std::string in, out;                           // the command's file(s): out is empty for inspect, verify
  std::optional<fsdp::CheckpointFormat> format;  // reshard's --format (consolidate: consolidated)
  fsdp::DType dtype = fsdp::DType::f32;          // export-hf's --dtype
  uint64_t max_shard_bytes = fsdp::HfExportOptions{}.max_shard_bytes;  // export-hf's --max-shard-size
  bool force = false;
  bool help = false;      // -h/--help: print help_text
  std::string help_text;  // CLI11's, of the app or of the command whose --help was given
};

// The options belong to the app, not to a command, and commands fall through to them, so they
// are accepted before or after the command as they always were; which command each goes with is
// checked after parsing, in the project's words.
struct Options {
  bool force = false;
  std::string format, dtype, max_shard_size;  // empty: not given (the checks below reject an empty value)
};

void add_options(CLI::App& app, Options& o) {
  app.fallthrough();
  app.add_flag("--force", o.force, "consolidate, reshard, export-hf: replace an existing OUT (or DIR)");
  app.add_option("--format", o.format, "reshard: the output format (default sharded)")
      ->check(CLI::IsMember({"sharded", "consolidated"}));
  app.add_option("--dtype", o.dtype, "export-hf: the dtype of model.safetensors (default f32)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  app.add_option("--max-shard-size", o.max_shard_size,
                 "export-hf: the largest safetensors file before the next one starts, as save_pretrained's "
                 "max_shard_size (5GB, 500MB, 2GiB, bytes; default 5GB)");
}

// One subcommand per command; `in` and `out` are shared, since one command runs.
void add_commands(CLI::App& app, Args& a) {
  app.add_subcommand("inspect", kInspect)->add_option("FILE", a.in, "the checkpoint (any HDF5 file)")->required();
  app.add_subcommand("verify", kVerify)->add_option("FILE", a.in, "the checkpoint")->required();
  for (const auto& [name, text] : {std::pair{"consolidate", kConsolidate}, std::pair{"reshard", kReshard}}) {
    CLI::App* command = app.add_subcommand(name, text);
    command->add_option("IN", a.in, "the checkpoint to read")->required();
    command->add_option("OUT", a.out, "the checkpoint file to write")->required();
  }
  CLI::App* command = app.add_subcommand("export-hf", kExportHf);
  command->add_option("CKPT", a.in, "the checkpoint to read")->required();
  command->add_option("DIR", a.out, "the model folder to write")->required();
}

// Every rank parses the same argv, before MPI starts; main prints an error once and exits 2.
Args parse_args(int argc, char** argv) {
  Args a;
  Options o;
  CLI::App app{"Looks into, checks and converts fsdp_app's training checkpoints.", "fsdp_ckpt"};
  fsdp_cli::configure(app);
  app.footer(kFooter);
  add_options(app, o);
  add_commands(app, a);
  if (fsdp_cli::parse(app, argc, argv)) {
    a.help = true;
    a.help_text = app.help();
    return a;
  }
  a.command = app.get_subcommands().front()->get_name();
  a.force = o.force;
  if (!o.dtype.empty() && a.command != "export-hf") throw Error("--dtype goes with export-hf");
  if (!o.max_shard_size.empty() && a.command != "export-hf") throw Error("--max-shard-size goes with export-hf");
  if (!o.max_shard_size.empty()) a.max_shard_bytes = fsdp::parse_shard_size(o.max_shard_size);
  if (!o.format.empty() && a.command != "reshard") throw Error("--format goes with reshard");
  if (a.force && a.command != "consolidate" && a.command != "reshard" && a.command != "export-hf")
    throw Error("--force goes with consolidate, reshard or export-hf");
  if (!o.dtype.empty()) a.dtype = fsdp::parse_dtype(o.dtype);
  if (!o.format.empty()) a.format = fsdp::parse_enum<fsdp::CheckpointFormat>(o.format);
  if (a.command == "consolidate") a.format = fsdp::CheckpointFormat::consolidated;
  if (a.command == "reshard" && !a.format) a.format = fsdp::CheckpointFormat::sharded;
  return a;
}

// ---- inspect, verify --------------------------------------------------------------------

int inspect(const std::string& path) {
  fsdp::print_checkpoint(path);
  return 0;
}

int verify(const std::string& path) {
  fsdp::CheckpointVerifyReport r = fsdp::verify_checkpoint(path);
  for (const std::string& p : r.problems) std::printf("%s\n", p.c_str());
  if (!r.problems.empty()) {
    std::printf("FAILED: %zu problem%s in %s\n", r.problems.size(), r.problems.size() == 1 ? "" : "s", path.c_str());
    return 1;
  }
  std::printf("OK: %lld datasets, %lld bytes verified\n", static_cast<long long>(r.datasets),
              static_cast<long long>(r.bytes));
  return 0;
}

// ---- consolidate / reshard -------------------------------------------------------------

int convert(const Args& args, const fsdp::MpiSession& mpi) {
  const std::string& in = args.in;
  const std::string& out = args.out;
  std::unique_ptr<fsdp::CheckpointSlice> slice;
  std::string setup_error;
  try {
    // The input first: a missing or foreign input is the error to report, whatever OUT is.
    slice = fsdp::slice_checkpoint(in, mpi.rank(), mpi.size());
    fsdp::check_convert_output(in, out, args.force);
  } catch (const std::exception& e) {
    setup_error = fsdp::describe(e);
  }
  const fsdp::Agreement setup = fsdp::agree_on_error(MPI_COMM_WORLD, setup_error);
  if (!setup.ok()) {
    if (setup.all_failed() && mpi.rank() == 0) std::fprintf(stderr, "fsdp_ckpt: %s\n", setup_error.c_str());
    if (!setup_error.empty() && !setup.all_failed())
      std::fprintf(stderr, "fsdp_ckpt: rank %d: %s\n", mpi.rank(), setup_error.c_str());
    return 1;
  }

  const fsdp::CheckpointMeta& meta = slice->contents.meta;
  fsdp::LoadOptions load_options;
  load_options.optimizer_state = true;
  load_options.optimizer = meta.optimizer;
  fsdp::SaveOptions save_options;
  save_options.format = *args.format;
  fsdp::CheckpointStats load_stats, save_stats;
  try {
    // Both agree on their errors: every rank throws the same Error, none is left waiting.
    fsdp::CheckpointMeta loaded = fsdp::load_checkpoint(in, slice->state, load_options, MPI_COMM_WORLD, &load_stats);
    save_stats = fsdp::save_checkpoint(out, slice->state, loaded, save_options, MPI_COMM_WORLD);
  } catch (const Error& e) {
    if (mpi.rank() == 0) std::fprintf(stderr, "fsdp_ckpt: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp_ckpt: rank %d: %s\n", mpi.rank(), fsdp::describe(e).c_str());
    std::fflush(stderr);
    if (mpi.size() > 1) mpi.abort(1);
    return 1;
  }
  if (mpi.rank() == 0) {
    const std::string units = args.format == fsdp::CheckpointFormat::sharded
                                  ? ", " + std::to_string(slice->state.units.size()) + " units"
                                  : std::string();
    std::printf(
        "%s (%s, %zu tensors, step %lld) -> %s (%s%s): %.1f MB read in %.2f s, written in %.2f s on %d rank%s\n",
        in.c_str(), fsdp::name_of(fsdp::kCheckpointFormats, meta.format).data(), slice->contents.tensors.size(),
        static_cast<long long>(meta.step), out.c_str(), fsdp::name_of(fsdp::kCheckpointFormats, *args.format).data(),
        units.c_str(), load_stats.bytes / 1e6, load_stats.seconds, save_stats.seconds, mpi.size(),
        mpi.size() == 1 ? "" : "s");
  }
  return 0;
}

// ---- export-hf -------------------------------------------------------------------------

// Every rank's outcome of a phase; false (after printing the first failure, once) when any failed.
bool all_ok(const std::string& error, const fsdp::MpiSession& mpi) {
  const fsdp::Agreement a = fsdp::agree_on_error(MPI_COMM_WORLD, error);
  if (!a.ok() && mpi.rank() == 0) std::fprintf(stderr, "fsdp_ckpt: %s\n", a.text().c_str());
  return a.ok();
}

int export_hf(const Args& args, const fsdp::MpiSession& mpi) {
  const std::string& in = args.in;
  const std::string& dir = args.out;
  std::unique_ptr<fsdp::HfExport> job;
  std::string error;
  try {
    job = std::make_unique<fsdp::HfExport>(in, dir, fsdp::HfExportOptions{args.dtype, args.force, args.max_shard_bytes},
                                           mpi.rank(), mpi.size(), fsdp::make_model);
    if (mpi.rank() == 0) job->create_file();
  } catch (const std::exception& e) {
    error = fsdp::describe(e);
  }
  if (!all_ok(error, mpi)) return 1;

  fsdp::CheckpointStats load_stats;
  try {
    load_stats = job->load(MPI_COMM_WORLD);
  } catch (const Error& e) {  // agreed inside: the same on every rank
    if (mpi.rank() == 0) std::fprintf(stderr, "fsdp_ckpt: %s\n", e.what());
    if (mpi.rank() == 0) job->remove_partial();  // best effort: the error above is what matters
    return 1;
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    job->write_slice(mpi.rank() == 0);
    error.clear();
  } catch (const std::exception& e) {
    error = fsdp::describe(e);
  }
  if (!all_ok(error, mpi)) {
    if (mpi.rank() == 0) job->remove_partial();  // best effort, as above
    return 1;
  }
  if (mpi.rank() == 0) {
    try {
      job->finish();
      const fsdp::SafetensorsReader check(dir);  // the header as any reader sees it
      const fsdp::CheckpointMeta& meta = job->slice().contents.meta;
      std::printf(
          "%s (%s, step %lld) -> %s: %zu tensors in %zu file%s, %s, %.1f MB; read in %.2f s, written in %.2f s on %d "
          "rank%s\n",
          in.c_str(), fsdp::name_of(fsdp::kCheckpointFormats, meta.format).data(), static_cast<long long>(meta.step),
          dir.c_str(), check.tensors().size(), job->file_count(), job->file_count() == 1 ? "" : "s",
          fsdp::dtype_name(args.dtype).data(), static_cast<double>(job->file_bytes()) / 1e6, load_stats.seconds,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), mpi.size(),
          mpi.size() == 1 ? "" : "s");
      error.clear();
    } catch (const std::exception& e) {
      error = fsdp::describe(e);
    }
  }
  return all_ok(error, mpi) ? 0 : 1;
}
}  // namespace

int main(int argc, char** argv) {
  Args args;
  // Before MPI starts (the same answer on every rank; the launcher's rank 0 prints it).
  try {
    args = parse_args(argc, argv);
  } catch (const std::exception& e) {
    if (fsdp_cli::launcher_rank() == 0) std::fprintf(stderr, "fsdp_ckpt: %s\n", fsdp::describe(e).c_str());
    return 2;
  }
  if (args.help) {
    if (fsdp_cli::launcher_rank() == 0) std::fputs(args.help_text.c_str(), stdout);
    return 0;
  }
  fsdp::MpiSession mpi(&argc, &argv);
  if (args.command == "consolidate" || args.command == "reshard") return convert(args, mpi);
  if (args.command == "export-hf") return export_hf(args, mpi);

  // inspect and verify: one process reads, the others wait for its exit status.
  int rc = 0;
  if (mpi.rank() == 0) {
    try {
      rc = args.command == "inspect" ? inspect(args.in) : verify(args.in);
    } catch (const std::exception& e) {
      std::fflush(stdout);
      std::fprintf(stderr, "fsdp_ckpt: %s\n", fsdp::describe(e).c_str());
      rc = 1;
    }
    std::fflush(stdout);
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return rc;
}
