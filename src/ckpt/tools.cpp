// fsdp_ckpt's commands (tools.h): inspect's listing, the slices conversions and export-hf work
// on, and export-hf's phases.
#include "ckpt/tools.h"

#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "ckpt/h5.h"
#include "ckpt/internal.h"
#include "config/config.h"
#include "config/hf_config.h"
#include "models/model.h"
#include "tensor/error.h"

namespace fsdp {

namespace {

namespace fs = std::filesystem;

// ---- inspect ---------------------------------------------------------------------------

std::string number(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string h5_type_name(hid_t type) {
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
  H5Id type(H5Aget_type(attr), H5Tclose);
  H5Id space(H5Aget_space(attr), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  const bool scalar = H5Sget_simple_extent_type(space.get()) == H5S_SCALAR;
  if (n < 0 || n > (1 << 20)) return "(" + h5_type_name(type.get()) + " attribute, " + std::to_string(n) + " elements)";
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
    H5Id mem(H5Tcopy(H5T_C_S1), H5Tclose);
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
    H5Id mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.get(), width);
    std::vector<char> buf(static_cast<size_t>(n) * width + 1, '\0');
    ok = n == 0 || H5Aread(attr, mem.get(), buf.data()) >= 0;
    for (hssize_t i = 0; i < n; ++i) items.emplace_back(buf.data() + i * width, strnlen(buf.data() + i * width, width));
  } else {
    return "(" + h5_type_name(type.get()) + " attribute)";
  }
  if (!ok) return "(unreadable " + h5_type_name(type.get()) + " attribute)";
  if (scalar && items.size() == 1) return items[0];
  std::string s = "[";
  for (size_t i = 0; i < items.size() && i < 64; ++i) s += (i ? ", " : "") + items[i];
  if (items.size() > 64) s += ", ... (" + std::to_string(items.size()) + " values)";
  return s + "]";
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
    std::vector<std::string> names = ckpt::meta_attribute_names();
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
    H5Id a(H5Aopen(root, name.c_str(), H5P_DEFAULT), H5Aclose);
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
        H5Id obj(H5Oopen(r, name, H5P_DEFAULT), H5Oclose);
        if (!obj.valid() || H5Iget_type(obj.get()) != H5I_DATASET) return 0;
        H5Id type(H5Dget_type(obj.get()), H5Tclose);
        H5Id space(H5Dget_space(obj.get()), H5Sclose);
        const int rank = H5Sget_simple_extent_ndims(space.get());
        std::vector<hsize_t> dims(std::max(rank, 0));
        if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
        const int64_t numel = std::max<hssize_t>(H5Sget_simple_extent_npoints(space.get()), 0);
        const int64_t bytes = numel * static_cast<int64_t>(H5Tget_size(type.get()));
        std::string crc;
        if (H5Aexists(obj.get(), "crc32") > 0) {
          H5Id a(H5Aopen(obj.get(), "crc32", H5P_DEFAULT), H5Aclose);
          crc = a.valid() ? attr_text(a.get()) : "(unreadable)";
        }
        w.rows.push_back({path, rank < 0 ? "(none)" : shape_str(Shape(dims.begin(), dims.end())),
                          h5_type_name(type.get()), std::to_string(bytes), crc});
        ++w.count;
        w.bytes += bytes;
        return 0;
      },
      &walk);
  std::printf("datasets: %lld, %lld bytes\n", static_cast<long long>(walk.count), static_cast<long long>(walk.bytes));
  print_table(walk.rows, {false, false, false, true, true});
}

