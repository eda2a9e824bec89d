// fsdp_ckpt COMMAND ARGS: looks into, checks and converts fsdp_app's training checkpoints.
//   inspect FILE                 root attributes, every dataset, the sharded index
//   verify FILE                  every tensor's CRC-32, chunk by chunk
//   consolidate IN OUT           sharded -> consolidated
//   reshard IN OUT [--format F]  any format -> any format
//   export-hf CKPT DIR [--dtype D] a Hugging Face model folder: config.json, model.safetensors
// inspect and verify run on one process (rank 0 under mpirun). consolidate and reshard run alone
// or under mpirun -np K for any K: each rank holds 1/K of every unit, loads its slice with
// load_checkpoint and writes it with save_checkpoint, so no rank ever holds the whole state.
// export-hf likewise: each rank loads its slice of the parameters and pwrites it into its place
// in the one safetensors file.
//
// Errors: one line on stderr (rank 0's) and a non-zero exit, never a crash or a hang: 2 for bad
// arguments, 1 for a bad file or a failed check. A conversion's set-up failures are agreed on by
// all ranks like fsdp_app's; the load and save agree on their own errors.
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/h5.h"
#include "ckpt/internal.h"
#include "ckpt/safetensors.h"
#include "comm/agree.h"
#include "comm/mpi_env.h"
#include "config/config.h"
#include "config/hf_config.h"
#include "models/model.h"
#include "tensor/error.h"
#include "train/model_from_config.h"

