// Hugging Face safetensors: the reader and writer (ckpt/safetensors.h) on good files and on every
// kind of damage with its exact message, the sharded index form, and load_hf_weights (one
// process) filling a rank's shard ranges with aliases resolved. The multi-rank load and the
// round trip through transformers are tests/reference/check_hf_io.py's.
#define BOOST_TEST_MODULE safetensors
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ckpt/hf_weights.h"
#include "ckpt/safetensors.h"
#include "nn/flat.h"
#include "tensor/dtype.h"
#include "tensor/error.h"

namespace fs = std::filesystem;
using namespace fsdp;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("fsdp_safetensors_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
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

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A file by hand: the 8-byte little-endian length of `header` (or `length` when given), the
// header, then `data_bytes` bytes of data.
std::string raw_file(const std::string& header, size_t data_bytes, uint64_t length = UINT64_MAX) {
  if (length == UINT64_MAX) length = header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(length >> (8 * i));
  return out + header + std::string(data_bytes, '\x01');
}

std::string open_error(const std::string& path) {
  return error_of([&] { SafetensorsReader r(path); });
}

// Writes `specs` with values base + i (element i) as dtype.
void write_iota(const std::string& path, const std::vector<SafetensorsWriter::Spec>& specs, DType dtype,
                float base = 0.0f) {
  SafetensorsWriter w(specs, dtype, {{"format", "pt"}});
  w.create(path);
  for (size_t k = 0; k < specs.size(); ++k) {
    std::vector<float> v(static_cast<size_t>(shape_numel(specs[k].shape)));
    for (size_t i = 0; i < v.size(); ++i) v[i] = base + static_cast<float>(k * 100 + i);
    w.write_f32(k, 0, static_cast<int64_t>(v.size()), v.data());
  }
  w.close();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(format)

BOOST_AUTO_TEST_CASE(round_trip_every_dtype_and_ranges) {
  TempDir dir;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    const std::string path = dir.file(std::string(dtype_name(dtype)) + ".safetensors");
    write_iota(path, {{"a.weight", {3, 5}}, {"b", {7}}, {"empty", {0, 4}}}, dtype);
    SafetensorsReader r(path);
    BOOST_TEST(r.tensors().size() == 3u);
    const auto* a = r.find("a.weight");
    BOOST_REQUIRE(a);
    BOOST_TEST(a->tensor->dtype == (dtype == DType::f32 ? "F32" : dtype == DType::bf16 ? "BF16" : "F16"));
    BOOST_TEST(a->tensor->shape == (Shape{3, 5}));
    // Small integers are exact in every one of these types.
    std::vector<float> got(4);
    r.read_f32(*a, 6, 4, got.data());
    BOOST_TEST(got == (std::vector<float>{6, 7, 8, 9}), boost::test_tools::per_element());
    r.read_f32(*r.find("b"), 0, 7, std::vector<float>(7).data());
    // 8 header-length bytes, a header padded to a multiple of 8, then exactly the ranges asked.
    const uint64_t header = fs::file_size(path) - (15 + 7) * dtype_bytes(dtype);
    BOOST_TEST(header % 8 == 0u);
    BOOST_TEST(r.bytes_read() == header + (4 + 7) * dtype_bytes(dtype));
    BOOST_TEST(r.find("missing") == nullptr);
  }
}

BOOST_AUTO_TEST_CASE(index_folder_and_single_file_folder) {
  TempDir dir;
  write_iota(dir.file("model-00001-of-00002.safetensors"), {{"x", {2, 2}}}, DType::f32);
  write_iota(dir.file("model-00002-of-00002.safetensors"), {{"y", {3}}, {"z", {1}}}, DType::bf16, 10.0f);
  write_bytes(dir.file("model.safetensors.index.json"),
              R"({"metadata": {"total_size": 20}, "weight_map": {"x": "model-00001-of-00002.safetensors",
                  "y": "model-00002-of-00002.safetensors", "z": "model-00002-of-00002.safetensors"}})");
  {
    SafetensorsReader r(dir.path.string());
    BOOST_TEST(r.file_count() == 2u);
    float y[3];
    r.read_f32(*r.find("y"), 0, 3, y);
    BOOST_TEST(y[2] == 12.0f);
    BOOST_TEST(r.file_path(r.find("z")->file) == dir.file("model-00002-of-00002.safetensors"));
  }
  // model.safetensors beside an index wins, as in transformers.
  write_iota(dir.file("model.safetensors"), {{"only", {1}}}, DType::f32);
  SafetensorsReader r(dir.path.string());
  BOOST_TEST(r.tensors().size() == 1u);
  BOOST_TEST(r.find("only") != nullptr);
}

