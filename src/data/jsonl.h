#pragma once
// JSON lines: one object per line, blank lines skipped, string fields read by name. The seq2seq
// and causal-LM readers share it, and with it their messages: "WHAT FILE:LINE: problem".
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "tensor/error.h"

namespace fsdp {

// "WHAT FILE:LINE: problem", the one form of a bad row's message.
Error bad_row(const std::string& what, const std::string& file, int64_t line, const std::string& problem);

// One row's fields: string(key) is the field's text, or an Error (bad_row's) when the row has no
// such field or it is not a string.
class JsonRow {
 public:
  virtual ~JsonRow() = default;
  virtual std::string string(const std::string& key) const = 0;
};

// Calls visit for every non-blank line of `text` (lines end at '\n'), or throws bad_row's Error
// for a line that is not a JSON object.
void read_json_lines(std::string_view text, const std::string& what, const std::string& file,
                     const std::function<void(const JsonRow&)>& visit);

}  // namespace fsdp
