#include "data/clean.h"

#include <cstdint>

namespace fsdp {

namespace {

// Python's len() of UTF-8 text: the bytes that start a code point.
int64_t code_points(std::string_view text) {
  int64_t n = 0;
  for (char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// re.sub(r"[.]+[\n]+[,]", ".\n", text): a run of dots, then of line feeds, then a comma.
std::string join_comma_paragraphs(std::string_view text) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == '.') {
      size_t j = i;
      while (j < text.size() && text[j] == '.') ++j;
      size_t k = j;
      while (k < text.size() && text[k] == '\n') ++k;
      if (k > j && k < text.size() && text[k] == ',') {
        out += ".\n";
        i = k + 1;
        continue;
      }
    }
    out.push_back(text[i++]);
  }
  return out;
}

// The tutorial's clean_text.
std::string clean_text(std::string text) {
  for (std::string_view gone : {"Example of text:", "Example of Summary:", "\n", "``", "\""})
    text = replace_all(text, gone, "");
  return text;
}

}  // namespace

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  size_t start = 0;
  for (size_t at = text.find(from); at != std::string_view::npos; at = text.find(from, start)) {
    out.append(text.substr(start, at - start)).append(to);
    start = at + from.size();
  }
  return out.append(text.substr(start));
}

std::string strip_space(std::string_view text) {
  constexpr std::string_view kSpace = " \t\n\r\f\v";
  const size_t first = text.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return "";
  return std::string(text.substr(first, text.find_last_not_of(kSpace) - first + 1));
}

bool clean_wikihow(std::string& text, std::string& headline) {
  std::string article = strip_space(text), summary = strip_space(headline);
  if (static_cast<double>(code_points(summary)) >= 0.75 * static_cast<double>(code_points(article))) return false;
  summary = replace_all(summary, ".,", ".");
  article = join_comma_paragraphs(article);
  text = clean_text(std::move(article));
  headline = clean_text(std::move(summary));
  return !text.empty() && !headline.empty();
}

}  // namespace fsdp