void print_index(const CheckpointContents& c) {
  std::printf("index: %zu parameters in %zu units\n", c.tensors.size(), c.unit_padded_numel.size());
  std::vector<std::vector<std::string>> rows{{"name", "unit", "offset", "numel", "shape"}};
  for (const CheckpointTensor& t : c.tensors)
    rows.push_back({t.name, std::to_string(t.unit), std::to_string(t.offset), std::to_string(shape_numel(t.shape)),
                    shape_str(t.shape)});
  print_table(rows, {false, true, true, true, false});
  std::printf("units: %zu\n", c.unit_padded_numel.size());
  std::vector<std::vector<std::string>> units{{"unit", "padded_numel", "parameters"}};
  for (size_t k = 0; k < c.unit_padded_numel.size(); ++k) {
    int64_t n = 0;
    for (const CheckpointTensor& t : c.tensors) n += t.unit == static_cast<int64_t>(k);
    units.push_back({std::to_string(k), std::to_string(c.unit_padded_numel[k]), std::to_string(n)});
  }
  print_table(units, {true, true, true});
}

void print_checkpoint_impl(const std::string& path) {
  H5Quiet quiet;
  const H5Id file = ckpt::open_checkpoint_file(path, path);
  const bool ours = H5Aexists(file.get(), "format_version") > 0;
  std::unique_ptr<CheckpointContents> contents;
  std::string error;
  if (ours) {
    try {
      contents = std::make_unique<CheckpointContents>(list_checkpoint(path));
    } catch (const std::exception& e) {
      error = describe(e);
    }
  }
  if (contents)
    std::printf("%s: fsdp-hpc checkpoint, %s format, step %lld\n", path.c_str(),
                name_of(kCheckpointFormats, contents->meta.format).data(), static_cast<long long>(contents->meta.step));
  else if (ours)
    std::printf("%s: damaged fsdp-hpc checkpoint\n", path.c_str());
  else
    std::printf("%s: HDF5 file, not an fsdp-hpc checkpoint (no format_version attribute)\n", path.c_str());
  print_attributes(file.get());
  print_datasets(file.get());
  if (contents && contents->meta.format == CheckpointFormat::sharded) print_index(*contents);
  std::fflush(stdout);
  if (!error.empty()) throw Error(error);
}

// Rank r of k holds [n * r / k, n * (r + 1) / k) (without overflow).
int64_t split(int64_t n, int r, int k) { return n / k * r + n % k * r / k; }

// ---- export-hf -------------------------------------------------------------------------

// The model a checkpoint was trained with: the model keys of its config_yaml, which holds a
// model folder's config.json keys too (config.cpp merges them in). The folder or file it
// started from need not exist any more, nor its comm.backend be built here.
ModelConfig checkpoint_model(const CheckpointMeta& meta, const std::string& path) {
  if (meta.config_yaml.empty()) throw Error(path + ": no config_yaml attribute: the model keys are unknown");
  return parse_config(meta.config_yaml, path + " (config_yaml)", {"model.init_from=", "comm.backend=mpi"}).model;
}

// The output folder: made when missing; existing files are replaced only with --force.
void check_export_dir(const std::string& dir, bool force) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) throw Error(dir + " exists and is not a folder");
  for (const char* name : {"model.safetensors", "model.safetensors.index.json", "config.json"}) {
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

}  // namespace

void print_checkpoint(const std::string& path) { print_checkpoint_impl(path); }

// ---- consolidate / reshard -------------------------------------------------------------

