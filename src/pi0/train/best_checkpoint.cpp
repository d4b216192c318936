// best_checkpoint.h: a run directory's best checkpoint by checkpoint.keep_best's own ranking.
#include "pi0/train/best_checkpoint.h"

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include <spdlog/spdlog.h>

#include "pi0/common/check.h"
#include "pi0/common/fs.h"
#include "pi0/config/config.h"
#include "pi0/io/checkpoint_dir.h"
#include "pi0/train/checkpointer.h"
#include "pi0/train/trainer_state.h"

namespace pi0::train {

namespace fs = pi0::posix_fs;

std::vector<BestCheckpoint> best_checkpoints(const std::string& run_dir, const std::string& flag) {
  std::error_code ec;
  if (fs::exists(fs::path(run_dir) / io::kCompleteMarker, ec)) {
    throw UserError(flag + ": '" + run_dir + "' is one checkpoint; " + flag + " picks among a run directory's "
                    "checkpoints, so pass the run directory (or this checkpoint without " + flag + ")");
  }
  const auto steps = io::complete_checkpoints(run_dir);
  if (steps.empty()) {
    throw UserError(flag + ": '" + run_dir + "' is not a run directory with complete checkpoints (none in " +
                    io::checkpoints_dir(run_dir) + ")");
  }
  // The run as its newest readable checkpoint describes it: its config (checkpoint.keep_best) and held-out set, the
  // ones keep_best ranked by when it was written. run_dir is where the run is now, whatever its config says.
  std::optional<config::Config> cfg;
  std::optional<ValidationSetId> set;
  std::string newest;
  for (auto it = steps.rbegin(); it != steps.rend() && !cfg; ++it) {
    const auto dir = io::checkpoint_path(run_dir, *it);
    try {
      auto c = config::load_config((fs::path(dir) / io::kConfigYamlFile).string());
      set = read_trainer_state(dir).validation_set;
      cfg = std::move(c);
      newest = dir;
    } catch (const UserError& e) {
      spdlog::warn("{}: checkpoint {} cannot be read and is skipped: {}", flag, dir, e.what());
    }
  }
  if (!cfg) {
    throw UserError(flag + ": no checkpoint of '" + run_dir + "' has a readable config.yaml and trainer_state.json " +
                    "(each is named in a warning above)");
  }
  if (cfg->checkpoint.keep_best <= 0) {
    throw UserError(flag + ": run '" + run_dir + "' was trained without checkpoint.keep_best (" +
                    (config::validation_enabled(*cfg) ? "" : "and without a validation split; ") + newest +
                    "/config.yaml has keep_best 0), so no checkpoint was kept for its val_loss; drop " + flag +
                    " to use the newest, or train with data.validation_split and checkpoint.keep_best: 1");
  }
  cfg->checkpoint.run_dir = run_dir;
  Checkpointer ranker(*cfg, /*rank=*/0, /*world_size=*/1, nullptr);
  if (set) ranker.set_validation_set(*set, /*accept_change=*/false);
  std::vector<BestCheckpoint> out;
  for (const auto& r : ranker.rank_by_val_loss()) out.push_back({io::checkpoint_path(run_dir, r.step), r.step, r.val_loss});
  if (out.empty()) {
    throw UserError(flag + ": no checkpoint of '" + run_dir + "' that verifies records a val_loss of the held-out "
                    "set of " + newest + " (a checkpoint records one when a validation pass ran at its step)");
  }
  return out;
}

io::ExportReport export_best(const std::string& run_dir, const std::string& out_dir, const io::ExportOptions& options,
                             const std::string& flag) {
  const auto ranked = best_checkpoints(run_dir, flag);
  std::string best_rejection;
  for (size_t i = 0; i < ranked.size(); ++i) {
    const auto& b = ranked[i];
    if (i == 0) spdlog::info("{}: the best checkpoint of {} is step {} (val_loss {:.6g}), {}", flag, run_dir, b.step,
                             b.val_loss, b.dir);
    else spdlog::warn("{}: falling back to the next best, step {} (val_loss {:.6g}), {}", flag, b.step, b.val_loss, b.dir);
    try {
      return io::export_bundle(b.dir, out_dir, options);
    } catch (const io::CheckpointRejected& e) {
      if (best_rejection.empty()) best_rejection = e.what();
      spdlog::warn("checkpoint {} does not verify and is skipped (left untouched): {}", b.dir, e.what());
    }
  }
  throw UserError(flag + ": none of the " + std::to_string(ranked.size()) + " ranked checkpoints of '" + run_dir +
                  "' verifies (best: " + best_rejection + "; the others are named in warnings above)");
}

io::ExportReport export_to_temp(const std::string& path, bool best, const io::ExportOptions& options) {
  std::string dir = (fs::temp_directory_path() / "pi0-bundle-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) {
    throw UserError(dir + ": cannot create a temporary bundle directory (" + std::strerror(errno) +
                    "); set TMPDIR to a writable directory with room for the bundle");
  }
  try {
    return best ? export_best(path, dir, options) : io::export_run(path, dir, options);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(dir, ec);
    throw;
  }
}

}  // namespace pi0::train
