// trainer_state.json of a checkpoint: the step, the world size, the non-finite skip count and every rank's loader
// position. Written by the Checkpointer (checkpointer.h) into every checkpoint; read back (each field checked,
// errors naming the file and the field) before a resume builds anything. Not to be confused with the Checkpointer's
// CheckpointedState, the live trainer state by reference that this file is one part of.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pi0/data/loader.h"
#include "pi0/io/checkpoint_files.h"

namespace pi0::train {

using io::kTrainerStateFile;

/// What chose a run's held-out validation set, recorded in every checkpoint so that --resume refuses another set:
/// episodes trained on would become validation episodes (or the other way round), and checkpoint.keep_best would
/// rank val_loss values measured on different samples. docs/data.md, "Validation split".
struct ValidationSetId {
  double validation_split = 0;  ///< data.validation_split, e.g. 0.25
  int64_t seed = 0;             ///< train.seed: chooses the held-out episodes and each sample's noise and time
  int64_t val_samples = 0;      ///< train.val_samples, e.g. 64
  /// XXH3 of the set itself (train::make_data_pipeline): every dataset's held-out frames, the samples a pass
  /// evaluates and, when there are any, the seed; 16 hex digits. Equal digests are equal sets, whatever the keys.
  std::string digest;
};

/// What changed the held-out set between the checkpoint `checkpoint_dir` (`recorded`) and this run (`run`), as one
/// clause: the first differing key ("data.validation_split is 0.5 but was 0.25 when checkpoint <dir> was written"),
/// or, with the same keys, that the set itself differs (the datasets or validation_episodes changed). "" when the
/// digests agree.
std::string validation_set_change(const ValidationSetId& recorded, const ValidationSetId& run,
                                  const std::string& checkpoint_dir);

/// The contents of trainer_state.json.
struct TrainerStateFile {
  int64_t step = 0;             ///< optimizer steps completed
  int64_t world_size = 1;       ///< ranks that wrote the checkpoint
  int64_t nonfinite_skips = 0;  ///< steps skipped so far (train.max_nonfinite_skips)
  std::vector<data::LoaderPosition> rank_loaders;  ///< one per rank, rank order
  /// train.batch_size (samples per optimizer step, all ranks) and train.grad_accum_steps of the run that wrote it: a
  /// loader position counts batches of global_batch_size / grad_accum_steps samples. 0 in checkpoints from before
  /// they were recorded: their positions are taken as they are, as those checkpoints always resumed.
  int64_t global_batch_size = 0;
  int64_t grad_accum_steps = 0;
  /// The validation loss at this step, when a validation pass ran at it (checkpoint.keep_best ranks by it).
  std::optional<double> val_loss;
  /// The held-out set of the run that wrote it; absent in checkpoints from before it was recorded.
  std::optional<ValidationSetId> validation_set;
};

/// The JSON written to a checkpoint (also "loader": rank 0's position, as single-process checkpoints have it).
nlohmann::json to_json(const TrainerStateFile& state);

/// Reads `<checkpoint_dir>/trainer_state.json`. Throws pi0::UserError naming the file (and the field: "step must
/// be an integer >= 0 (got "two")") when it cannot be read, is not JSON, or a field is missing or out of range.
/// Older checkpoints without world_size / nonfinite_skips / rank_loaders read as 1 / 0 / [loader], without
/// global_batch_size / grad_accum_steps as 0.
TrainerStateFile read_trainer_state(const std::string& checkpoint_dir);

/// What a run is, as the loader positions of its checkpoints see it.
struct RunGeometry {
  int64_t world_size = 1;
  int64_t batches_per_epoch = 1;  ///< the loader's, e.g. 22 (batches of global_batch_size / grad_accum_steps)
  int64_t global_batch_size = 1;  ///< train.batch_size, e.g. 32
  int64_t grad_accum_steps = 1;   ///< train.grad_accum_steps
};

/// Where a run continues from a checkpoint.
struct ResumePosition {
  data::LoaderPosition loader;  ///< the rank's next batch, in this run's batches
  /// When a loader batch now holds another number of samples (train.batch_size or grad_accum_steps changed), one
  /// line saying so and where the run continues, e.g. "train.batch_size changed 4 → 8: continuing at sample 8 of
  /// epoch 0 (batch 1)"; "" otherwise.
  std::string moved;
};

/// Checks that `state` (of `checkpoint_dir`) can resume a run of `run`, and returns where `rank` continues: at the
/// checkpoint's world size its own position, at another one rank 0's (every rank's must then be equal: each rank
/// takes a fixed slice of the same global batch order). When a loader batch holds another number of samples than
/// when the checkpoint was written, the run continues at the same sample of the epoch, which must then start one of
/// its batches. UserError naming the file otherwise: positions that differ at another world size, a sample offset
/// the new batch does not reach, a position beyond this run's epoch (the dataset changed).
ResumePosition resume_position(const TrainerStateFile& state, const std::string& checkpoint_dir,
                               const RunGeometry& run, int64_t rank);

}  // namespace pi0::train
