#include "data/csv.h"

#include "tensor/error.h"

namespace fsdp {

namespace {
constexpr size_t kBlockBytes = size_t{1} << 16;
}  // namespace

CsvReader::CsvReader(std::istream& in, std::string where) : in_(in), where_(std::move(where)), buffer_(kBlockBytes) {}

bool CsvReader::refill() {
  if (pos_ < end_) return true;
  in_.read(buffer_.data(), static_cast<std::streamsize>(buffer_.size()));
  if (in_.bad()) throw Error(where_ + ": cannot read");
  pos_ = 0;
  end_ = static_cast<size_t>(in_.gcount());
  return end_ > 0;
}

int CsvReader::peek() { return refill() ? static_cast<unsigned char>(buffer_[pos_]) : -1; }

int CsvReader::get() {
  if (!refill()) return -1;
  const int c = static_cast<unsigned char>(buffer_[pos_++]);
  if (c == '\n') ++line_;
  return c;
}

bool CsvReader::next(std::vector<std::string>& fields) {
  if (!started_) {  // a UTF-8 byte order mark (spreadsheet exports write one) is not data
    started_ = true;
    if (peek() == 0xEF && pos_ + 2 < end_ && static_cast<unsigned char>(buffer_[pos_ + 1]) == 0xBB &&
        static_cast<unsigned char>(buffer_[pos_ + 2]) == 0xBF)
      pos_ += 3;
  }
  for (;;) {
    fields.clear();
    record_line_ = line_;
    if (peek() < 0) return false;
    bool blank = true;  // a line with nothing on it (LF or CRLF alone)
    for (;;) {          // one field per pass; `c` ends it
      std::string field;
      int c = get();
      if (c == '"') {
        blank = false;
        const int64_t opened = line_;
        for (;;) {
          c = get();
          if (c < 0)
            throw Error(where_ + ":" + std::to_string(opened) +
                        ": a quoted field is not closed before the end of the file");
          if (c == '"') {
            if (peek() != '"') break;
            get();
          }
          field.push_back(static_cast<char>(c));
        }
        c = get();
        if (c == '\r' && (peek() == '\n' || peek() < 0)) c = get();
        if (c != ',' && c != '\n' && c >= 0)
          throw Error(where_ + ":" + std::to_string(line_) +
                      ": text after a closing quote (a quote inside a quoted field is written \"\")");
      } else {
        while (c >= 0 && c != ',' && c != '\n') {
          if (c == '\r' && peek() == '\n') {  // CRLF ends the record; a lone CR is data
            c = get();
            break;
          }
          field.push_back(static_cast<char>(c));
          c = get();
        }
        if (c == ',' || !field.empty()) blank = false;
      }
      fields.push_back(std::move(field));
      if (c != ',') break;  // end of line or file
    }
    if (!blank) return true;
  }
}

}  // namespace fsdp
