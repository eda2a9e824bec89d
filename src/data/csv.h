#pragma once
// CSV records (RFC 4180), read one at a time from a stream: fields separated by commas, records
// by CRLF or LF; a field in double quotes may hold commas, line breaks and "" (one quote). As
// Python's csv module and pandas do, a quote inside an unquoted field is an ordinary character,
// a blank line is no record, and a UTF-8 byte order mark before the first record is dropped.
// What they would guess at is an error here: text after a closing quote, and a quoted field
// still open at the end of the file.
#include <cstdint>
#include <istream>
#include <string>
#include <vector>

namespace fsdp {

class CsvReader {
 public:
  // `where` starts every error message: "WHERE:LINE: problem".
  CsvReader(std::istream& in, std::string where);
  // The next record's fields into `fields` (replaced); false at the end of the input.
  // Error "WHERE:LINE: ..." on a malformed record, LINE being where that record starts.
  bool next(std::vector<std::string>& fields);
  int64_t line() const { return record_line_; }  // the line the last record started on (1-based)

 private:
  int get();   // the next byte (0..255), or -1 at the end; counts lines
  int peek();  // the next byte without taking it, or -1
  bool refill();

  std::istream& in_;
  std::string where_;
  std::vector<char> buffer_;  // 64 KiB blocks: a 600 MB wikihowAll.csv byte by byte from the
  size_t pos_ = 0, end_ = 0;  // stream would cost seconds
  int64_t line_ = 1, record_line_ = 0;
  bool started_ = false;
};

}  // namespace fsdp
