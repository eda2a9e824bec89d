// Checkpoint building blocks and a one-process save/load: flat-range selections, CRC pieces,
// round trips across unit layouts and formats, damaged files, checkpoint folders. The
// multi-rank behaviour (resume, resharding, kills) is tested through fsdp_app in tests/ckpt/.
#define BOOST_TEST_MODULE ckpt
#include <zlib.h>

#include <unistd.h>
#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>

#include "ckpt/checkpoint.h"
#include "ckpt/h5.h"
#include "ckpt/internal.h"
#include "tensor/error.h"

namespace fs = std::filesystem;
using namespace fsdp;
using namespace fsdp::ckpt;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path =
        fs::temp_directory_path() / ("fsdp_ckpt_test_" + std::to_string(getpid()) + "_" + std::to_string(counter()++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  static int& counter() {
    static int n = 0;
    return n;
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// An in-memory HDF5 dataset of `dims` holding 0, 1, 2, ... in row-major order.
struct IotaDataset {
  H5Id file, ds;
  explicit IotaDataset(const std::vector<hsize_t>& dims) {
    H5Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    H5Pset_fapl_core(fapl.get(), 1 << 16, 0);
    file = H5Id(H5Fcreate("iota", H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
    H5Id space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
    ds = H5Id(H5Dcreate2(file.get(), "d", H5T_NATIVE_FLOAT, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
              H5Dclose);
    hssize_t n = H5Sget_simple_extent_npoints(space.get());
    std::vector<float> v(n);
    std::iota(v.begin(), v.end(), 0.0f);
    H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  }
};

// A toy model state: params with shapes, grouped into units, held whole by this one process.
struct ToyState {
  std::vector<Param> params;
  std::vector<FlatLayout> layouts;
  std::vector<std::vector<float>> buffers;  // params + states, concatenated padded units
  ShardedState st;

  // groups: indices of params per unit; pad: padded size multiple.
  ToyState(const std::vector<std::pair<std::string, Shape>>& specs, const std::vector<std::vector<int>>& groups,
           int64_t pad, const std::vector<std::string>& states) {
    for (const auto& [name, shape] : specs) params.push_back(Param{name, shape, {}, nullptr, nullptr});
    layouts.reserve(groups.size());
    int64_t total = 0;
    for (const auto& g : groups) {
      std::vector<Param*> ps;
      for (int i : g) ps.push_back(&params[i]);
      layouts.push_back(make_flat_layout(ps));
      UnitShard u;
      u.layout = &layouts.back();
      u.padded_numel = (layouts.back().numel + pad - 1) / pad * pad;
      u.held_begin = u.write_begin = 0;
      u.held_count = u.write_count = u.padded_numel;
      u.local_offset = total;
      total += u.padded_numel;
      st.units.push_back(u);
    }
    st.state_names = states;
    buffers.assign(1 + states.size(), std::vector<float>(total, -7.0f));  // -7: "never written"
    for (auto& b : buffers) st.buffers.push_back(b.data());
  }
  // Element e of parameter `name`, state s, wherever this layout keeps it.
  float& at(const std::string& name, int s, int64_t e) {
    for (const UnitShard& u : st.units)
      for (size_t i = 0; i < u.layout->params.size(); ++i)
        if (u.layout->params[i]->name == name) return buffers[s][u.local_offset + u.layout->offsets[i] + e];
    throw Error("no param " + name);
  }
  void fill() {  // a value that names (param, state, element), padding zero
    for (auto& b : buffers) std::fill(b.begin(), b.end(), 0.0f);
    for (size_t p = 0; p < params.size(); ++p)
      for (size_t s = 0; s < buffers.size(); ++s)
        for (int64_t e = 0; e < params[p].numel(); ++e)
          at(params[p].name, static_cast<int>(s), e) = 1000.0f * p + 100.0f * s + e;
  }
};

const std::vector<std::pair<std::string, Shape>> kSpecs = {
    {"a.weight", {3, 5}}, {"a.bias", {7}}, {"b.weight", {4, 2, 3}}, {"c", {2, 1, 3, 2}}};

CheckpointMeta some_meta() {
  CheckpointMeta m;
  m.step = 17;
  m.epoch = 1;
  m.step_in_epoch = 5;
  m.steps_per_epoch = 12;
  m.world_size = 4;
  m.shard_group_size = 2;
  m.global_batch_size = 64;
  m.seed = 3;
  m.strategy = fsdp::Strategy::hybrid_shard;
  m.backend = "mpi";
  m.wrap_policy = fsdp::WrapPolicy::size_based;
  m.model_kind = "mnist_cnn";
  m.optimizer = fsdp::OptimizerKind::adamw;
  m.optimizer_step = 17;
  m.scheduler = fsdp::SchedulerKind::cosine;
  m.lr = 2.5e-4;
  m.loss_scale = 1024.0;
  m.loss_scale_good_steps = 9;
  m.best_eval_loss = 0.25;
  m.config_yaml = "model: {kind: mnist_cnn}\n";
  return m;
}

}  // namespace

namespace {
SaveOptions with_format(CheckpointFormat format) {
  SaveOptions o;
  o.format = format;
  return o;
}
}  // namespace

BOOST_AUTO_TEST_CASE(flat_ranges_select_exactly_those_elements_in_order) {
  H5Quiet quiet;
  for (const std::vector<hsize_t>& dims : std::vector<std::vector<hsize_t>>{{7}, {3, 4}, {2, 3, 4}, {2, 1, 3, 5}}) {
    IotaDataset d(dims);
    H5Id space(H5Dget_space(d.ds.get()), H5Sclose);
    const int64_t n = H5Sget_simple_extent_npoints(space.get());
    for (int64_t offset = 0; offset < n; ++offset)
      for (int64_t count = 1; offset + count <= n; ++count) {
        select_flat_range(space.get(), dims, offset, count);
        BOOST_REQUIRE_EQUAL(H5Sget_select_npoints(space.get()), count);
        hsize_t m = static_cast<hsize_t>(count);
        H5Id mem(H5Screate_simple(1, &m, nullptr), H5Sclose);
        std::vector<float> out(count, -1.0f);
        BOOST_REQUIRE(H5Dread(d.ds.get(), H5T_NATIVE_FLOAT, mem.get(), space.get(), H5P_DEFAULT, out.data()) >= 0);
        for (int64_t i = 0; i < count; ++i)
          BOOST_REQUIRE_MESSAGE(out[i] == static_cast<float>(offset + i), "dims rank " << dims.size() << " offset "
                                                                                       << offset << " count " << count
                                                                                       << " element " << i);
      }
  }
}

BOOST_AUTO_TEST_CASE(crc_of_floats_is_zlib_crc_of_their_bytes) {
  std::vector<float> v(3 * (1 << 20) + 12345);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 977) * 0.5f;
  uint32_t expect = static_cast<uint32_t>(crc32_z(0, reinterpret_cast<const Bytef*>(v.data()), v.size() * 4));
  BOOST_TEST(crc32_floats(v.data(), static_cast<int64_t>(v.size())) == expect);
  BOOST_TEST(crc32_floats(v.data(), 10) ==
             static_cast<uint32_t>(crc32_z(0, reinterpret_cast<const Bytef*>(v.data()), 40)));
}

BOOST_AUTO_TEST_CASE(crc_pieces_combine_in_any_order_with_replicas) {
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 1.25f;
  auto piece = [&](int64_t off, int64_t n) { return PieceCrc{0, 0, off, off, n, crc32_floats(v.data() + off, n)}; };
  const uint32_t whole = crc32_floats(v.data(), 1000);
  uint32_t c = 0;
  BOOST_TEST(combine_crc({piece(600, 400), piece(0, 250), piece(250, 350), piece(0, 250)}, true, 1000, &c));
  BOOST_TEST(c == whole);
  BOOST_TEST(combine_crc({piece(0, 1000)}, false, 1000, &c));
  BOOST_TEST(c == whole);
  BOOST_TEST(!combine_crc({piece(0, 250), piece(300, 700)}, true, 1000, &c));  // a gap
  BOOST_TEST(!combine_crc({piece(0, 300), piece(250, 750)}, true, 1000, &c));  // an overlap
  BOOST_TEST(!combine_crc({piece(0, 500)}, true, 1000, &c));                   // short
  PieceCrc liar = piece(0, 500);
  liar.crc ^= 1;
  BOOST_TEST(!combine_crc({piece(0, 500), liar, piece(500, 500)}, true, 1000, &c));  // replicas disagree
}

BOOST_AUTO_TEST_CASE(root_attributes_round_trip) {
  TempDir dir;
  ToyState a(kSpecs, {{0, 1}, {2, 3}}, 4, {"exp_avg", "exp_avg_sq"});
  a.fill();
  CheckpointMeta m = some_meta();
  save_checkpoint(dir.file("c.h5"), a.st, m, {}, MPI_COMM_NULL);
  CheckpointMeta r = read_checkpoint_meta(dir.file("c.h5"));
  BOOST_TEST((r.format == CheckpointFormat::consolidated));
  BOOST_TEST(r.format_version == kCheckpointFormatVersion);
  BOOST_TEST(r.step == 17);
  BOOST_TEST(r.epoch == 1);
  BOOST_TEST(r.step_in_epoch == 5);
  BOOST_TEST(r.steps_per_epoch == 12);
  BOOST_TEST(r.world_size == 4);
  BOOST_TEST(r.shard_group_size == 2);
  BOOST_TEST(r.global_batch_size == 64);
  BOOST_TEST(r.seed == 3);
  BOOST_TEST((r.strategy == Strategy::hybrid_shard));
  BOOST_TEST(r.backend == "mpi");
  BOOST_TEST((r.wrap_policy == WrapPolicy::size_based));
  BOOST_TEST(r.model_kind == "mnist_cnn");
  BOOST_TEST((r.optimizer == OptimizerKind::adamw));
  BOOST_TEST((r.optimizer_states == std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  BOOST_TEST((r.scheduler == SchedulerKind::cosine));
  BOOST_TEST(r.lr == 2.5e-4);
  BOOST_TEST(r.loss_scale == 1024.0);
  BOOST_TEST(r.loss_scale_good_steps == 9);
  BOOST_TEST(r.best_eval_loss == 0.25);
  BOOST_TEST(r.config_yaml == m.config_yaml);
  BOOST_TEST(!fs::exists(dir.file("c.h5.tmp")));
}

BOOST_AUTO_TEST_CASE(both_formats_load_into_another_unit_layout_exactly) {
  for (CheckpointFormat format : {CheckpointFormat::consolidated, CheckpointFormat::sharded}) {
    TempDir dir;
    ToyState a(kSpecs, {{0, 1}, {2}, {3}}, 4, {"exp_avg", "exp_avg_sq"});
    a.fill();
    save_checkpoint(dir.file("c.h5"), a.st, some_meta(), with_format(format), MPI_COMM_NULL);
    // Other units, other order of units, other padding.
    ToyState b(kSpecs, {{3, 2}, {}, {0}, {1}}, 5, {"exp_avg", "exp_avg_sq"});
    CheckpointMeta m = load_checkpoint(dir.file("c.h5"), b.st, {true, OptimizerKind::adamw}, MPI_COMM_NULL);
    BOOST_TEST((m.format == format));
    for (const Param& p : a.params)
      for (int s = 0; s < 3; ++s)
        for (int64_t e = 0; e < p.numel(); ++e) BOOST_REQUIRE_EQUAL(b.at(p.name, s, e), a.at(p.name, s, e));
    // Padding comes back zero in the new layout.
    for (const UnitShard& u : b.st.units)
      for (int64_t e = u.layout->numel; e < u.padded_numel; ++e)
        BOOST_REQUIRE_EQUAL(b.buffers[0][u.local_offset + e], 0.0f);
    // Parameters only: the optimizer buffers are left alone.
    ToyState c(kSpecs, {{0, 1, 2, 3}}, 1, {"exp_avg", "exp_avg_sq"});
    load_checkpoint(dir.file("c.h5"), c.st, {false, std::nullopt}, MPI_COMM_NULL);
    BOOST_TEST(c.at("b.weight", 0, 3) == a.at("b.weight", 0, 3));
    BOOST_TEST(c.at("b.weight", 1, 3) == -7.0f);
  }
}

BOOST_AUTO_TEST_CASE(every_dataset_carries_the_crc_of_its_bytes) {
  TempDir dir;
  ToyState a(kSpecs, {{0, 1}, {2, 3}}, 4, {"momentum_buffer"});
  a.fill();
  save_checkpoint(dir.file("c.h5"), a.st, some_meta(), {}, MPI_COMM_NULL);
  H5Quiet quiet;
  H5Id f(H5Fopen(dir.file("c.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  for (const auto& [name, shape] : kSpecs)
    for (const std::string& path : {"/model/" + name, "/optim/" + name + "/momentum_buffer"}) {
      H5Id ds(H5Dopen2(f.get(), path.c_str(), H5P_DEFAULT), H5Dclose);
      std::vector<float> v(shape_numel(shape));
      H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
      BOOST_TEST(read_int_attr(ds.get(), "crc32", path) == static_cast<int64_t>(crc32_floats(v.data(), v.size())));
    }
}

BOOST_AUTO_TEST_CASE(damaged_or_mismatched_files_are_refused_with_one_line) {
  TempDir dir;
  ToyState a(kSpecs, {{0, 1, 2, 3}}, 4, {"exp_avg", "exp_avg_sq"});
  a.fill();
  const std::string good = dir.file("c.h5");
  save_checkpoint(good, a.st, some_meta(), {}, MPI_COMM_NULL);
  auto load_into = [&](const std::string& path, std::vector<std::pair<std::string, Shape>> specs,
                       std::optional<OptimizerKind> opt = OptimizerKind::adamw,
                       std::vector<std::string> states = {"exp_avg", "exp_avg_sq"}) {
    std::vector<int> all(specs.size());
    std::iota(all.begin(), all.end(), 0);
    ToyState b(specs, {all}, 1, states);
    return error_of([&] { load_checkpoint(path, b.st, {true, opt}, MPI_COMM_NULL); });
  };
  BOOST_TEST(load_into(good, kSpecs) == "");
  BOOST_TEST(load_into(dir.file("none.h5"), kSpecs).find("cannot read the file") != std::string::npos);
  // Flip one byte of a.bias's data: found by the CRC check.
  {
    H5Id f(H5Fopen(good.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    H5Id ds(H5Dopen2(f.get(), "/model/a.bias", H5P_DEFAULT), H5Dclose);
    haddr_t at = H5Dget_offset(ds.get());
    ds.reset();
    f.reset();
    fs::copy_file(good, dir.file("flip.h5"));
    std::fstream io(dir.file("flip.h5"), std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(at + 9));
    char byte = 0;
    io.read(&byte, 1);
    byte ^= 0x10;
    io.seekp(static_cast<std::streamoff>(at + 9));
    io.write(&byte, 1);
  }
  BOOST_TEST(load_into(dir.file("flip.h5"), kSpecs).find("a.bias fails its crc32 check") != std::string::npos);
  auto specs = kSpecs;
  specs[2].second = {4, 6};
  BOOST_TEST(load_into(good, specs).find("/model/b.weight has shape [4, 2, 3], the model expects [4, 6]") !=
             std::string::npos);
  specs = kSpecs;
  specs.pop_back();
  BOOST_TEST(load_into(good, specs).find("unexpected tensor /model/c") != std::string::npos);
  specs = kSpecs;
  specs.push_back({"d", {2}});
  BOOST_TEST(load_into(good, specs).find("missing tensor /model/d") != std::string::npos);
  BOOST_TEST(load_into(good, kSpecs, OptimizerKind::sgd, {"momentum_buffer"})
                 .find("written with optimizer adamw, this run uses sgd") != std::string::npos);
  BOOST_TEST(
      load_into(good, kSpecs, std::nullopt, {"momentum_buffer"}).find("has no optimizer state 'momentum_buffer'") !=
      std::string::npos);
  // Truncated: HDF5 cannot even open it.
  fs::copy_file(good, dir.file("half.h5"));
  fs::resize_file(dir.file("half.h5"), fs::file_size(good) / 2);
  BOOST_TEST(load_into(dir.file("half.h5"), kSpecs) != "");
  std::ofstream(dir.file("text.h5")) << "model: {kind: mnist_cnn}\n";
  BOOST_TEST(load_into(dir.file("text.h5"), kSpecs).find("not an HDF5 file") != std::string::npos);
  // A root attribute naming no strategy (the attributes are names, typed on read).
  fs::copy_file(good, dir.file("strategy.h5"));
  {
    H5Id f(H5Fopen(dir.file("strategy.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    BOOST_REQUIRE(H5Adelete(f.get(), "strategy") >= 0);
    write_attr(f.get(), "strategy", std::string("FULLSHARD"));
  }
  BOOST_TEST(error_of([&] { read_checkpoint_meta(dir.file("strategy.h5")); })
                 .find("attribute strategy is 'FULLSHARD', not FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or "
                       "HYBRID_SHARD_ZERO2") != std::string::npos);
}

// model.init_from of a PyTorch state_dict that holds a tied weight under two names (T5's
// shared.weight and encoder.embed_tokens.weight, Llama's embedding and lm_head.weight): read under
// the first name present, the other compared; a copy that differs, or a name no alias covers, is
// one line.
BOOST_AUTO_TEST_CASE(init_from_reads_tied_aliases_and_refuses_a_differing_copy) {
  TempDir dir;
  std::vector<float> emb = {1, 2, 3, 4, 5, 6}, other = emb, bias = {7, 8};
  other[4] = -5;
  auto param = [](const std::string& name, Shape shape, float* data) {
    Param p;
    p.name = name;
    p.shape = std::move(shape);
    p.data = data;
    return p;
  };
  auto write = [&](const std::string& path, const std::vector<std::pair<std::string, float*>>& tensors) {
    WeightWriter w(path);
    std::vector<Param> params;
    for (const auto& [name, data] : tensors) params.push_back(param(name, name == "b" ? Shape{2} : Shape{2, 3}, data));
    std::vector<Param*> ptrs;
    for (Param& p : params) ptrs.push_back(&p);
    w.write(ptrs);
    w.commit();
  };
  HfNames names;
  names.aliases["shared.weight"] = {"encoder.embed_tokens.weight", "lm_head.weight"};
  std::vector<float> got_emb(6, 0.0f), got_bias(2, 0.0f);
  Param shared = param("shared.weight", {2, 3}, got_emb.data()), b = param("b", {2}, got_bias.data());
  const std::vector<Param*> model = {&shared, &b};

  const std::string all = (dir.path / "all.h5").string();  // every name, equal values
  write(all, {{"shared.weight", emb.data()},
              {"encoder.embed_tokens.weight", emb.data()},
              {"lm_head.weight", emb.data()},
              {"b", bias.data()}});
  WeightFile full(all, names);
  full.check(model);
  full.read(model);
  BOOST_TEST(got_emb == emb);
  BOOST_TEST(got_bias == bias);

  const std::string alias_only = (dir.path / "alias_only.h5").string();  // the first alias stands in
  std::fill(got_emb.begin(), got_emb.end(), 0.0f);
  write(alias_only, {{"lm_head.weight", emb.data()}, {"b", bias.data()}});
  WeightFile aliased(alias_only, names);
  aliased.check(model);
  aliased.read(model);
  BOOST_TEST(got_emb == emb);

  const std::string differs = (dir.path / "differs.h5").string();
  write(differs, {{"shared.weight", emb.data()}, {"lm_head.weight", other.data()}, {"b", bias.data()}});
  WeightFile bad(differs, names);
  BOOST_CHECK_EXCEPTION(bad.check(model), Error, [&](const Error& e) {
    return std::string(e.what()) == "model.init_from " + differs +
                                        ": /model/lm_head.weight differs from /model/shared.weight, which it aliases "
                                        "(tied): one of them is not this model's tied weight";
  });
  // Without the family's names an alias is an unexpected tensor, as before.
  WeightFile strict(all);
  BOOST_CHECK_EXCEPTION(strict.check(model), Error, [&](const Error& e) {
    return std::string(e.what()) ==
           "model.init_from " + all + ": unexpected tensor /model/encoder.embed_tokens.weight (not in this model)";
  });
  const std::string missing = (dir.path / "missing.h5").string();
  write(missing, {{"b", bias.data()}});
  WeightFile none(missing, names);
  BOOST_CHECK_EXCEPTION(none.check(model), Error, [&](const Error& e) {
    return std::string(e.what()) == "model.init_from " + missing +
                                        ": missing tensor /model/shared.weight or /model/encoder.embed_tokens.weight "
                                        "or /model/lm_head.weight";
  });
}

BOOST_AUTO_TEST_CASE(a_state_holding_nan_or_inf_is_never_written) {
  TempDir dir;
  const std::string path = checkpoint_path(dir.path.string(), 3);
  for (CheckpointFormat format : {CheckpointFormat::consolidated, CheckpointFormat::sharded})
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      ToyState a(kSpecs, {{0, 1}, {2, 3}}, 4, {"exp_avg", "exp_avg_sq"});
      a.fill();
      a.at("b.weight", 2, 5) = bad;  // one element of one optimizer state
      SaveOptions options;
      options.format = format;
      try {
        save_checkpoint(path, a.st, some_meta(), options, MPI_COMM_NULL);
        BOOST_FAIL("a state holding " << bad << " was saved");
      } catch (const NonFiniteCheckpoint& e) {
        BOOST_TEST(std::string(e.what()) ==
                   "checkpoint: b.weight (exp_avg_sq) holds non-finite values (NaN or Inf); " + path + " not written");
      }
      BOOST_TEST(!fs::exists(path));
      BOOST_TEST(!fs::exists(path + ".tmp"));
    }
  // Padding is not a tensor: what it holds does not stop a save.
  ToyState a(kSpecs, {{0, 1}, {2, 3}}, 4, {});
  a.fill();
  BOOST_REQUIRE(a.st.units[0].padded_numel > a.layouts[0].numel);
  a.buffers[0][a.layouts[0].numel] = std::numeric_limits<float>::quiet_NaN();
  save_checkpoint(path, a.st, some_meta(), {}, MPI_COMM_NULL);
  BOOST_TEST(fs::exists(path));
}

BOOST_AUTO_TEST_CASE(checkpoint_folders_resume_from_the_newest_complete_file_and_keep_k) {
  TempDir dir;
  ToyState a(kSpecs, {{0, 1, 2, 3}}, 1, {});
  a.fill();
  BOOST_TEST(latest_checkpoint(dir.path.string()) == "");
  for (int64_t step : {2, 4, 6}) {
    CheckpointMeta m = some_meta();
    m.step = step;
    save_checkpoint(checkpoint_path(dir.path.string(), step), a.st, m, {}, MPI_COMM_NULL);
  }
  BOOST_TEST(fs::path(checkpoint_path(dir.path.string(), 6)).filename() == "ckpt_00000006.h5");
  // A newer file that is torn, and a killed save's temporary: both skipped.
  std::ofstream(checkpoint_path(dir.path.string(), 8)) << "torn";
  std::ofstream(checkpoint_path(dir.path.string(), 10) + ".tmp") << "half written";
  std::vector<std::string> skipped;
  BOOST_TEST(latest_checkpoint(dir.path.string(), &skipped) == checkpoint_path(dir.path.string(), 6));
  BOOST_REQUIRE_EQUAL(skipped.size(), 1u);
  BOOST_TEST(skipped[0].find("ckpt_00000008.h5") != std::string::npos);
  prune_checkpoints(dir.path.string(), 2, 6);
  BOOST_TEST(fs::exists(checkpoint_path(dir.path.string(), 8)));  // later than the save: left alone
  BOOST_TEST(!fs::exists(checkpoint_path(dir.path.string(), 2)));
  BOOST_TEST(fs::exists(checkpoint_path(dir.path.string(), 4)));
  BOOST_TEST(fs::exists(checkpoint_path(dir.path.string(), 6)));
  BOOST_TEST(!fs::exists(checkpoint_path(dir.path.string(), 10) + ".tmp"));
  // Junk of later steps never pushes out the file just saved.
  prune_checkpoints(dir.path.string(), 1, 6);
  BOOST_TEST(fs::exists(checkpoint_path(dir.path.string(), 6)));
  BOOST_TEST(!fs::exists(checkpoint_path(dir.path.string(), 4)));
  // A step file whose attribute disagrees with its name is not trusted.
  fs::rename(checkpoint_path(dir.path.string(), 6), checkpoint_path(dir.path.string(), 12));
  skipped.clear();
  BOOST_TEST(latest_checkpoint(dir.path.string(), &skipped) == "");
  BOOST_TEST(skipped.size() == 2u);
}

BOOST_AUTO_TEST_CASE(a_save_into_a_missing_folder_fails_cleanly) {
  ToyState a(kSpecs, {{0, 1, 2, 3}}, 1, {});
  a.fill();
  std::string e = error_of([&] { save_checkpoint("/nonexistent/dir/c.h5", a.st, some_meta(), {}, MPI_COMM_NULL); });
  BOOST_TEST(e.find("cannot create /nonexistent/dir/c.h5.tmp") != std::string::npos);
}
