// rouge_score 0.1.2's tokenize.py, rouge_scorer.py (_score_ngrams, _score_lcs) and
// scoring.fmeasure, restated.
#include "train/rouge.h"

#include <algorithm>
#include <map>

namespace fsdp {

namespace {

double fmeasure(double precision, double recall) {
  return precision + recall > 0 ? 2 * precision * recall / (precision + recall) : 0.0;
}

double ngram_f(const std::vector<std::string>& ref, const std::vector<std::string>& pred, size_t n) {
  auto grams = [n](const std::vector<std::string>& tokens) {
    std::map<std::vector<std::string>, long> counts;
    for (size_t i = 0; i + n <= tokens.size(); ++i)
      ++counts[{tokens.begin() + static_cast<long>(i), tokens.begin() + static_cast<long>(i + n)}];
    return counts;
  };
  const auto r = grams(ref), p = grams(pred);
  long overlap = 0, ref_count = 0, pred_count = 0;
  for (const auto& [g, c] : r) {
    ref_count += c;
    if (auto it = p.find(g); it != p.end()) overlap += std::min(c, it->second);
  }
  for (const auto& [g, c] : p) pred_count += c;
  const auto d = [](long x) { return static_cast<double>(std::max(x, 1L)); };
  return fmeasure(static_cast<double>(overlap) / d(pred_count), static_cast<double>(overlap) / d(ref_count));
}

size_t lcs_length(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  std::vector<size_t> prev(b.size() + 1, 0), cur(b.size() + 1, 0);
  for (const std::string& x : a) {
    for (size_t j = 1; j <= b.size(); ++j) cur[j] = x == b[j - 1] ? prev[j - 1] + 1 : std::max(prev[j], cur[j - 1]);
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

std::vector<std::string> rouge_tokenize(std::string_view text) {
  std::vector<std::string> tokens;
  std::string cur;
  for (const char ch : text) {
    const char lower = ch >= 'A' && ch <= 'Z' ? static_cast<char>(ch - 'A' + 'a') : ch;
    if ((lower >= 'a' && lower <= 'z') || (lower >= '0' && lower <= '9')) {
      cur.push_back(lower);
    } else if (!cur.empty()) {
      tokens.push_back(std::move(cur));
      cur.clear();
    }
  }
  if (!cur.empty()) tokens.push_back(std::move(cur));
  return tokens;
}

RougeScores rouge(std::string_view reference, std::string_view prediction) {
  const std::vector<std::string> ref = rouge_tokenize(reference), pred = rouge_tokenize(prediction);
  RougeScores s;
  s.rouge1 = ngram_f(ref, pred, 1);
  s.rouge2 = ngram_f(ref, pred, 2);
  if (!ref.empty() && !pred.empty()) {
    const auto lcs = static_cast<double>(lcs_length(ref, pred));
    s.rougeL = fmeasure(lcs / static_cast<double>(pred.size()), lcs / static_cast<double>(ref.size()));
  }
  return s;
}

}  // namespace fsdp
