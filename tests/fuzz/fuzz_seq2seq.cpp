// Fuzz target: the seq2seq JSON-lines reader (load_seq2seq: one JSON object per line, two string
// fields picked by name, byte tokens).
// Input: byte 0 picks source_len, byte 1 target_len, byte 2 eval_fraction, byte 3 the field
// names (the defaults, or names the rows may lack), then the file's bytes.
// Promises checked: those of seq2seq_checks.h.
#include "data/data.h"
#include "fuzz_util.h"
#include "seq2seq_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const std::vector<int64_t> lens = {2, 3, 5, 8, 17, 64, 512};
  const std::vector<double> fractions = {0.05, 0.5, 0.25, 0.9, 0.999999, 1e-300};
  const std::vector<std::pair<std::string, std::string>> names = {
      {"text", "headline"}, {"a", "b"}, {"text", "text"}, {"", "headline"}};
  fsdp::Seq2SeqOptions options;
  options.source_len = in.pick(lens);
  options.target_len = in.pick(lens);
  options.eval_fraction = in.pick(fractions);
  std::tie(options.source, options.target) = in.pick(names);
  const std::string dir = fuzz::fresh_dir("seq2seq");
  options.path = dir + "/pairs.jsonl";
  fuzz::write_file(options.path, in.rest());
  fuzz::check_seq2seq(options, [](const std::string&) {});
  return 0;
}
