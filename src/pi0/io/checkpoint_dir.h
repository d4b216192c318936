// Crash-safe checkpoint directories inside a run directory:
//   run_dir/checkpoints/.tmp_<step>_<pid>/   being written (ignored by everything else)
//   run_dir/checkpoints/<step>/COMPLETE      a finished checkpoint; COMPLETE is written (and fsynced) last
//   run_dir/checkpoints/.deleting_<step>/    being deleted by rotation (renamed first; the next start finishes it)
// A checkpoint becomes visible only through a rename after all its files are on disk, so a crash at any point
// leaves the previous complete checkpoint usable (the llm.c "DONE marker" scheme, plus an atomic rename).
// This file handles directories only; what goes inside (model, optimizer, EMA, metadata) is the trainer's
// Checkpointer's (train/checkpointer.h); the file names are in checkpoint_files.h.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "pi0/io/checkpoint_files.h"

namespace pi0::io {

/// run_dir/checkpoints
std::string checkpoints_dir(const std::string& run_dir);

/// Creates (empty) and returns run_dir/checkpoints/.tmp_<step>_<pid>/; a leftover with the same name is removed.
std::string begin_checkpoint(const std::string& run_dir, int64_t step);

/// fsyncs every file and directory under `tmp_dir`, writes COMPLETE last, then renames the directory to
/// run_dir/checkpoints/<step>/ and fsyncs the parent. An existing <step>/ is replaced atomically where the
/// filesystem supports renameat2(RENAME_EXCHANGE); otherwise the old one is moved aside first (a crash in that
/// window can lose only that same-step checkpoint, never an older one). Returns the final path.
std::string commit_checkpoint(const std::string& tmp_dir, const std::string& run_dir, int64_t step);

/// Steps of all complete checkpoints (numeric directory with COMPLETE), ascending. One that cannot be looked at
/// (unreadable_checkpoint) is left out, with a warning naming it and why.
std::vector<int64_t> complete_checkpoints(const std::string& run_dir);

/// Why checkpoint directory `dir` cannot be looked at (a symlink loop, no read or search permission), e.g.
/// "permission denied"; "" when it can, or when nothing is there.
std::string unreadable_checkpoint(const std::string& dir);

/// (step, path) of the newest complete checkpoint, ignoring temporary and incomplete directories.
std::optional<std::pair<int64_t, std::string>> newest_complete_checkpoint(const std::string& run_dir);

/// Deletes complete checkpoints except the newest `keep_last` and those with step % keep_period == 0
/// (keep_period <= 0: none kept for that reason); the newest complete one is always kept. Steps in `bad` (found
/// not to verify) are neither deleted nor counted, and the newest step in `verified` is always kept, so rotation
/// never leaves only checkpoints that fail verification. Incomplete numeric directories are left alone (they may be
/// foreign). Each deletion first renames <step>/ to .deleting_<step>/ (atomic), so a crash mid-delete leaves either
/// the whole checkpoint or a directory finish_interrupted_deletions() removes. Steps in `keep` (checkpoint.keep_best's)
/// are kept too. Returns the deleted steps.
std::vector<int64_t> prune_checkpoints(const std::string& run_dir, int64_t keep_last, int64_t keep_period,
                                       const std::set<int64_t>& bad = {}, const std::set<int64_t>& verified = {},
                                       const std::set<int64_t>& keep = {});

/// run_dir/checkpoints/<step>
std::string checkpoint_path(const std::string& run_dir, int64_t step);

/// Moves the checkpoint <step>/ (found not to verify, or unreadable) out of the way before a new checkpoint of the same
/// step is committed, so it is never overwritten: renamed to <step>.unverified (or .unverified_<n>), which no
/// resume, prune or temp clean-up touches. Returns the new path.
std::string set_aside_checkpoint(const std::string& run_dir, int64_t step);

/// Removes the .deleting_<step> directories of deletions a crash interrupted (prune_checkpoints). Returns their
/// names, sorted. Nothing else is touched: a numeric directory without COMPLETE may be foreign and stays.
std::vector<std::string> finish_interrupted_deletions(const std::string& run_dir);

/// Test-only: the points of a checkpoint deletion at which tests make the process die (a kill -9 there).
enum class DeletionPoint {
  kBeforeRename,   ///< nothing changed yet
  kRenamed,        ///< <step>/ is .deleting_<step>/, the rename maybe not yet on disk
  kRenameSynced,   ///< the rename is on disk, no file removed
  kPartlyRemoved,  ///< after each entry of the checkpoint removed
};
using DeletionFaultHook = std::function<void(DeletionPoint)>;
/// Test-only: `hook` is called at every DeletionPoint (an empty hook: none, the default).
void set_deletion_fault_hook(DeletionFaultHook hook);

/// Removes .tmp_* directories left by crashed writers (any pid other than this process). Returns their names.
std::vector<std::string> remove_stale_temp_checkpoints(const std::string& run_dir);

/// Copies the FAST tokenizer folder `from` (the files of data::FastTokenizer::file_names() it holds) into `to`,
/// created if absent. UserError naming `what` (the config key or the checkpoint) when a required file is missing.
void copy_fast_tokenizer(const std::string& from, const std::string& to, const std::string& what);

}  // namespace pi0::io
