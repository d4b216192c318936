// The validation split: which episodes of each dataset are held out of training (data.validation_split, or an
// entry's validation_episodes), the frames left to train on, and the fixed set of held-out samples each validation
// pass evaluates. Whole episodes are held out, never single frames: neighbouring frames of one episode are nearly
// the same sample, and a frame of a training episode would leak into the validation loss.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "pi0/data/dataset.h"
#include "pi0/data/loader.h"

namespace pi0::data {

/// The held-out episodes of a dataset of `num_episodes`, ascending: `listed` when not empty (each checked to be a
/// valid index; `key` names it in the UserError), else round(fraction · num_episodes), at least 1 when fraction > 0,
/// chosen by a permutation from (seed, `entry`). UserError (naming `key`) when no episode would be left to train on.
std::vector<int64_t> held_out_episodes(int64_t num_episodes, double fraction, const std::vector<int64_t>& listed,
                                       uint64_t seed, int64_t entry, const std::string& key);

/// Dataset indices of every frame of the episodes in `episodes` (held_out true), or of every other episode (false),
/// ascending.
std::vector<int64_t> episode_frames(const RobotDataset& dataset, const std::vector<int64_t>& episodes, bool held_out);

/// The samples a validation pass evaluates: `count` of the held-out frames of every source (`held_out[i]`: dataset
/// indices of source i), evenly spaced over all of them in source order (every one when count is 0 or exceeds them).
/// The same on every call: values compare across passes and across a resume.
std::vector<SampleRef> validation_samples(const std::vector<std::vector<int64_t>>& held_out, int64_t count);

}  // namespace pi0::data
