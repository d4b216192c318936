// The one place that decides whether a path may be read as an input file or written as an output file. Every
// reader (configs, tokenizers, datasets, norm stats, weights, checkpoint files) and every writer (actions, weights,
// checkpoints, bundles, norm stats, plots, metrics) goes through it, so a FIFO, a device or a directory given as a
// file is refused with the true reason instead of hanging, reading /dev/zero forever, or being renamed over.
#pragma once
#include <string>
#include <string_view>
#include <sys/types.h>

namespace pi0 {

/// "a directory", "a FIFO (named pipe)", "a character device", ... for a stat() mode.
std::string file_type_name(mode_t mode);

/// The reason an open/stat error code gives, in words that fit a one-line message: "file not found", "permission
/// denied", "too many levels of symbolic links (a symlink loop?)", else strerror() in lower case.
std::string errno_reason(int err);

/// Why `path` cannot be read as an input file, or "" when it is a regular file this process may open for reading.
/// Never blocks and never opens anything but a regular file: a FIFO or a device is refused from its stat().
std::string input_file_problem(const std::string& path);

/// Throws UserError "<what> '<path>': <problem>; expected <expected>" (without "<what> '...'" when `what` is
/// empty: "<path>: <problem>...") when input_file_problem(path) is not empty.
void require_input_file(const std::string& path, const std::string& what = "", const std::string& expected = "");

/// Throws UserError "<path>: exists and is <type>, not a regular file; refusing to write over it ..." when `path`
/// exists (following symlinks) and is not a regular file: a write through a temporary file and a rename would
/// otherwise replace a device, a FIFO or a socket (even /dev/null when run as root), and a direct write would
/// block on a FIFO or fill a device. A missing path or a regular file passes.
void require_output_file(const std::string& path);

/// Writes `bytes` to `path` through `path.tmp`, fsync and rename, so readers see the old file or the new one,
/// never half of it; require_output_file() is checked for both names first, and the folder is created first
/// (create_parent_directories). UserError naming the file on failure.
void write_file_atomic(const std::string& path, std::string_view bytes);

/// Creates `dir` and its missing parents; UserError "<what> '<dir>': cannot create directories (<reason>)" naming
/// the first component that could not be created and why (a file in the way, permission denied, read-only).
void create_directories_or_throw(const std::string& dir, const std::string& what);

/// For a message about a path that was not found: "" for an absolute path, else " (relative paths are resolved from
/// the working directory '<cwd>'<extra>)", since a config's relative paths are read from where the app runs, not
/// from the config file's folder, and the user rarely has the working directory in mind (issue 49).
std::string relative_path_note(const std::string& path, const std::string& extra = ", not from the config file's folder");

/// Creates the folder `path` is to be written into, and its missing parents, so every output path a user names
/// (`pi0-norm-stats` into the shipped configs' `assets/<id>/norm_stats.json`, `pi0-plot --out plots/x.png`) works
/// without a mkdir first. UserError "<path>: cannot create its folder '<dir>' ('<component>' is a regular file)"
/// naming the file the user gave (never a temporary) and the component that could not be made.
void create_parent_directories(const std::string& path);

}  // namespace pi0
