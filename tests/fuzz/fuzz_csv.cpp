// Fuzz target: the seq2seq CSV reader (data/csv.h through load_seq2seq: a header row naming the
// columns, RFC 4180 quoting, CRLF, two columns picked by name, byte tokens), with the WikiHow
// clean-up and the loss on padding as the input chooses.
// Input: byte 0 picks source_len, byte 1 target_len, byte 2 eval_fraction, byte 3 the column
// names (WikiHow's, names a header may lack, one column twice, an empty name), byte 4 the options
// (bit 0: data.clean wikihow, bit 1: loss_on_padding), then the file's bytes.
// Promises checked: those of seq2seq_checks.h, and after the WikiHow clean-up no text holds a
// line feed or a double quote (clean_text removes "``" before the quotes, so "`\"`" leaves one).
#include "data/data.h"
#include "fuzz_util.h"
#include "seq2seq_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const std::vector<int64_t> lens = {2, 3, 5, 8, 17, 64, 512};
  const std::vector<double> fractions = {0.05, 0.5, 0.25, 0.9, 0.999999, 1e-300};
  const std::vector<std::pair<std::string, std::string>> names = {
      {"text", "headline"}, {"a", "b"}, {"title", "title"}, {"", "headline"}};
  fsdp::Seq2SeqOptions options;
  options.source_len = in.pick(lens);
  options.target_len = in.pick(lens);
  options.eval_fraction = in.pick(fractions);
  std::tie(options.source, options.target) = in.pick(names);
  const uint8_t flags = in.u8();
  options.clean = flags & 1 ? fsdp::TextClean::wikihow : fsdp::TextClean::none;
  options.loss_on_padding = (flags & 2) != 0;
  const std::string dir = fuzz::fresh_dir("csv");
  options.path = dir + "/pairs.csv";
  fuzz::write_file(options.path, in.rest());
  fuzz::check_seq2seq(options, [&](const std::string& text) {
    if (options.clean == fsdp::TextClean::wikihow &&
        (text.find('\n') != std::string::npos || text.find('"') != std::string::npos))
      fuzz::broken("a line feed or a double quote left by the WikiHow clean-up");
  });
  return 0;
}