namespace {

namespace fs = std::filesystem;
using fsdp::Error;

constexpr const char* kUsage =
    "usage: fsdp_ckpt COMMAND ARGS\n"
    "  inspect FILE        print the root attributes (step, epoch, world size, optimizer, the\n"
    "                      input file's text, ...), every dataset with its shape, dtype, bytes\n"
    "                      and crc32, and a sharded file's index; any HDF5 file is listed\n"
    "  verify FILE         recompute the CRC-32 of every tensor dataset (and in a sharded file of\n"
    "                      every parameter and optimizer state in its unit) against the stored\n"
    "                      ones, reading in 4 MiB chunks; exit 1 on any mismatch\n"
    "  consolidate IN OUT [--force]\n"
    "                      write sharded checkpoint IN as a consolidated one: /model/<name> and\n"
    "                      /optim/<name>/<state> at full shape, for h5py and PyTorch users\n"
    "  reshard IN OUT [--format sharded|consolidated] [--force]\n"
    "                      write IN (either format) in the given format (default sharded). A\n"
    "                      consolidated IN becomes one unit per parameter; a sharded IN keeps\n"
    "                      its units and their padding\n"
    "  export-hf CKPT DIR [--dtype f32|bf16|f16] [--force]\n"
    "                      write the parameters of checkpoint CKPT (either format) as a Hugging\n"
    "                      Face model folder: DIR/model.safetensors (default f32) and\n"
    "                      DIR/config.json from the model keys of the checkpoint's config_yaml.\n"
    "                      t5: T5ForConditionalGeneration.from_pretrained(DIR) loads it; the\n"
    "                      transformer: our names, model_type fsdp_transformer (no HF class)\n"
    "\n"
    "consolidate, reshard and export-hf run alone or under mpirun -np K for any K (each rank\n"
    "holds 1/K of the state). fsdp_app itself loads either format at any world size, strategy and wrap\n"
    "policy (checkpoint.resume), so these two only matter for handing files to other tools.\n"
    "OUT is written as OUT.tmp and renamed when complete and verified; an existing OUT is\n"
    "replaced only with --force. Exit status: 0 ok, 1 bad file or failed check, 2 bad arguments.\n";

struct Args {
  std::string command;
  std::vector<std::string> files;
  std::string format;  // reshard's --format
  std::string dtype;   // export-hf's --dtype
  bool force = false;
  bool help = false;
};

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "-h" || s == "--help") {
      a.help = true;
    } else if (s == "--force") {
      a.force = true;
    } else if (s == "--format" || s.rfind("--format=", 0) == 0) {
      if (s == "--format" && i + 1 >= argc) throw Error("--format needs sharded or consolidated");
      a.format = s == "--format" ? argv[++i] : s.substr(9);
      if (a.format != "sharded" && a.format != "consolidated")
        throw Error("--format '" + a.format + "': expected sharded or consolidated");
    } else if (s == "--dtype" || s.rfind("--dtype=", 0) == 0) {
      if (s == "--dtype" && i + 1 >= argc) throw Error("--dtype needs f32, bf16 or f16");
      a.dtype = s == "--dtype" ? argv[++i] : s.substr(8);
      if (a.dtype != "f32" && a.dtype != "bf16" && a.dtype != "f16")
        throw Error("--dtype '" + a.dtype + "': expected f32, bf16 or f16");
    } else if (s.rfind('-', 0) == 0 && s.size() > 1) {
      throw Error("unknown option '" + s + "' (try --help)");
    } else if (a.command.empty()) {
      a.command = s;
    } else {
      a.files.push_back(s);
    }
  }
  if (a.help) return a;
  if (a.command.empty())
    throw Error("no command given: inspect, verify, consolidate, reshard or export-hf (try --help)");
  size_t files = 0;
  if (a.command == "inspect" || a.command == "verify")
    files = 1;
  else if (a.command == "consolidate" || a.command == "reshard" || a.command == "export-hf")
    files = 2;
  else
    throw Error("unknown command '" + a.command + "': expected inspect, verify, consolidate, reshard or export-hf");
  if (a.files.size() != files)
    throw Error(a.command + " takes " +
                (files == 1                 ? "one file"
                 : a.command == "export-hf" ? "a checkpoint and an output folder"
                                            : "an input and an output file") +
                ", got " + std::to_string(a.files.size()) + " (try --help)");
  if (!a.dtype.empty() && a.command != "export-hf") throw Error("--dtype goes with export-hf");
  if (a.dtype.empty()) a.dtype = "f32";
  if (!a.format.empty() && a.command != "reshard") throw Error("--format goes with reshard");
  if (a.force && a.command != "consolidate" && a.command != "reshard" && a.command != "export-hf")
    throw Error("--force goes with consolidate, reshard or export-hf");
  if (a.command == "consolidate") a.format = "consolidated";
  if (a.command == "reshard" && a.format.empty()) a.format = "sharded";
  return a;
}

std::string describe(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e)) return "out of memory";
  return e.what();
}

// ---- inspect ---------------------------------------------------------------------------

