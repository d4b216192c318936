#include "pi0/common/fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <memory>

namespace pi0::posix_fs {

namespace {

std::error_code errno_code(int e = errno) { return std::error_code(e, std::generic_category()); }

[[noreturn]] void fail(const char* op, const path& p, const std::error_code& ec) {
  throw std::system_error(ec, std::string(op) + " '" + p.string() + "'");
}
[[noreturn]] void fail2(const char* op, const path& a, const path& b, const std::error_code& ec) {
  throw std::system_error(ec, std::string(op) + " '" + a.string() + "' to '" + b.string() + "'");
}

// stat/lstat: 1 found, 0 missing (ENOENT/ENOTDIR), -1 other error (ec set).
int stat_of(const path& p, struct stat& st, bool follow, std::error_code& ec) {
  ec.clear();
  if ((follow ? ::stat(p.c_str(), &st) : ::lstat(p.c_str(), &st)) == 0) return 1;
  if (errno == ENOENT || errno == ENOTDIR) return 0;
  ec = errno_code();
  return -1;
}

struct DirCloser {
  void operator()(DIR* d) const { ::closedir(d); }
};

// Names in an open directory (not . and ..), sorted. Takes ownership of fd.
std::vector<std::string> names_in(int fd, std::error_code& ec) {
  std::vector<std::string> names;
  std::unique_ptr<DIR, DirCloser> d(::fdopendir(fd));
  if (!d) {
    ec = errno_code();
    ::close(fd);
    return names;
  }
  errno = 0;
  while (const dirent* e = ::readdir(d.get())) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
    errno = 0;
  }
  if (errno != 0) ec = errno_code();
  std::sort(names.begin(), names.end());
  return names;
}

// Removes the entry `name` in directory `dirfd` without following links; counts what it removes.
bool remove_at(int dirfd, const std::string& name, uint64_t& count, std::error_code& ec) {
  struct stat st {};
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return true;
    ec = errno_code();
    return false;
  }
  if (S_ISDIR(st.st_mode)) {
    // O_NOFOLLOW: if the entry was swapped for a link since fstatat, opening fails instead of entering the target.
    const int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      ec = errno_code();
      return false;
    }
    const int keep = ::dup(fd);  // names_in's closedir closes fd; the children are removed relative to this copy
    if (keep < 0) {
      ec = errno_code();
      ::close(fd);
      return false;
    }
    const auto names = names_in(fd, ec);
    bool ok = !ec;
    for (size_t i = 0; ok && i < names.size(); ++i) ok = remove_at(keep, names[i], count, ec);
    ::close(keep);
    if (!ok) return false;
    if (::unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) != 0) {
      ec = errno_code();
      return false;
    }
  } else if (::unlinkat(dirfd, name.c_str(), 0) != 0) {
    if (errno == ENOENT) return true;
    ec = errno_code();
    return false;
  }
  ++count;
  return true;
}

void list_into(const path& dir, bool recursive, std::vector<directory_entry>& out, std::error_code& ec) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    ec = errno_code();
    return;
  }
  const auto names = names_in(fd, ec);
  if (ec) return;
  for (const auto& n : names) {
    directory_entry e(dir / n);
    out.push_back(e);
    if (recursive && !e.is_symlink() && e.is_directory()) {
      list_into(e.path(), true, out, ec);
      if (ec) return;
    }
  }
}

}  // namespace

bool exists(const path& p, std::error_code& ec) {
  struct stat st {};
  return stat_of(p, st, true, ec) == 1;
}
bool exists(const path& p) {
  std::error_code ec;
  const bool r = posix_fs::exists(p, ec);
  if (ec) fail("cannot check", p, ec);
  return r;
}

bool is_directory(const path& p, std::error_code& ec) {
  struct stat st {};
  return stat_of(p, st, true, ec) == 1 && S_ISDIR(st.st_mode);
}
bool is_directory(const path& p) {
  std::error_code ec;
  const bool r = posix_fs::is_directory(p, ec);
  if (ec) fail("cannot check", p, ec);
  return r;
}

bool is_regular_file(const path& p, std::error_code& ec) {
  struct stat st {};
  return stat_of(p, st, true, ec) == 1 && S_ISREG(st.st_mode);
}
bool is_regular_file(const path& p) {
  std::error_code ec;
  const bool r = posix_fs::is_regular_file(p, ec);
  if (ec) fail("cannot check", p, ec);
  return r;
}

