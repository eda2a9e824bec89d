// Fuzz target: the safetensors reader (SafetensorsReader: one file, or a model folder with
// model.safetensors.index.json and the files it names).
// Input: byte 0 picks the form: even, the rest is one .safetensors file; odd, the rest is split
// at 0x1e bytes into the index JSON, a.safetensors and b.safetensors of a folder.
// Promises checked: bad input is an fsdp::Error with a message; a file set that opens has every
// tensor's byte count equal to its shape times its dtype's size, and every float tensor reads
// whole and in two pieces alike (a non-float one is refused with an Error); bytes_read counts the
// headers plus exactly the ranges read.
#include <cmath>
#include <cstring>

#include "ckpt/safetensors.h"
#include "fuzz_util.h"

namespace {

// Floats compared bitwise (NaN payloads included): the two reads convert the same bytes.
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const bool folder = (in.u8() & 1) != 0;
  const std::string dir = fuzz::fresh_dir("safetensors");
  std::string path = dir + "/m.safetensors";
  if (folder) {
    const std::vector<std::string> parts = fuzz::split(in.rest(), '\x1e', 3);
    fuzz::write_file(dir + "/model.safetensors.index.json", parts[0]);
    if (parts.size() > 1) fuzz::write_file(dir + "/a.safetensors", parts[1]);
    if (parts.size() > 2) fuzz::write_file(dir + "/b.safetensors", parts[2]);
    path = dir;
  } else {
    fuzz::write_file(path, in.rest());
  }
  std::unique_ptr<fsdp::SafetensorsReader> reader;
  try {
    reader = std::make_unique<fsdp::SafetensorsReader>(path);
  } catch (const fsdp::Error& e) {
    fuzz::expect_message(e);
    return 0;
  }
  uint64_t expected_read = reader->bytes_read();
  for (const auto& [name, entry] : reader->tensors()) {
    const fsdp::SafetensorsTensor& t = *entry.tensor;
    if (t.name != name) fuzz::broken("an index entry under another tensor's name");
    if (t.end_bytes - t.begin_bytes != static_cast<uint64_t>(t.numel()) * static_cast<uint64_t>(t.element_bytes))
      fuzz::broken("a tensor whose byte range does not fit its shape and dtype");
    const int64_t n = t.numel();
    std::vector<float> whole(static_cast<size_t>(n)), halves(static_cast<size_t>(n));
    try {
      reader->read_f32(entry, 0, n, whole.data());
    } catch (const fsdp::Error& e) {
      fuzz::expect_message(e);
      if (t.dtype == "F32" || t.dtype == "BF16" || t.dtype == "F16") fuzz::broken("a float tensor that does not read");
      continue;
    }
    const int64_t k = n / 2;
    reader->read_f32(entry, 0, k, halves.data());
    reader->read_f32(entry, k, n - k, halves.data() + k);
    if (!same_bits(whole, halves)) fuzz::broken("a tensor read whole and in halves differs");
    expected_read += 2 * static_cast<uint64_t>(n) * static_cast<uint64_t>(t.element_bytes);
  }
  if (reader->bytes_read() != expected_read) fuzz::broken("bytes_read is not the headers plus the ranges read");
  return 0;
}