BOOST_AUTO_TEST_CASE(damaged_files_give_one_line_each) {
  TempDir dir;
  const std::string f = dir.file("m.safetensors");
  auto check = [&](const std::string& bytes, const std::string& message) {
    write_bytes(f, bytes);
    BOOST_TEST(open_error(f) == f + ": " + message);
  };
  const std::string t = R"("dtype": "F32", "shape": [2])";
  check("abc", "truncated: 3 bytes, less than the 8-byte header length");
  check(raw_file("{}", 0, 100'000'001), "header length 100000001 bytes is over the 100 MB limit");
  check(raw_file("{}", 0, 40), "truncated: the header needs 48 bytes, the file has 10");
  check(raw_file("{\"a\": ", 0),
        "bad header JSON ([json.exception.parse_error.101] parse error at line 1, column 7: syntax error while "
        "parsing value - unexpected end of input; expected '[', '{', or a literal)");
  check(raw_file("[1, 2]", 0), "the header is not a JSON object");
  check(raw_file(R"({"a": {"dtype": "F33", "shape": [2], "data_offsets": [0, 8]}})", 8),
        "tensor a: unknown dtype 'F33'");
  check(raw_file(R"({"a": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 8]}})", 8),
        "tensor a: shape holds -1, not a dimension");
  check(raw_file(R"({"a": {)" + t + R"(, "data_offsets": [8, 0]}})", 8),
        "tensor a: data_offsets is not [begin, end] with begin <= end");
  check(raw_file(R"({"a": {)" + t + R"(, "data_offsets": [0, 4]}})", 4),
        "tensor a: data_offsets [0, 4) hold 4 bytes, its F32 shape [2] needs 8");
  check(raw_file(R"({"a": {)" + t + R"(, "data_offsets": [0, 8]}, "b": {)" + t + R"(, "data_offsets": [4, 12]}})", 12),
        "tensors a [0, 8) and b [4, 12) overlap");
  check(raw_file(R"({"a": {)" + t + R"(, "data_offsets": [0, 8]}, "b": {)" + t + R"(, "data_offsets": [12, 20]}})", 20),
        "a gap of 4 bytes in the data before tensor b (bytes [8, 12) belong to no tensor)");
  check(raw_file(R"({"a": {)" + t + R"(, "data_offsets": [0, 8]}})", 5),
        "tensor a at data_offsets [0, 8) runs past the end of the data (5 bytes; truncated file?)");
  check(raw_file(R"({"a": {)" + t + R"(, "data_offsets": [0, 8]}})", 11),
        "3 bytes after the last tensor's data (bytes [8, 11) belong to no tensor)");
  check(raw_file(R"({"__metadata__": {"format": 1}})", 0), "__metadata__ value of 'format' is not a string");
  check(raw_file(R"({"a": {"shape": [2], "data_offsets": [0, 8]}})", 8), "tensor a: no dtype string");
  // A known dtype that is not a float parses (its place is checked) and is refused when read.
  write_bytes(f, raw_file(R"({"i": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", 8));
  SafetensorsReader r(f);
  BOOST_TEST(error_of([&] { r.read_f32(*r.find("i"), 0, 1, std::vector<float>(1).data()); }) ==
             f + ": tensor i has dtype I64 (F32, BF16 or F16 expected)");
  BOOST_TEST(open_error(dir.file("none.safetensors")) ==
             dir.file("none.safetensors") + ": cannot open (No such file or directory)");
  BOOST_TEST(open_error(dir.path.string()) ==
             dir.path.string() + ": no model.safetensors or model.safetensors.index.json in this folder");
}