std::unique_ptr<CheckpointSlice> slice_checkpoint(const std::string& in, int rank, int size, bool with_optimizer) {
  auto s = std::make_unique<CheckpointSlice>();
  s->contents = list_checkpoint(in);
  const CheckpointContents& c = s->contents;
  const bool sharded = c.meta.format == CheckpointFormat::sharded;
  // Units of the input: its own (with each unit's parameters in offset order), or one per parameter.
  std::vector<std::vector<const CheckpointTensor*>> units(sharded ? c.unit_padded_numel.size() : c.tensors.size());
  for (size_t i = 0; i < c.tensors.size(); ++i) units[sharded ? c.tensors[i].unit : i].push_back(&c.tensors[i]);
  for (auto& u : units)
    std::stable_sort(u.begin(), u.end(), [](const auto* a, const auto* b) { return a->offset < b->offset; });

  int64_t local = 0;
  for (size_t k = 0; k < units.size(); ++k) {
    std::vector<Param*> ps;
    for (const CheckpointTensor* t : units[k]) {
      s->params.push_back(Param{t->name, t->shape, {}, nullptr, nullptr});
      ps.push_back(&s->params.back());
    }
    const FlatLayout& layout = s->layouts.emplace_back(make_flat_layout(ps));
    // A sharded input's unit keeps its padding when its parameters lie back to back as here.
    bool same = sharded;
    for (size_t i = 0; same && i < units[k].size(); ++i) same = units[k][i]->offset == layout.offsets[i];
    UnitShard u;
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

void check_convert_output(const std::string& in, const std::string& out, bool force) {
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

// ---- export-hf -------------------------------------------------------------------------

uint64_t parse_shard_size(const std::string& text) {
  // transformers' convert_file_size_to_int: a decimal unit is 10^3k bytes, a binary one 2^10k.
  static const std::pair<const char*, uint64_t> kUnits[] = {{"GIB", uint64_t{1} << 30},
                                                            {"MIB", uint64_t{1} << 20},
                                                            {"KIB", uint64_t{1} << 10},
                                                            {"GB", 1'000'000'000},
                                                            {"MB", 1'000'000},
                                                            {"KB", 1'000},
                                                            {"B", 1}};
  std::string upper;
  for (const char c : text) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  uint64_t unit = 1;
  std::string digits = upper;
  for (const auto& [suffix, bytes] : kUnits)
    if (upper.size() > std::strlen(suffix) && upper.ends_with(suffix)) {
      unit = bytes;
      digits = upper.substr(0, upper.size() - std::strlen(suffix));
      break;
    }
  const bool number = !digits.empty() && std::all_of(digits.begin(), digits.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c)) != 0;
  });
  if (!number || digits.size() > 12 || std::stoull(digits) == 0)
    throw Error("--max-shard-size '" + text + "': not a size such as 5GB, 500MB, 2GiB or a positive byte count");
  return std::stoull(digits) * unit;
}

HfExport::HfExport(const std::string& in, const std::string& dir, const HfExportOptions& options, int rank, int size,
                   const ModelMaker& make_model)
    : in_(in), dir_(dir), slice_(slice_checkpoint(in, rank, size, false)) {
  const DType dtype = options.dtype;
  const ModelConfig model = checkpoint_model(slice_->contents.meta, in);
  config_json_ = hf_config_json(model, dtype == DType::f32 ? "float32" : dtype == DType::bf16 ? "bfloat16" : "float16");
  // The files hold the model's parameters in named_parameters() order (HF's), each once: T5's
  // tied aliases are left to from_pretrained, which ties them as save_pretrained expects.
  std::map<std::string, const CheckpointTensor*> in_ckpt;
  for (const CheckpointTensor& t : slice_->contents.tensors) in_ckpt.emplace(t.name, &t);
  std::vector<std::vector<SafetensorsWriter::Spec>> shards(1);
  uint64_t shard_bytes = 0, total_bytes = 0;
  const std::unique_ptr<Model> net = make_model(model);  // names and shapes only
  for (const Param* p : net->params()) {
    const auto it = in_ckpt.find(p->name);
    if (it == in_ckpt.end()) throw Error(in + ": no tensor " + p->name + ", which its config_yaml's model has");
    if (it->second->shape != p->shape)
      throw Error(in + ": " + p->name + " has shape " + shape_str(it->second->shape) + ", its config_yaml's model " +
                  shape_str(p->shape));
    // save_pretrained's rule: a tensor that would take a non-empty shard past the limit starts
    // the next one (a tensor larger than the limit has a shard of its own).
    const uint64_t bytes = static_cast<uint64_t>(p->numel()) * dtype_bytes(dtype);
    if (shard_bytes + bytes > options.max_shard_bytes && !shards.back().empty()) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    place_of_[p->name] = {shards.size() - 1, shards.back().size()};
    shards.back().push_back({p->name, p->shape});
    shard_bytes += bytes;
    total_bytes += bytes;
    in_ckpt.erase(it);
  }
  if (!in_ckpt.empty()) throw Error(in + ": tensor " + in_ckpt.begin()->first + " is not in its config_yaml's model");
  nlohmann::ordered_json index;  // model.safetensors.index.json, as save_pretrained writes it
  index["metadata"] = {{"total_size", total_bytes}};
  index["weight_map"] = nlohmann::ordered_json::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    char name[64];
    if (shards.size() == 1)
      std::snprintf(name, sizeof name, "model.safetensors");
    else
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
    for (const SafetensorsWriter::Spec& spec : shards[k]) index["weight_map"][spec.name] = name;
    File f;
    f.path = (fs::path(dir) / name).string();
    f.tmp = f.path + ".tmp";
    f.writer = std::make_unique<SafetensorsWriter>(std::move(shards[k]), dtype,
                                                   std::map<std::string, std::string>{{"format", "pt"}});
    files_.push_back(std::move(f));
  }
  if (files_.size() > 1) index_json_ = index.dump(2) + "\n";
  check_export_dir(dir, options.force);
}

uint64_t HfExport::file_bytes() const {
  uint64_t bytes = 0;
  for (const File& f : files_) bytes += f.writer->file_bytes();
  return bytes;
}

void HfExport::create_file() {
  fs::create_directories(dir_);
  for (File& f : files_) f.writer->create(f.tmp);  // header and size; the other ranks open them after the agreement
}

CheckpointStats HfExport::load(MPI_Comm comm) {
  LoadOptions options;
  options.optimizer_state = false;
  CheckpointStats stats;
  load_checkpoint(in_, slice_->state, options, comm, &stats);
  return stats;
}

void HfExport::write_slice(bool created_here) {
  if (!created_here)
    for (File& f : files_) f.writer->open(f.tmp);
  for (const UnitShard& u : slice_->state.units) {
    const int64_t h_begin = u.held_begin, h_end = u.held_begin + u.held_count;
    for (size_t i = 0; i < u.layout->params.size(); ++i) {
      const int64_t p_begin = u.layout->offsets[i], p_end = p_begin + u.layout->params[i]->numel();
      const int64_t lo = std::max(p_begin, h_begin), hi = std::min(p_end, h_end);
      if (lo >= hi) continue;
      const Place& at = place_of_.at(u.layout->params[i]->name);
      files_[at.file].writer->write_f32(at.index, lo - p_begin, hi - lo,
                                        slice_->state.buffers[0] + u.local_offset + (lo - h_begin));
    }
  }
  for (File& f : files_) f.writer->close();
}

void HfExport::finish() {
  for (const File& f : files_)
    if (std::rename(f.tmp.c_str(), f.path.c_str()) != 0) throw Error("cannot rename " + f.tmp + " to " + f.path);
  // A folder replaced with --force may hold the other form (from_pretrained prefers
  // model.safetensors to an index) or shards of another count: what is not ours goes, as
  // save_pretrained cleans the folder of a previous save.
  std::error_code ec;
  std::set<std::string> ours;
  for (const File& f : files_) ours.insert(fs::path(f.path).filename().string());
  for (const fs::directory_entry& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    const bool shard = name.size() == 32 && name.starts_with("model-") && name.ends_with(".safetensors") &&
                       name.substr(11, 4) == "-of-";
    if (shard && !ours.contains(name)) fs::remove(e.path(), ec);
  }
  if (index_json_.empty()) {
    fs::remove(fs::path(dir_) / "model.safetensors.index.json", ec);
  } else {
    fs::remove(fs::path(dir_) / "model.safetensors", ec);
    write_text_file((fs::path(dir_) / "model.safetensors.index.json").string(), index_json_);
  }
  write_text_file((fs::path(dir_) / "config.json").string(), config_json_);
}

void HfExport::remove_partial() const {
  for (const File& f : files_) (void)std::remove(f.tmp.c_str());  // best effort
}

}  // namespace fsdp