std::string number(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string dtype_name(hid_t type) {
  const size_t size = H5Tget_size(type);
  switch (H5Tget_class(type)) {
    case H5T_FLOAT: return "f" + std::to_string(size * 8);
    case H5T_INTEGER: return (H5Tget_sign(type) == H5T_SGN_NONE ? "u" : "i") + std::to_string(size * 8);
    case H5T_STRING: return H5Tis_variable_str(type) > 0 ? "string" : "string[" + std::to_string(size) + "]";
    case H5T_COMPOUND: return "compound";
    case H5T_ENUM: return "enum";
    case H5T_ARRAY: return "array";
    default: return "other";
  }
}

// An attribute's value as text: a scalar bare, an array as [a, b, ...] (at most 64 shown).
std::string attr_text(hid_t attr) {
  fsdp::H5Id type(H5Aget_type(attr), H5Tclose);
  fsdp::H5Id space(H5Aget_space(attr), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  const bool scalar = H5Sget_simple_extent_type(space.get()) == H5S_SCALAR;
  if (n < 0 || n > (1 << 20)) return "(" + dtype_name(type.get()) + " attribute, " + std::to_string(n) + " elements)";
  std::vector<std::string> items;
  const H5T_class_t cls = H5Tget_class(type.get());
  bool ok = true;
  if (cls == H5T_INTEGER && H5Tget_sign(type.get()) == H5T_SGN_NONE) {
    std::vector<unsigned long long> v(n);
    ok = n == 0 || H5Aread(attr, H5T_NATIVE_ULLONG, v.data()) >= 0;
    for (auto x : v) items.push_back(std::to_string(x));
  } else if (cls == H5T_INTEGER) {
    std::vector<long long> v(n);
    ok = n == 0 || H5Aread(attr, H5T_NATIVE_LLONG, v.data()) >= 0;
    for (auto x : v) items.push_back(std::to_string(x));
  } else if (cls == H5T_FLOAT) {
    std::vector<double> v(n);
    ok = n == 0 || H5Aread(attr, H5T_NATIVE_DOUBLE, v.data()) >= 0;
    for (double x : v) items.push_back(number(x));
  } else if (cls == H5T_STRING && H5Tis_variable_str(type.get()) > 0) {
    fsdp::H5Id mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    std::vector<char*> v(n, nullptr);
    ok = n == 0 || H5Aread(attr, mem.get(), v.data()) >= 0;
    for (char* p : v) {
      items.emplace_back(p ? p : "");
      if (ok) H5free_memory(p);
    }
  } else if (cls == H5T_STRING) {
    const size_t width = H5Tget_size(type.get());
    fsdp::H5Id mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.get(), width);
    std::vector<char> buf(static_cast<size_t>(n) * width + 1, '\0');
    ok = n == 0 || H5Aread(attr, mem.get(), buf.data()) >= 0;
    for (hssize_t i = 0; i < n; ++i) items.emplace_back(buf.data() + i * width, strnlen(buf.data() + i * width, width));
  } else {
    return "(" + dtype_name(type.get()) + " attribute)";
  }
  if (!ok) return "(unreadable " + dtype_name(type.get()) + " attribute)";
  if (scalar && items.size() == 1) return items[0];
  std::string s = "[";
  for (size_t i = 0; i < items.size() && i < 64; ++i) s += (i ? ", " : "") + items[i];
  if (items.size() > 64) s += ", ... (" + std::to_string(items.size()) + " values)";
  return s + "]";
}

std::vector<std::string> attr_names(hid_t obj) {
  std::vector<std::string> names;
  H5Aiterate2(
      obj, H5_INDEX_NAME, H5_ITER_INC, nullptr,
      [](hid_t, const char* name, const H5A_info_t*, void* out) -> herr_t {
        static_cast<std::vector<std::string>*>(out)->push_back(name);
        return 0;
      },
      &names);
  return names;
}

void print_table(const std::vector<std::vector<std::string>>& rows, const std::vector<bool>& right) {
  std::vector<size_t> width;
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) {
      if (width.size() <= c) width.push_back(0);
      width[c] = std::max(width[c], r[c].size());
    }
  for (const auto& r : rows) {
    std::string line = " ";
    for (size_t c = 0; c < r.size(); ++c) {
      const bool align_right = c < right.size() && right[c], last = c + 1 == r.size();
      line.push_back(' ');
      if (align_right) line.append(width[c] - r[c].size(), ' ');
      line.append(r[c]);
      if (!align_right && !last) line.append(width[c] - r[c].size(), ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::puts(line.c_str());
  }
}

// The root attributes, fsdp-hpc's in the order CheckpointMeta lists them (the file's order but
// format ahead of format_version); multi-line strings (config_yaml) last, as indented text.
void print_attributes(hid_t root) {
  static const std::vector<std::string> order = [] {
    std::vector<std::string> names = fsdp::ckpt::meta_attribute_names();
    std::swap(names[0], names[1]);
    return names;
  }();
  std::vector<std::string> names = attr_names(root);
  std::stable_sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
    auto rank = [](const std::string& s) { return std::find(order.begin(), order.end(), s) - order.begin(); };
    return rank(a) < rank(b);
  });
  std::vector<std::vector<std::string>> rows;
  std::vector<std::pair<std::string, std::string>> blocks;
  for (const std::string& name : names) {
    fsdp::H5Id a(H5Aopen(root, name.c_str(), H5P_DEFAULT), H5Aclose);
    std::string text = a.valid() ? attr_text(a.get()) : "(unreadable)";
    if (text.find('\n') != std::string::npos)
      blocks.emplace_back(name, text);
    else
      rows.push_back({name, text});
  }
  std::printf("attributes:%s\n", names.empty() ? " none" : "");
  print_table(rows, {});
  for (const auto& [name, text] : blocks) {
    std::printf("  %s:\n", name.c_str());
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) std::printf("    %s\n", line.c_str());
  }
}

