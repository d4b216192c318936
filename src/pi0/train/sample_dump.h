// Shows what training reads: the first samples of a config's data pipeline written as files a person can open
// (`pi0-train --config X --dump-batches N DIR`), for every dataset format (LIBERO / ALOHA HDF5, LeRobot). A dataset
// problem (frames upside down, the wrong camera in a slot, a state in other units, an empty prompt) is then seen
// rather than guessed. Layout of DIR (docs/data.md, "Seeing what training reads"):
//   sample_000/                     the first sample the training loader yields (rank 0 of 1, micro-batch order)
//     <slot>_raw.png                the camera's frame as read from the dataset (after flip_images), before resizing
//     <slot>.png                    what the model sees: resized with pad to model.image_size (augmented if
//                                   data.augment), mapped back from [-1, 1] to 0..255
//     sample.json                   provenance (dataset index, episode, frame, file), the prompt, the state and the
//                                   action chunk as read and as the model gets them (normalized, padded), the prompt
//                                   tokens with their mask and the decoded token text, and each slot's camera key
//   sample_001/ ...
#pragma once
#include <cstdint>
#include <string>

#include "pi0/config/config.h"

namespace pi0::train {

/// Writes the first `n` samples the training loader of `cfg` yields into the new directory `dir` (written under a
/// temporary name, then renamed: an existing `dir` is never touched). Needs what training needs from the data
/// section (dataset, norm stats, tokenizer), not the model. Returns the number of samples written (n).
/// UserError for n < 1, an existing `dir`, or any data problem training would report.
int64_t dump_samples(const config::Config& cfg, int64_t n, const std::string& dir);

}  // namespace pi0::train
