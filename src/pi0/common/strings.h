// Small string helpers shared by every user-facing validation (config keys, presets, precision modes).
#pragma once
#include <string>
#include <vector>

namespace pi0 {

/// Levenshtein distance (insertions, deletions, substitutions).
size_t edit_distance(const std::string& a, const std::string& b);

/// The candidate closest to `value` if it is a plausible typo of it (at most a third of the longer string
/// changed, at least 2 edits allowed), else "".
std::string did_you_mean(const std::string& value, const std::vector<std::string>& candidates);

}  // namespace pi0