BOOST_AUTO_TEST_CASE(damaged_index_gives_one_line_each) {
  TempDir dir;
  const std::string index = dir.file("model.safetensors.index.json");
  write_iota(dir.file("a.safetensors"), {{"x", {2}}, {"y", {1}}}, DType::f32);
  auto check = [&](const std::string& json, const std::string& message) {
    write_bytes(index, json);
    BOOST_TEST(open_error(dir.path.string()) == message);
  };
  check("{", index +
                 ": bad JSON ([json.exception.parse_error.101] parse error at line 1, column 2: syntax error "
                 "while parsing object key - unexpected end of input; expected string literal)");
  check(R"({"metadata": {}})", index + ": no weight_map object");
  check(R"({"weight_map": {"x": "../a.safetensors"}})",
        index + ": weight_map puts x in '../a.safetensors', not a file name in this folder");
  check(R"({"weight_map": {"x": "a.safetensors", "y": "a.safetensors", "w": "a.safetensors"}})",
        index + ": weight_map puts w in a.safetensors, which does not hold it");
  check(R"({"weight_map": {"x": "a.safetensors"}})",
        dir.file("a.safetensors") + ": holds tensor y, which " + index + " does not list");
  check(R"({"weight_map": {"x": "a.safetensors", "y": "a.safetensors", "z": "b.safetensors"}})",
        dir.file("b.safetensors") + ": cannot open (No such file or directory)");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(hf_weights)

namespace {

// A T5-like model of two units: unit 0 {shared.weight (4, 3), lm_head.weight (4, 3)}, unit 1
// {norm (3)}, each split over 2 ranks; `rank` holds its half of every padded unit.
struct TwoUnits {
  std::deque<Param> params;
  std::deque<FlatLayout> layouts;
  std::vector<float> buffer;
  ShardedState st;
  TwoUnits(int rank, bool lm_head) {
    std::vector<std::vector<Param*>> units(2);
    params.push_back(Param{"shared.weight", {4, 3}, {}, nullptr, nullptr});
    units[0].push_back(&params.back());
    if (lm_head) {
      params.push_back(Param{"lm_head.weight", {4, 3}, {}, nullptr, nullptr});
      units[0].push_back(&params.back());
    }
    params.push_back(Param{"norm", {3}, {}, nullptr, nullptr});
    units[1].push_back(&params.back());
    int64_t local = 0;
    for (auto& u : units) {
      const FlatLayout& layout = layouts.emplace_back(make_flat_layout(u));
      UnitShard s;
      s.layout = &layout;
      s.padded_numel = (layout.numel + 1) / 2 * 2;
      s.held_count = s.padded_numel / 2;
      s.held_begin = rank * s.held_count;
      s.local_offset = local;
      local += s.held_count;
      st.units.push_back(s);
    }
    buffer.assign(static_cast<size_t>(local), -1.0f);
    st.buffers.push_back(buffer.data());
  }
};

HfNames t5_names(bool tied) {
  HfNames n;
  n.aliases["shared.weight"] = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight"};
  if (tied) n.ignored.insert("lm_head.weight");
  return n;
}

}  // namespace

BOOST_AUTO_TEST_CASE(each_rank_reads_its_ranges_with_aliases) {
  TempDir dir;
  const std::string f = dir.file("m.safetensors");
  // shared.weight only under an alias; values 0..11 (alias) and 200.. (norm), lm_head 100..
  write_iota(f, {{"encoder.embed_tokens.weight", {4, 3}}, {"lm_head.weight", {4, 3}}, {"norm", {3}}}, DType::bf16);
  for (int rank : {0, 1}) {
    TwoUnits m(rank, true);
    const HfLoadStats stats = load_hf_weights(f, m.st, t5_names(false), MPI_COMM_NULL);
    // Unit 0: 24 elements, 12 per rank; unit 1: 3 elements padded to 4, 2 per rank.
    std::vector<float> want;
    for (int i = 0; i < 12; ++i) {
      const int e = rank * 12 + i;  // element of the unit's flat buffer
      want.push_back(e < 12 ? static_cast<float>(e) : static_cast<float>(100 + e - 12));
    }
    const std::vector<float> norm = rank == 0 ? std::vector<float>{200, 201} : std::vector<float>{202, 0};
    want.insert(want.end(), norm.begin(), norm.end());
    BOOST_TEST(m.buffer == want, boost::test_tools::per_element());
    BOOST_TEST(stats.tensor_bytes == 27 * 4);
    const uint64_t header = fs::file_size(f) - 27 * 2;
    BOOST_TEST(stats.bytes_read == header + (12 + (rank == 0 ? 2 : 1)) * 2);
  }
}

BOOST_AUTO_TEST_CASE(mismatches_give_one_line_each) {
  TempDir dir;
  const std::string f = dir.file("m.safetensors");
  auto check = [&](const std::vector<SafetensorsWriter::Spec>& specs, bool lm_head, const std::string& message) {
    write_iota(f, specs, DType::f32);
    TwoUnits m(0, lm_head);
    BOOST_TEST(error_of([&] { load_hf_weights(f, m.st, t5_names(!lm_head), MPI_COMM_NULL); }) == message);
  };
  // A tied model ignores the file's lm_head.weight; the shared weight found as decoder's alias.
  write_iota(f, {{"decoder.embed_tokens.weight", {4, 3}}, {"lm_head.weight", {4, 3}}, {"norm", {3}}}, DType::f16);
  TwoUnits tied(1, false);
  load_hf_weights(f, tied.st, t5_names(true), MPI_COMM_NULL);
  BOOST_TEST(tied.buffer[0] == 6.0f);
  check({{"shared.weight", {4, 3}}, {"norm", {3}}}, true, f + ": missing tensor lm_head.weight");
  check({{"lm_head.weight", {4, 3}}, {"norm", {3}}}, true,
        f + ": missing tensor shared.weight or encoder.embed_tokens.weight or decoder.embed_tokens.weight");
  check({{"shared.weight", {3, 4}}, {"norm", {3}}}, false,
        f + ": tensor shared.weight has shape [3, 4], the model "
            "expects [4, 3]");
  check({{"shared.weight", {4, 3}}, {"encoder.embed_tokens.weight", {4, 4}}, {"norm", {3}}}, false,
        f + ": tensor encoder.embed_tokens.weight (an alias of shared.weight) has shape [4, 4], the model expects [4, "
            "3]");
  check({{"shared.weight", {4, 3}}, {"norm", {3}}, {"extra", {1}}}, false,
        f + ": unexpected tensor extra (not in this model)");
  write_bytes(f, raw_file(R"({"shared.weight": {"dtype": "I32", "shape": [4, 3], "data_offsets": [0, 48]},
                              "norm": {"dtype": "F32", "shape": [3], "data_offsets": [48, 60]}})",
                          60));
  TwoUnits m(0, false);
  BOOST_TEST(error_of([&] { load_hf_weights(f, m.st, t5_names(true), MPI_COMM_NULL); }) ==
             f + ": tensor shared.weight has dtype I32 (F32, BF16 or F16 expected)");
}

BOOST_AUTO_TEST_SUITE_END()
