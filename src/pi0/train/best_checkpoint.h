// The best checkpoint of a run directory, as checkpoint.keep_best ranks it (Checkpointer::rank_by_val_loss): what
// pi0-export --best exports and pi0-serve --best serves, so "best so far: step N" in the training log, the checkpoint
// rotation keeps and the one exported are the same one.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "pi0/io/bundle.h"

namespace pi0::train {

/// One complete checkpoint of a run directory, ranked by the val_loss its trainer_state.json records.
struct BestCheckpoint {
  std::string dir;  ///< run_dir/checkpoints/<step>
  int64_t step = 0;
  double val_loss = 0.0;
};

/// keep_best's ranking of `run_dir`'s checkpoints, best first (never empty), with the run's config and held-out set
/// read from its newest readable checkpoint (checkpoints of an earlier held-out set, before --new-validation-set,
/// are not ranked; those whose trainer_state.json does not verify are warned about and left out). Throws
/// pi0::UserError in one line naming `flag` and what is missing: `run_dir` is one checkpoint rather than a run
/// directory, holds no complete checkpoint, was trained without checkpoint.keep_best (or without a validation
/// split), or no checkpoint that verifies records a val_loss.
std::vector<BestCheckpoint> best_checkpoints(const std::string& run_dir, const std::string& flag);

/// pi0-export --checkpoint RUN_DIR --best: exports the best of best_checkpoints() whose contents verify (one that
/// does not is skipped with a warning naming it, as export_run skips a newest one that does not); UserError naming
/// `flag` when none does.
io::ExportReport export_best(const std::string& run_dir, const std::string& out_dir, const io::ExportOptions& options,
                             const std::string& flag = "--best");

/// pi0-serve --checkpoint: `checkpoint_or_run_dir` exported as pi0-export does (with `best`, export_best; else
/// io::export_run: one checkpoint, or a run directory's newest) into a new directory under $TMPDIR (else /tmp), the
/// report's out_dir; the caller loads it and removes it.
io::ExportReport export_to_temp(const std::string& checkpoint_or_run_dir, bool best, const io::ExportOptions& options);

}  // namespace pi0::train