bool is_symlink(const path& p) {
  struct stat st {};
  std::error_code ec;
  const int r = stat_of(p, st, false, ec);
  if (r < 0) fail("cannot check", p, ec);
  return r == 1 && S_ISLNK(st.st_mode);
}

uint64_t file_size(const path& p, std::error_code& ec) {
  struct stat st {};
  const int r = stat_of(p, st, true, ec);
  if (r == 0) ec = errno_code(ENOENT);
  else if (r == 1 && S_ISDIR(st.st_mode)) ec = errno_code(EISDIR);
  else if (r == 1 && !S_ISREG(st.st_mode)) ec = errno_code(ENOTSUP);
  return ec ? static_cast<uint64_t>(-1) : static_cast<uint64_t>(st.st_size);
}
uint64_t file_size(const path& p) {
  std::error_code ec;
  const uint64_t r = posix_fs::file_size(p, ec);
  if (ec) fail("cannot get the size of", p, ec);
  return r;
}

bool is_empty(const path& p) {
  if (posix_fs::is_directory(p)) return directory_iterator(p).begin() == directory_iterator(p).end();
  return posix_fs::file_size(p) == 0;
}

namespace {
// `top`: p is the path asked for (an existing non-directory there is EEXIST), else one of its parents (ENOTDIR).
bool make_dirs(const path& p, bool top, std::error_code& ec) {
  struct stat st {};
  if (::stat(p.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) ec = errno_code(top ? EEXIST : ENOTDIR);
    return false;
  }
  const path parent = p.parent_path();
  // "a/b/" has parent "a/b": strip trailing separators before recursing.
  if (!p.has_filename() && !parent.empty() && parent != p) return make_dirs(parent, top, ec);
  if (!parent.empty() && parent != p) {
    make_dirs(parent, false, ec);
    if (ec) return false;
  }
  if (::mkdir(p.c_str(), 0777) != 0) {
    if (errno == EEXIST && ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return false;  // made concurrently
    ec = errno_code();
    return false;
  }
  return true;
}
}  // namespace

bool create_directories(const path& p, std::error_code& ec) {
  ec.clear();
  return !p.empty() && make_dirs(p, true, ec);
}
bool create_directories(const path& p) {
  std::error_code ec;
  const bool r = posix_fs::create_directories(p, ec);
  if (ec) fail("cannot create directories", p, ec);
  return r;
}

bool remove(const path& p, std::error_code& ec) {
  ec.clear();
  struct stat st {};
  const int r = stat_of(p, st, false, ec);
  if (r <= 0) return false;
  if ((S_ISDIR(st.st_mode) ? ::rmdir(p.c_str()) : ::unlink(p.c_str())) != 0) {
    if (errno == ENOENT) return false;
    ec = errno_code();
    return false;
  }
  return true;
}
bool remove(const path& p) {
  std::error_code ec;
  const bool r = posix_fs::remove(p, ec);
  if (ec) fail("cannot remove", p, ec);
  return r;
}

uint64_t remove_all(const path& p, std::error_code& ec) {
  ec.clear();
  if (p.empty()) return 0;
  // The last component is removed relative to its parent, so a link at the top is itself not followed.
  // "x/" names x itself (a link in it is removed as a link, unlike POSIX path resolution would have it).
  path q = p;
  while (q.filename().empty() && q.has_relative_path()) q = q.parent_path();
  path parent = q.parent_path();
  path name = q.filename();
  if (name.empty() || name == "." || name == "..") {  // "/", "dir/.", "..": the directory it resolves to
    std::error_code cec;
    const path abs = posix_fs::canonical(p, cec);
    if (cec) {
      if (cec == std::errc::no_such_file_or_directory) return 0;
      ec = cec;
      return static_cast<uint64_t>(-1);
    }
    parent = abs.parent_path();
    name = abs.filename();
  }
  const int dirfd = ::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirfd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return 0;
    ec = errno_code();
    return static_cast<uint64_t>(-1);
  }
  uint64_t count = 0;
  const bool ok = remove_at(dirfd, name.string(), count, ec);
  ::close(dirfd);
  return ok ? count : static_cast<uint64_t>(-1);
}
uint64_t remove_all(const path& p) {
  std::error_code ec;
  const uint64_t r = posix_fs::remove_all(p, ec);
  if (ec) fail("cannot remove", p, ec);
  return r;
}

