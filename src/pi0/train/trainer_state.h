// trainer_state.json of a checkpoint: the step, the world size, the non-finite skip count and every rank's loader
// position. Written by the Checkpointer (checkpointer.h) into every checkpoint; read back (each field checked,
// errors naming the file and the field) before a resume builds anything. Not to be confused with the Checkpointer's
// CheckpointedState, the live trainer state by reference that this file is one part of.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pi0/data/loader.h"
#include "pi0/io/checkpoint_files.h"

namespace pi0::train {

using io::kTrainerStateFile;

/// The contents of trainer_state.json.
struct TrainerStateFile {
  int64_t step = 0;             ///< optimizer steps completed
  int64_t world_size = 1;       ///< ranks that wrote the checkpoint
  int64_t nonfinite_skips = 0;  ///< steps skipped so far (train.max_nonfinite_skips)
  std::vector<data::LoaderPosition> rank_loaders;  ///< one per rank, rank order
};

/// The JSON written to a checkpoint (also "loader": rank 0's position, as single-process checkpoints have it).
nlohmann::json to_json(const TrainerStateFile& state);

/// Reads `<checkpoint_dir>/trainer_state.json`. Throws pi0::UserError naming the file (and the field: "step must
/// be an integer >= 0 (got "two")") when it cannot be read, is not JSON, or a field is missing or out of range.
/// Older checkpoints without world_size / nonfinite_skips / rank_loaders read as 1 / 0 / [loader].
TrainerStateFile read_trainer_state(const std::string& checkpoint_dir);

/// Checks that `state` can resume a run of `world_size` ranks whose loader has `batches_per_epoch` batches per
/// epoch (the dataset or batch size may have changed since); UserError naming the file otherwise.
void check_resumable(const TrainerStateFile& state, const std::string& checkpoint_dir, int64_t world_size,
                     int64_t batches_per_epoch);

}  // namespace pi0::train
