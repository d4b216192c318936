#include "pi0/data/split.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "pi0/common/check.h"

namespace pi0::data {

std::vector<int64_t> held_out_episodes(int64_t num_episodes, double fraction, const std::vector<int64_t>& listed,
                                       uint64_t seed, int64_t entry, const std::string& key) {
  std::vector<int64_t> out;
  if (!listed.empty()) {
    for (const int64_t e : listed) {
      if (e < 0 || e >= num_episodes) {
        throw UserError(key + ".validation_episodes: episode " + std::to_string(e) + " does not exist (expected 0.." +
                        std::to_string(num_episodes - 1) + ": the dataset has " + std::to_string(num_episodes) +
                        " episodes)");
      }
    }
    const std::set<int64_t> unique(listed.begin(), listed.end());
    out.assign(unique.begin(), unique.end());
  } else if (fraction > 0) {
    const int64_t k = std::max<int64_t>(1, std::llround(fraction * static_cast<double>(num_episodes)));
    // Its own stream: (seed, entry) with a tag no epoch permutation uses.
    const auto perm = DataLoader::permutation(num_episodes, sample_seed(seed, entry, -5), 0);
    out.assign(perm.begin(), perm.begin() + std::min(k, num_episodes));
    std::sort(out.begin(), out.end());
  }
  if (!out.empty() && static_cast<int64_t>(out.size()) >= num_episodes) {
    throw UserError(key + ": all " + std::to_string(num_episodes) + " episodes would be held out for validation (" +
                    (listed.empty() ? "data.validation_split " + std::to_string(fraction) : std::string("validation_episodes")) +
                    "), expected at least one left to train on");
  }
  return out;
}

std::vector<int64_t> episode_frames(const RobotDataset& dataset, const std::vector<int64_t>& episodes, bool held_out) {
  const std::set<int64_t> chosen(episodes.begin(), episodes.end());
  std::vector<int64_t> out;
  for (int64_t e = 0; e < dataset.num_episodes(); ++e) {
    if (chosen.count(e) != static_cast<size_t>(held_out)) continue;
    const auto& ep = dataset.episode(e);
    for (int64_t t = 0; t < ep.length; ++t) out.push_back(ep.first_index + t);
  }
  return out;
}

std::vector<SampleRef> validation_samples(const std::vector<std::vector<int64_t>>& held_out, int64_t count) {
  std::vector<SampleRef> all;
  for (size_t i = 0; i < held_out.size(); ++i)
    for (const int64_t index : held_out[i]) all.push_back({static_cast<int64_t>(i), index});
  const int64_t n = static_cast<int64_t>(all.size());
  if (count <= 0 || count >= n) return all;
  std::vector<SampleRef> out;
  for (int64_t j = 0; j < count; ++j) out.push_back(all[static_cast<size_t>(j * n / count)]);
  return out;
}

}  // namespace pi0::data
