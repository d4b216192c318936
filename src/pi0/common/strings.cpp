#include "pi0/common/strings.h"

#include <algorithm>

namespace pi0 {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string did_you_mean(const std::string& value, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::string::npos;
  for (const auto& c : candidates) {
    const size_t d = edit_distance(value, c);
    if (d < best_d) best_d = d, best = c;
  }
  // Plausible typo: at most a third of the longer string changed (and at least 2 edits allowed).
  const size_t limit = std::max<size_t>(2, std::max(value.size(), best.size()) / 3);
  return best_d <= limit ? best : "";
}

}  // namespace pi0
