#include "pi0/io/checkpoint_dir.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "pi0/common/check.h"
#include "pi0/common/files.h"
#include "pi0/common/fs.h"
#include "pi0/common/log_line.h"
#include "pi0/data/fast_tokenizer.h"

namespace fs = pi0::posix_fs;

namespace pi0::io {

namespace {

void fsync_path(const fs::path& p, bool directory) {
  const int fd = ::open(p.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw UserError("cannot open '" + p.string() + "' to sync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some filesystems refuse fsync on directories (EINVAL); the data files were synced, which is what matters.
  if (rc != 0 && !(directory && (err == EINVAL || err == EROFS)))
    throw UserError("cannot sync '" + p.string() + "' to disk: " + std::strerror(err));
}

void fsync_tree(const fs::path& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) fsync_path(e.path(), false);
    else if (e.is_directory()) fsync_path(e.path(), true);
  }
  fsync_path(dir, true);
}

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() < 19 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Atomic swap of two existing paths; false if the kernel or filesystem does not support it.
bool exchange(const fs::path& a, const fs::path& b) {
#if defined(RENAME_EXCHANGE)
  return ::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0;
#else
  (void)a, (void)b;
  return false;
#endif
}

void rename_or_throw(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  if (ec) throw UserError("cannot rename '" + from.string() + "' to '" + to.string() + "': " + ec.message());
}

DeletionFaultHook g_deletion_fault_hook;

void deletion_point(DeletionPoint point) {
  if (g_deletion_fault_hook) g_deletion_fault_hook(point);
}

// Deletes checkpoint `dir` so that a crash at any point leaves either the complete checkpoint or a directory that
// is recognisably ours to remove: <step>/ is first renamed (atomically) to .deleting_<step>/, which the next start
// removes (finish_interrupted_deletions). Removing COMPLETE first, as before, left a <step>/ without the marker that
// nothing would ever remove, since such a directory may be foreign.
void remove_checkpoint(const fs::path& dir) {
  const fs::path doomed = dir.parent_path() / (kDeletingPrefix + dir.filename().string());
  std::error_code ec;
  deletion_point(DeletionPoint::kBeforeRename);
  fs::remove_all(doomed, ec);  // a leftover of the same name (a removal that failed earlier in this run)
  rename_or_throw(dir, doomed);
  deletion_point(DeletionPoint::kRenamed);
  fsync_path(dir.parent_path(), true);  // the rename reaches the disk before any file goes
  deletion_point(DeletionPoint::kRenameSynced);
  // A checkpoint that is a link (to a copy kept elsewhere) loses only the link: remove_all never follows one.
  if (!fs::is_symlink(doomed)) {
    for (const auto& e : fs::directory_iterator(doomed)) {
      fs::remove_all(e.path(), ec);
      if (ec) break;
      deletion_point(DeletionPoint::kPartlyRemoved);
    }
  }
  if (!ec) fs::remove_all(doomed, ec);
  if (ec) throw UserError("cannot delete checkpoint '" + doomed.string() + "': " + ec.message());
}

}  // namespace

std::string checkpoints_dir(const std::string& run_dir) { return (fs::path(run_dir) / "checkpoints").string(); }

std::string begin_checkpoint(const std::string& run_dir, int64_t step) {
  PI0_CHECK(step >= 0, "begin_checkpoint: step must be >= 0, got ", step);
  const fs::path tmp =
      fs::path(checkpoints_dir(run_dir)) / (".tmp_" + std::to_string(step) + "_" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(tmp, ec);
  create_directories_or_throw(tmp.string(), "checkpoint directory");
  return tmp.string();
}

std::string commit_checkpoint(const std::string& tmp_dir, const std::string& run_dir, int64_t step) {
  const fs::path tmp(tmp_dir), parent(checkpoints_dir(run_dir));
  const fs::path final_dir = parent / std::to_string(step);
  PI0_CHECK(fs::is_directory(tmp), "commit_checkpoint: '", tmp_dir, "' is not a directory");
  fsync_tree(tmp);
  write_file_atomic((tmp / kCompleteMarker).string(), "step " + std::to_string(step) + "\n");
  fsync_path(tmp, true);

  if (!fs::exists(final_dir)) {
    rename_or_throw(tmp, final_dir);
  } else if (exchange(tmp, final_dir)) {
    fs::remove_all(tmp);  // now holds the replaced checkpoint
  } else {
    const fs::path old = parent / (".old_" + std::to_string(step) + "_" + std::to_string(::getpid()));
    fs::remove_all(old);
    rename_or_throw(final_dir, old);
    rename_or_throw(tmp, final_dir);
    fs::remove_all(old);
  }
  fsync_path(parent, true);
  return final_dir.string();
}

std::vector<int64_t> complete_checkpoints(const std::string& run_dir) {
  std::vector<int64_t> steps;
  const fs::path dir(checkpoints_dir(run_dir));
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return steps;
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto name = e.path().filename().string();
    if (!all_digits(name)) continue;
    // A checkpoint that cannot even be looked at (a symlink loop, a directory without read or search permission)
    // is skipped with a warning, so --resume and pi0-export fall back to an older one instead of stopping.
    if (const auto why = unreadable_checkpoint(e.path().string()); !why.empty()) {
      // Said once per checkpoint: complete_checkpoints() runs again after every save.
      warn_once("unreadable checkpoint " + e.path().string(),
                "checkpoint " + e.path().string() + " cannot be read (" + why + ") and is skipped (left untouched)");
      continue;
    }
    std::error_code ec_unused;  // unreadable_checkpoint() just looked: it is a directory, or nothing
    if (fs::is_regular_file(e.path() / kCompleteMarker, ec_unused)) steps.push_back(std::stoll(name));
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::string unreadable_checkpoint(const std::string& dir) {
  std::error_code dir_ec, marker_ec;
  if (fs::is_directory(dir, dir_ec)) fs::is_regular_file(fs::path(dir) / kCompleteMarker, marker_ec);
  if (marker_ec == std::errc::no_such_file_or_directory) marker_ec.clear();  // no marker: incomplete, not unreadable
  if (!dir_ec && !marker_ec) return "";
  return errno_reason((dir_ec ? dir_ec : marker_ec).value());
}

std::optional<std::pair<int64_t, std::string>> newest_complete_checkpoint(const std::string& run_dir) {
  const auto steps = complete_checkpoints(run_dir);
  if (steps.empty()) return std::nullopt;
  return std::make_pair(steps.back(), (fs::path(checkpoints_dir(run_dir)) / std::to_string(steps.back())).string());
}

std::vector<int64_t> prune_checkpoints(const std::string& run_dir, int64_t keep_last, int64_t keep_period,
                                       const std::set<int64_t>& bad, const std::set<int64_t>& verified,
                                       const std::set<int64_t>& keep) {
  PI0_CHECK(keep_last >= 0, "prune_checkpoints: keep_last must be >= 0, got ", keep_last);
  std::vector<int64_t> steps;
  for (const int64_t step : complete_checkpoints(run_dir))
    if (!bad.count(step)) steps.push_back(step);
  std::optional<int64_t> newest_verified;
  for (const int64_t step : steps)
    if (verified.count(step)) newest_verified = step;
  std::vector<int64_t> deleted;
  const int64_t n = static_cast<int64_t>(steps.size());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t step = steps[i];
    const bool newest = i == n - 1;
    const bool recent = i >= n - keep_last;
    const bool periodic = keep_period > 0 && step % keep_period == 0;
    if (newest || recent || periodic || step == newest_verified || keep.count(step)) continue;
    remove_checkpoint(fs::path(checkpoints_dir(run_dir)) / std::to_string(step));
    deleted.push_back(step);
  }
  return deleted;
}

std::string checkpoint_path(const std::string& run_dir, int64_t step) {
  return (fs::path(checkpoints_dir(run_dir)) / std::to_string(step)).string();
}

std::string set_aside_checkpoint(const std::string& run_dir, int64_t step) {
  const fs::path from(checkpoint_path(run_dir, step));
  fs::path to = from.string() + ".unverified";
  for (int i = 1; fs::exists(to); ++i) to = from.string() + ".unverified_" + std::to_string(i);
  rename_or_throw(from, to);
  fsync_path(from.parent_path(), true);
  return to.string();
}

std::vector<std::string> finish_interrupted_deletions(const std::string& run_dir) {
  std::vector<std::string> removed;
  const fs::path dir(checkpoints_dir(run_dir));
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return removed;
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto name = e.path().filename().string();
    // Only what remove_checkpoint renamed: .deleting_ followed by a step number.
    if (name.rfind(kDeletingPrefix, 0) == 0 && all_digits(name.substr(std::strlen(kDeletingPrefix))))
      removed.push_back(name);
  }
  std::sort(removed.begin(), removed.end());
  for (const auto& name : removed) {
    fs::remove_all(dir / name, ec);
    if (ec) throw UserError("cannot delete '" + (dir / name).string() + "' (a checkpoint whose deletion was "
                            "interrupted): " + ec.message());
  }
  return removed;
}

void set_deletion_fault_hook(DeletionFaultHook hook) { g_deletion_fault_hook = std::move(hook); }

std::vector<std::string> remove_stale_temp_checkpoints(const std::string& run_dir) {
  std::vector<std::string> removed;
  const fs::path dir(checkpoints_dir(run_dir));
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return removed;
  const std::string own_suffix = "_" + std::to_string(::getpid());
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto name = e.path().filename().string();
    const bool temp = name.rfind(".tmp_", 0) == 0 || name.rfind(".old_", 0) == 0;
    const bool own = name.size() > own_suffix.size() &&
                     name.compare(name.size() - own_suffix.size(), own_suffix.size(), own_suffix) == 0;
    std::error_code type_ec;  // asked last: a symlink loop among the checkpoints must not stop the run
    if (temp && !own && e.is_directory(type_ec)) removed.push_back(name);
  }
  for (const auto& name : removed) fs::remove_all(dir / name, ec);
  return removed;
}

void copy_fast_tokenizer(const std::string& from, const std::string& to, const std::string& what) {
  create_directories_or_throw(to, what);
  const auto& names = data::FastTokenizer::file_names();
  for (size_t i = 0; i < names.size(); ++i) {
    const fs::path src = fs::path(from) / names[i];
    if (!fs::exists(src)) {
      if (i < 2)  // processor_config.json and tokenizer.json are required, tokenizer_config.json is not
        throw UserError(what + ": " + src.string() + " is missing, expected a FAST tokenizer folder (docs/fast.md)");
      continue;
    }
    fs::copy_file(src, fs::path(to) / names[i], fs::copy_options::overwrite_existing);
  }
}

}  // namespace pi0::io