// Every dataset (links by name, depth first) with shape, dtype, bytes and crc32 attribute.
void print_datasets(hid_t root) {
  struct Walk {
    std::vector<std::vector<std::string>> rows{{"dataset", "shape", "dtype", "bytes", "crc32"}};
    int64_t count = 0, bytes = 0;
  } walk;
  H5Lvisit(
      root, H5_INDEX_NAME, H5_ITER_INC,
      [](hid_t r, const char* name, const H5L_info_t* info, void* out) -> herr_t {
        auto& w = *static_cast<Walk*>(out);
        const std::string path = std::string("/") + name;
        if (info->type != H5L_TYPE_HARD) {
          w.rows.push_back({path, info->type == H5L_TYPE_SOFT ? "(soft link)" : "(external link)", "", "", ""});
          return 0;
        }
        fsdp::H5Id obj(H5Oopen(r, name, H5P_DEFAULT), H5Oclose);
        if (!obj.valid() || H5Iget_type(obj.get()) != H5I_DATASET) return 0;
        fsdp::H5Id type(H5Dget_type(obj.get()), H5Tclose);
        fsdp::H5Id space(H5Dget_space(obj.get()), H5Sclose);
        const int rank = H5Sget_simple_extent_ndims(space.get());
        std::vector<hsize_t> dims(std::max(rank, 0));
        if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
        const int64_t numel = std::max<hssize_t>(H5Sget_simple_extent_npoints(space.get()), 0);
        const int64_t bytes = numel * static_cast<int64_t>(H5Tget_size(type.get()));
        std::string crc;
        if (H5Aexists(obj.get(), "crc32") > 0) {
          fsdp::H5Id a(H5Aopen(obj.get(), "crc32", H5P_DEFAULT), H5Aclose);
          crc = a.valid() ? attr_text(a.get()) : "(unreadable)";
        }
        w.rows.push_back({path, rank < 0 ? "(none)" : fsdp::shape_str(fsdp::Shape(dims.begin(), dims.end())),
                          dtype_name(type.get()), std::to_string(bytes), crc});
        ++w.count;
        w.bytes += bytes;
        return 0;
      },
      &walk);
  std::printf("datasets: %lld, %lld bytes\n", static_cast<long long>(walk.count), static_cast<long long>(walk.bytes));
  print_table(walk.rows, {false, false, false, true, true});
}

void print_index(const fsdp::CheckpointContents& c) {
  std::printf("index: %zu parameters in %zu units\n", c.tensors.size(), c.unit_padded_numel.size());
  std::vector<std::vector<std::string>> rows{{"name", "unit", "offset", "numel", "shape"}};
  for (const fsdp::CheckpointTensor& t : c.tensors)
    rows.push_back({t.name, std::to_string(t.unit), std::to_string(t.offset),
                    std::to_string(fsdp::shape_numel(t.shape)), fsdp::shape_str(t.shape)});
  print_table(rows, {false, true, true, true, false});
  std::printf("units: %zu\n", c.unit_padded_numel.size());
  std::vector<std::vector<std::string>> units{{"unit", "padded_numel", "parameters"}};
  for (size_t k = 0; k < c.unit_padded_numel.size(); ++k) {
    int64_t n = 0;
    for (const fsdp::CheckpointTensor& t : c.tensors) n += t.unit == static_cast<int64_t>(k);
    units.push_back({std::to_string(k), std::to_string(c.unit_padded_numel[k]), std::to_string(n)});
  }
  print_table(units, {true, true, true});
}

