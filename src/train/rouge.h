#pragma once
// ROUGE-1, ROUGE-2 and ROUGE-L F-measures as Google's rouge_score (0.1.2, the scorer Hugging
// Face's `evaluate` wraps) computes them with its default tokenizer and no stemmer: lowercase,
// every run of characters outside [a-z0-9] a separator; n-gram counts clipped by the reference;
// ROUGE-L from the longest common subsequence (sentence level, "rougeL", not "rougeLsum").
// Where rouge_score lowercases non-ASCII letters with Python's str.lower, this sees separators:
// the two differ only for the few non-ASCII characters whose lowercase is ASCII (the Kelvin
// sign, dotted capital I).
#include <string>
#include <string_view>
#include <vector>

namespace fsdp {

struct RougeScores {
  double rouge1 = 0.0, rouge2 = 0.0, rougeL = 0.0;  // F-measures in [0, 1]
};

std::vector<std::string> rouge_tokenize(std::string_view text);
// rouge_score's RougeScorer(['rouge1', 'rouge2', 'rougeL']).score(target=reference, prediction).
RougeScores rouge(std::string_view reference, std::string_view prediction);

}  // namespace fsdp
