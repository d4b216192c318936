// File-system operations over POSIX calls, named like their std::filesystem counterparts so a file switches with
// one line: `namespace fs = pi0::posix_fs;` (fs::path stays std::filesystem::path).
//
// Why not std::filesystem: pip's LibTorch 2.x (libtorch.so, libtorch_cpu.so, libc10.so) exports its own copies of
// the std::filesystem operations. Whenever it precedes libstdc++ in a process's symbol lookup order, our calls bind
// to those copies, and on the GPU machine std::filesystem::remove_all bound there jumped through a null pointer
// (issue 22). Link order is not ours to guarantee on every machine, so the operations we need are here; the ctest
// `std_symbol_bindings` (scripts/check_std_bindings.sh) fails if any binary of ours binds a std:: symbol to LibTorch.
//
// Semantics follow std::filesystem where the project relies on them, with these deliberate differences:
// - remove_all never follows a symbolic link, not even at the top: a link is removed, never what it points to
//   (rotating a symlinked checkpoint must not delete files in its target, issue 23).
// - Errors are std::system_error (what(): "<operation> '<path>': <reason>"), not std::filesystem::filesystem_error,
//   whose constructor LibTorch exports too. app::run_app maps them like filesystem_error.
// - Directory listings are sorted by name (deterministic), and recursive listings do not enter linked directories.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace pi0::posix_fs {

using path = std::filesystem::path;
using copy_options = std::filesystem::copy_options;

// Throwing forms throw std::system_error; error_code forms clear `ec` on success and set it (errno) on failure.
bool exists(const path& p);  ///< stat() succeeds (follows links); false if missing, throws on other errors
bool exists(const path& p, std::error_code& ec);
bool is_directory(const path& p);  ///< follows links; false if missing
bool is_directory(const path& p, std::error_code& ec);
bool is_regular_file(const path& p);  ///< follows links; false if missing
bool is_regular_file(const path& p, std::error_code& ec);
bool is_symlink(const path& p);  ///< the path itself is a link (lstat)
uint64_t file_size(const path& p);  ///< of a regular file (follows links)
uint64_t file_size(const path& p, std::error_code& ec);  ///< static_cast<uint64_t>(-1) on error, as std
bool is_empty(const path& p);  ///< a directory without entries or a file of size 0

/// mkdir -p: true if it created the last component; an existing directory is fine, an existing non-directory
/// anywhere on the way is an error (ENOTDIR / EEXIST).
bool create_directories(const path& p);
bool create_directories(const path& p, std::error_code& ec);

/// Removes a file, a link (not its target) or an empty directory; false if nothing was there.
bool remove(const path& p);
bool remove(const path& p, std::error_code& ec);
/// Removes `p` and, if it is a real directory, everything below it, never following a link (a link is removed as a
/// link). Returns the number of entries removed (0 if `p` did not exist); static_cast<uint64_t>(-1) on error.
uint64_t remove_all(const path& p);
uint64_t remove_all(const path& p, std::error_code& ec);

/// rename(2): atomic within one filesystem; replaces an existing file or empty directory at `to`.
void rename(const path& from, const path& to);
void rename(const path& from, const path& to, std::error_code& ec);

/// Copies a regular file's bytes and permission bits. Without copy_options::overwrite_existing an existing `to` is
/// an error (EEXIST); with it, `to` is replaced (if it is a regular file). Returns true if copied.
bool copy_file(const path& from, const path& to, copy_options options = copy_options::none);
bool copy_file(const path& from, const path& to, copy_options options, std::error_code& ec);
bool copy_file(const path& from, const path& to, std::error_code& ec);

/// `p` made absolute against the current directory (no link resolution, no normalisation), like std.
path absolute(const path& p);
path absolute(const path& p, std::error_code& ec);
/// realpath(3): absolute, links resolved; the path must exist.
path canonical(const path& p);
path canonical(const path& p, std::error_code& ec);
/// $TMPDIR if it names a directory, else /tmp.
path temp_directory_path();

/// One entry of a listing. is_directory/is_regular_file follow links (like std::filesystem::directory_entry).
class directory_entry {
 public:
  directory_entry() = default;
  explicit directory_entry(std::filesystem::path p) : path_(std::move(p)) {}
  const std::filesystem::path& path() const { return path_; }
  bool is_directory() const { return posix_fs::is_directory(path_); }
  bool is_directory(std::error_code& ec) const { return posix_fs::is_directory(path_, ec); }
  bool is_regular_file() const { return posix_fs::is_regular_file(path_); }
  bool is_regular_file(std::error_code& ec) const { return posix_fs::is_regular_file(path_, ec); }
  bool is_symlink() const { return posix_fs::is_symlink(path_); }
  uint64_t file_size() const { return posix_fs::file_size(path_); }

 private:
  std::filesystem::path path_;
};

/// The entries of one directory (not "." and ".."), sorted by name, read when constructed: range-for over it as over
/// std::filesystem::directory_iterator. Throws (or sets ec and is empty) if `dir` cannot be listed.
class directory_iterator {
 public:
  explicit directory_iterator(const path& dir);
  directory_iterator(const path& dir, std::error_code& ec);
  std::vector<directory_entry>::const_iterator begin() const { return entries_.begin(); }
  std::vector<directory_entry>::const_iterator end() const { return entries_.end(); }

 private:
  std::vector<directory_entry> entries_;
};

/// Everything below `dir`, depth first, each directory before its contents, siblings sorted by name; linked
/// directories are listed but not entered.
class recursive_directory_iterator {
 public:
  explicit recursive_directory_iterator(const path& dir);
  recursive_directory_iterator(const path& dir, std::error_code& ec);
  std::vector<directory_entry>::const_iterator begin() const { return entries_.begin(); }
  std::vector<directory_entry>::const_iterator end() const { return entries_.end(); }

 private:
  std::vector<directory_entry> entries_;
};

}  // namespace pi0::posix_fs