int inspect(const std::string& path) {
  fsdp::H5Quiet quiet;
  const fsdp::H5Id file = fsdp::ckpt::open_checkpoint_file(path, path);
  const bool ours = H5Aexists(file.get(), "format_version") > 0;
  std::unique_ptr<fsdp::CheckpointContents> contents;
  std::string error;
  if (ours) {
    try {
      contents = std::make_unique<fsdp::CheckpointContents>(fsdp::list_checkpoint(path));
    } catch (const std::exception& e) {
      error = describe(e);
    }
  }
  if (contents)
    std::printf("%s: fsdp-hpc checkpoint, %s format, step %lld\n", path.c_str(), contents->meta.format.c_str(),
                static_cast<long long>(contents->meta.step));
  else if (ours)
    std::printf("%s: damaged fsdp-hpc checkpoint\n", path.c_str());
  else
    std::printf("%s: HDF5 file, not an fsdp-hpc checkpoint (no format_version attribute)\n", path.c_str());
  print_attributes(file.get());
  print_datasets(file.get());
  if (contents && contents->meta.format == "sharded") print_index(*contents);
  std::fflush(stdout);
  if (!error.empty()) throw Error(error);
  return 0;
}

// ---- verify ----------------------------------------------------------------------------

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

// This rank's slice of a checkpoint's state: one FSDP unit per input unit (sharded) or per
// parameter (consolidated), each split over the K ranks in contiguous ranges.
struct Slice {
  fsdp::CheckpointContents contents;
  std::deque<fsdp::Param> params;  // name and shape only: the loader maps by name
  std::deque<fsdp::FlatLayout> layouts;
  std::vector<std::vector<float>> buffers;
  fsdp::ShardedState state;
};

// Rank r of k holds [n * r / k, n * (r + 1) / k) (without overflow).
int64_t split(int64_t n, int r, int k) { return n / k * r + n % k * r / k; }

// with_optimizer false: the parameters only (export-hf).
std::unique_ptr<Slice> make_slice(const std::string& in, int rank, int size, bool with_optimizer = true) {
  auto s = std::make_unique<Slice>();
  s->contents = fsdp::list_checkpoint(in);
  const fsdp::CheckpointContents& c = s->contents;
  const bool sharded = c.meta.format == "sharded";
  // Units of the input: its own (with each unit's parameters in offset order), or one per parameter.
  std::vector<std::vector<const fsdp::CheckpointTensor*>> units(sharded ? c.unit_padded_numel.size()
                                                                        : c.tensors.size());
  for (size_t i = 0; i < c.tensors.size(); ++i) units[sharded ? c.tensors[i].unit : i].push_back(&c.tensors[i]);
  for (auto& u : units)
    std::stable_sort(u.begin(), u.end(), [](const auto* a, const auto* b) { return a->offset < b->offset; });

  int64_t local = 0;
  for (size_t k = 0; k < units.size(); ++k) {
    std::vector<fsdp::Param*> ps;
    for (const fsdp::CheckpointTensor* t : units[k]) {
      s->params.push_back(fsdp::Param{t->name, t->shape, {}, nullptr, nullptr});
      ps.push_back(&s->params.back());
    }
    const fsdp::FlatLayout& layout = s->layouts.emplace_back(fsdp::make_flat_layout(ps));
    // A sharded input's unit keeps its padding when its parameters lie back to back as here.
    bool same = sharded;
    for (size_t i = 0; same && i < units[k].size(); ++i) same = units[k][i]->offset == layout.offsets[i];
    fsdp::UnitShard u;
    u.layout = &layout;
    u.padded_numel = same ? std::max(layout.numel, c.unit_padded_numel[k]) : layout.numel;
    u.held_begin = split(u.padded_numel, rank, size);
    u.held_count = split(u.padded_numel, rank + 1, size) - u.held_begin;
    u.local_offset = local;
    u.write_begin = u.held_begin;
    u.write_count = u.held_count;
    local += u.held_count;
    s->state.units.push_back(u);
  }
  if (with_optimizer) s->state.state_names = c.meta.optimizer_states;
  s->buffers.resize(1 + s->state.state_names.size());
  for (auto& b : s->buffers) {
    b.assign(std::max<int64_t>(local, 1), 0.0f);
    s->state.buffers.push_back(b.data());
  }
  return s;
}