void rename(const path& from, const path& to, std::error_code& ec) {
  ec.clear();
  if (::rename(from.c_str(), to.c_str()) != 0) ec = errno_code();
}
void rename(const path& from, const path& to) {
  std::error_code ec;
  posix_fs::rename(from, to, ec);
  if (ec) fail2("cannot rename", from, to, ec);
}

bool copy_file(const path& from, const path& to, copy_options options, std::error_code& ec) {
  ec.clear();
  const int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) {
    ec = errno_code();
    return false;
  }
  struct stat st {};
  if (::fstat(in, &st) != 0 || !S_ISREG(st.st_mode)) {
    ec = errno_code(S_ISDIR(st.st_mode) ? EISDIR : (errno ? errno : ENOTSUP));
    ::close(in);
    return false;
  }
  const bool overwrite = (options & copy_options::overwrite_existing) != copy_options::none;
  struct stat dst {};
  if (::stat(to.c_str(), &dst) == 0) {
    if (!overwrite || !S_ISREG(dst.st_mode)) {
      ec = errno_code(EEXIST);
      ::close(in);
      return false;
    }
  }
  const int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | (overwrite ? 0 : O_EXCL),
                         st.st_mode & 07777);
  if (out < 0) {
    ec = errno_code();
    ::close(in);
    return false;
  }
  std::vector<char> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(in, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ec = errno_code();
      break;
    }
    if (n == 0) break;
    for (ssize_t done = 0; done < n;) {
      const ssize_t w = ::write(out, buf.data() + done, static_cast<size_t>(n - done));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        ec = errno_code();
        break;
      }
      done += w;
    }
    if (ec) break;
  }
  if (::close(out) != 0 && !ec) ec = errno_code();
  ::close(in);
  return !ec;
}
bool copy_file(const path& from, const path& to, std::error_code& ec) {
  return posix_fs::copy_file(from, to, copy_options::none, ec);
}
bool copy_file(const path& from, const path& to, copy_options options) {
  std::error_code ec;
  const bool r = posix_fs::copy_file(from, to, options, ec);
  if (ec) fail2("cannot copy", from, to, ec);
  return r;
}

path absolute(const path& p, std::error_code& ec) {
  ec.clear();
  if (p.empty() || p.is_absolute()) return p;
  char buf[PATH_MAX];
  if (!::getcwd(buf, sizeof buf)) {
    ec = errno_code();
    return path();
  }
  return path(buf) / p;
}
path absolute(const path& p) {
  std::error_code ec;
  path r = posix_fs::absolute(p, ec);
  if (ec) fail("cannot make absolute", p, ec);
  return r;
}

path canonical(const path& p, std::error_code& ec) {
  ec.clear();
  std::unique_ptr<char, decltype(&std::free)> r(::realpath(p.c_str(), nullptr), &std::free);
  if (!r) {
    ec = errno_code();
    return path();
  }
  return path(r.get());
}
path canonical(const path& p) {
  std::error_code ec;
  path r = posix_fs::canonical(p, ec);
  if (ec) fail("cannot resolve", p, ec);
  return r;
}

path temp_directory_path() {
  const char* t = std::getenv("TMPDIR");
  if (t && *t && posix_fs::is_directory(t)) return path(t);
  return path("/tmp");
}

directory_iterator::directory_iterator(const path& dir, std::error_code& ec) {
  ec.clear();
  list_into(dir, false, entries_, ec);
  if (ec) entries_.clear();
}
directory_iterator::directory_iterator(const path& dir) {
  std::error_code ec;
  list_into(dir, false, entries_, ec);
  if (ec) fail("cannot list directory", dir, ec);
}

recursive_directory_iterator::recursive_directory_iterator(const path& dir, std::error_code& ec) {
  ec.clear();
  list_into(dir, true, entries_, ec);
  if (ec) entries_.clear();
}
recursive_directory_iterator::recursive_directory_iterator(const path& dir) {
  std::error_code ec;
  list_into(dir, true, entries_, ec);
  if (ec) fail("cannot list directory", dir, ec);
}

}  // namespace pi0::posix_fs
