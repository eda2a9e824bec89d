#pragma once
// Text clean-up before tokenizing (data.clean) and the small string helpers it and the
// tokenizers share.
#include <string>
#include <string_view>

namespace fsdp {

// Every `from` in `text` replaced by `to`, left to right (Python's str.replace).
std::string replace_all(std::string_view text, std::string_view from, std::string_view to);

// Python's str.strip() for ASCII whitespace.
std::string strip_space(std::string_view text);

// The PyTorch FSDP tutorial's WikiHow text, as its T5 saw it: first the `wikihow` data set loader
// it calls (Hugging Face's, following the WikiHow authors' process.py), then the tutorial's own
// clean_text (summarization_dataset.py). On one row:
//   1. strip both; a headline at least 0.75 times the text's length (in code points) drops the
//      row (the authors' filter of short articles and missing summaries);
//   2. headline ".," -> "."; text: dots, line breaks, a comma ([.]+[\n]+[,]) -> ".\n";
//   3. both: "Example of text:", "Example of Summary:", line feeds, "``" and '"' removed.
// Returns false when the row is dropped (step 1, or a part left empty).
bool clean_wikihow(std::string& text, std::string& headline);

}  // namespace fsdp