void check_output(const std::string& in, const std::string& out, bool force) {
  std::error_code ec;
  if (fs::exists(out, ec)) {
    if (fs::equivalent(in, out, ec)) throw Error(out + " is the input file: write to another name");
    if (!force) throw Error(out + " exists (use --force to replace it)");
    if (fs::is_directory(out, ec)) throw Error(out + " is a folder");
  }
  fs::path dir = fs::path(out).parent_path();
  if (dir.empty()) dir = ".";
  if (!fs::is_directory(dir, ec)) throw Error(out + ": folder " + dir.string() + " does not exist");
  if (access(dir.c_str(), W_OK | X_OK) != 0) throw Error(out + ": folder " + dir.string() + " is not writable");
}

int convert(const Args& args, const fsdp::MpiSession& mpi) {
  const std::string& in = args.files[0];
  const std::string& out = args.files[1];
  std::unique_ptr<Slice> slice;
  std::string setup_error;
  try {
    // The input first: a missing or foreign input is the error to report, whatever OUT is.
    slice = make_slice(in, mpi.rank(), mpi.size());
    check_output(in, out, args.force);
  } catch (const std::exception& e) {
    setup_error = describe(e);
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
  save_options.format = fsdp::parse_checkpoint_format(args.format);
  fsdp::CheckpointStats load_stats, save_stats;
  try {
    // Both agree on their errors: every rank throws the same Error, none is left waiting.
    fsdp::CheckpointMeta loaded = fsdp::load_checkpoint(in, slice->state, load_options, MPI_COMM_WORLD, &load_stats);
    save_stats = fsdp::save_checkpoint(out, slice->state, loaded, save_options, MPI_COMM_WORLD);
  } catch (const Error& e) {
    if (mpi.rank() == 0) std::fprintf(stderr, "fsdp_ckpt: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp_ckpt: rank %d: %s\n", mpi.rank(), describe(e).c_str());
    std::fflush(stderr);
    if (mpi.size() > 1) mpi.abort(1);
    return 1;
  }
  if (mpi.rank() == 0) {
    const std::string units =
        args.format == "sharded" ? ", " + std::to_string(slice->state.units.size()) + " units" : std::string();
    std::printf(
        "%s (%s, %zu tensors, step %lld) -> %s (%s%s): %.1f MB read in %.2f s, written in %.2f s on %d rank%s\n",
        in.c_str(), meta.format.c_str(), slice->contents.tensors.size(), static_cast<long long>(meta.step), out.c_str(),
        args.format.c_str(), units.c_str(), load_stats.bytes / 1e6, load_stats.seconds, save_stats.seconds, mpi.size(),
        mpi.size() == 1 ? "" : "s");
  }
  return 0;
}

// ---- export-hf -------------------------------------------------------------------------

// The model a checkpoint was trained with: the model keys of its config_yaml, which holds a
// model folder's config.json keys too (config.cpp merges them in). The folder or file it
// started from need not exist any more, nor its comm.backend be built here.
fsdp::ModelConfig checkpoint_model(const fsdp::CheckpointMeta& meta, const std::string& path) {
  if (meta.config_yaml.empty()) throw Error(path + ": no config_yaml attribute: the model keys are unknown");
  return fsdp::parse_config(meta.config_yaml, path + " (config_yaml)", {"model.init_from=", "comm.backend=mpi"}).model;
}

// The output folder: made when missing; existing files are replaced only with --force.
void check_export_dir(const std::string& dir, bool force) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) throw Error(dir + " exists and is not a folder");
  for (const char* name : {"model.safetensors", "config.json"}) {
    const fs::path p = fs::path(dir) / name;
    if (fs::exists(p, ec) && !force) throw Error(p.string() + " exists (use --force to replace it)");
  }
  fs::path parent = fs::path(dir).parent_path();
  if (parent.empty()) parent = ".";
  if (!fs::is_directory(parent, ec)) throw Error(dir + ": folder " + parent.string() + " does not exist");
}

