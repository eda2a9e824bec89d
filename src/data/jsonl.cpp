#include "data/jsonl.h"

#include <nlohmann/json.hpp>

namespace fsdp {

namespace {

class JsonlRow final : public JsonRow {
 public:
  JsonlRow(const nlohmann::json& row, const std::string& what, const std::string& file, int64_t line)
      : row_(row), what_(what), file_(file), line_(line) {}
  std::string string(const std::string& key) const override {
    const auto it = row_.find(key);
    if (it == row_.end()) throw bad_row(what_, file_, line_, "no field \"" + key + "\"");
    if (!it->is_string()) throw bad_row(what_, file_, line_, "field \"" + key + "\" is not a string");
    return it->get<std::string>();
  }

 private:
  const nlohmann::json& row_;
  const std::string &what_, &file_;
  int64_t line_;
};

}  // namespace

Error bad_row(const std::string& what, const std::string& file, int64_t line, const std::string& problem) {
  return Error(what + " " + file + ":" + std::to_string(line) + ": " + problem);
}

void read_json_lines(std::string_view text, const std::string& what, const std::string& file,
                     const std::function<void(const JsonRow&)>& visit) {
  size_t start = 0;
  for (int64_t number = 1; start < text.size(); ++number) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(start, end - start);
    start = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank lines separate nothing
    nlohmann::json row;
    try {
      row = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for a number like 1e999
      throw bad_row(what, file, number, std::string("not a JSON object (") + e.what() + ")");
    }
    if (!row.is_object()) throw bad_row(what, file, number, "not a JSON object");
    visit(JsonlRow(row, what, file, number));
  }
}

}  // namespace fsdp