void write_text_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw Error(tmp + ": cannot create (" + std::strerror(errno) + ")");
  const bool written =
      std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0 && fsync(fileno(f)) == 0;
  if (std::fclose(f) != 0 || !written) throw Error(tmp + ": cannot write (" + std::strerror(errno) + ")");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw Error("cannot rename " + tmp + " to " + path);
}

// Every rank's outcome of a phase; false (after printing the first failure, once) when any failed.
bool all_ok(const std::string& error, const fsdp::MpiSession& mpi) {
  const fsdp::Agreement a = fsdp::agree_on_error(MPI_COMM_WORLD, error);
  if (!a.ok() && mpi.rank() == 0) std::fprintf(stderr, "fsdp_ckpt: %s\n", a.text().c_str());
  return a.ok();
}

int export_hf(const Args& args, const fsdp::MpiSession& mpi) {
  const std::string& in = args.files[0];
  const std::string& dir = args.files[1];
  const std::string out = (fs::path(dir) / "model.safetensors").string(), tmp = out + ".tmp";
  const fsdp::DType dtype = fsdp::parse_dtype(args.dtype);
  std::unique_ptr<Slice> slice;
  std::unique_ptr<fsdp::SafetensorsWriter> writer;
  std::map<std::string, size_t> spec_of;  // name -> its place in the file
  std::string config_json, error;
  try {
    slice = make_slice(in, mpi.rank(), mpi.size(), false);
    const fsdp::ModelConfig model = checkpoint_model(slice->contents.meta, in);
    config_json = fsdp::hf_config_json(model, dtype == fsdp::DType::f32    ? "float32"
                                              : dtype == fsdp::DType::bf16 ? "bfloat16"
                                                                           : "float16");
    // The file holds the model's parameters in named_parameters() order (HF's), each once: T5's
    // tied aliases are left to from_pretrained, which ties them as save_pretrained expects.
    std::map<std::string, const fsdp::CheckpointTensor*> in_ckpt;
    for (const fsdp::CheckpointTensor& t : slice->contents.tensors) in_ckpt.emplace(t.name, &t);
    std::vector<fsdp::SafetensorsWriter::Spec> specs;
    const std::unique_ptr<fsdp::Model> net = fsdp::make_model(model);  // names and shapes only
    for (const fsdp::Param* p : net->params()) {
      const auto it = in_ckpt.find(p->name);
      if (it == in_ckpt.end()) throw Error(in + ": no tensor " + p->name + ", which its config_yaml's model has");
      if (it->second->shape != p->shape)
        throw Error(in + ": " + p->name + " has shape " + fsdp::shape_str(it->second->shape) +
                    ", its config_yaml's model " + fsdp::shape_str(p->shape));
      spec_of[p->name] = specs.size();
      specs.push_back({p->name, p->shape});
      in_ckpt.erase(it);
    }
    if (!in_ckpt.empty()) throw Error(in + ": tensor " + in_ckpt.begin()->first + " is not in its config_yaml's model");
    writer = std::make_unique<fsdp::SafetensorsWriter>(std::move(specs), dtype,
                                                       std::map<std::string, std::string>{{"format", "pt"}});
    check_export_dir(dir, args.force);
    if (mpi.rank() == 0) {
      fs::create_directories(dir);
      writer->create(tmp);  // header and size; the other ranks open it after the agreement
    }
  } catch (const std::exception& e) {
    error = describe(e);
  }
  if (!all_ok(error, mpi)) return 1;

  fsdp::LoadOptions load_options;
  load_options.optimizer_state = false;
  fsdp::CheckpointStats load_stats;
  try {
    fsdp::load_checkpoint(in, slice->state, load_options, MPI_COMM_WORLD, &load_stats);
  } catch (const Error& e) {  // agreed inside: the same on every rank
    if (mpi.rank() == 0) std::fprintf(stderr, "fsdp_ckpt: %s\n", e.what());
    if (mpi.rank() == 0) (void)std::remove(tmp.c_str());  // best effort: the error above is what matters
    return 1;
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    if (mpi.rank() != 0) writer->open(tmp);
    for (const fsdp::UnitShard& u : slice->state.units) {
      const int64_t h_begin = u.held_begin, h_end = u.held_begin + u.held_count;
      for (size_t i = 0; i < u.layout->params.size(); ++i) {
        const int64_t p_begin = u.layout->offsets[i], p_end = p_begin + u.layout->params[i]->numel();
        const int64_t lo = std::max(p_begin, h_begin), hi = std::min(p_end, h_end);
        if (lo < hi)
          writer->write_f32(spec_of.at(u.layout->params[i]->name), lo - p_begin, hi - lo,
                            slice->state.buffers[0] + u.local_offset + (lo - h_begin));
      }
    }
    writer->close();
    error.clear();
  } catch (const std::exception& e) {
    error = describe(e);
  }
  if (!all_ok(error, mpi)) {
    if (mpi.rank() == 0) (void)std::remove(tmp.c_str());  // best effort, as above
    return 1;
  }
  if (mpi.rank() == 0) {
    try {
      if (std::rename(tmp.c_str(), out.c_str()) != 0) throw Error("cannot rename " + tmp + " to " + out);
      write_text_file((fs::path(dir) / "config.json").string(), config_json);
      const fsdp::SafetensorsReader check(dir);  // the header as any reader sees it
      std::printf(
          "%s (%s, step %lld) -> %s: %zu tensors, %s, %.1f MB; read in %.2f s, written in %.2f s on %d rank%s\n",
          in.c_str(), slice->contents.meta.format.c_str(), static_cast<long long>(slice->contents.meta.step),
          dir.c_str(), check.tensors().size(), args.dtype.c_str(), static_cast<double>(writer->file_bytes()) / 1e6,
          load_stats.seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), mpi.size(),
          mpi.size() == 1 ? "" : "s");
      error.clear();
    } catch (const std::exception& e) {
      error = describe(e);
    }
  }
  return all_ok(error, mpi) ? 0 : 1;
}
}  // namespace

int main(int argc, char** argv) {
  fsdp::MpiSession mpi(&argc, &argv);
  Args args;
  try {
    args = parse_args(argc, argv);
  } catch (const std::exception& e) {
    if (mpi.rank() == 0) std::fprintf(stderr, "fsdp_ckpt: %s\n", describe(e).c_str());
    return 2;
  }
  if (args.help) {
    if (mpi.rank() == 0) std::fputs(kUsage, stdout);
    return 0;
  }
  if (args.command == "consolidate" || args.command == "reshard") return convert(args, mpi);
  if (args.command == "export-hf") return export_hf(args, mpi);

  // inspect and verify: one process reads, the others wait for its exit status.
  int rc = 0;
  if (mpi.rank() == 0) {
    try {
      rc = args.command == "inspect" ? inspect(args.files[0]) : verify(args.files[0]);
    } catch (const std::exception& e) {
      std::fflush(stdout);
      std::fprintf(stderr, "fsdp_ckpt: %s\n", describe(e).c_str());
      rc = 1;
    }
    std::fflush(stdout);
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return rc;
}
