#include "pi0/common/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

#include "pi0/common/check.h"

namespace pi0 {

std::string file_type_name(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

std::string errno_reason(int err) {
  switch (err) {
    case ENOENT: return "file not found";
    case EACCES:
    case EPERM: return "permission denied";
    case ELOOP: return "too many levels of symbolic links (a symlink loop?)";
    case ENOTDIR: return "a component of the path is not a directory";
    case ENAMETOOLONG: return "file name too long";
    default: break;
  }
  std::string s = std::strerror(err);
  if (!s.empty()) s[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(s[0])));
  return s;
}

std::string input_file_problem(const std::string& path) {
  if (path.empty()) return "empty path";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return errno_reason(errno);
  // Decided from stat() alone: opening a FIFO blocks until a writer comes, and opening a device can have effects.
  if (!S_ISREG(st.st_mode)) return "is " + file_type_name(st.st_mode) + ", not a regular file";
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return errno_reason(errno);
  ::close(fd);
  return "";
}

void require_input_file(const std::string& path, const std::string& what, const std::string& expected) {
  const auto problem = input_file_problem(path);
  if (problem.empty()) return;
  std::string msg = what.empty() ? path + ": " + problem : what + " '" + path + "': " + problem;
  if (!expected.empty()) msg += "; expected " + expected;
  throw UserError(msg);
}

void require_output_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return;  // missing (or dangling link): created anew
  throw UserError(path + ": exists and is " + file_type_name(st.st_mode) +
                  ", not a regular file; refusing to write over it (give a file path)");
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  const std::string tmp = path + ".tmp";
  require_output_file(path);
  require_output_file(tmp);
  create_parent_directories(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw UserError(tmp + ": cannot create (" + errno_reason(errno) + ")");
  auto fail = [&](const std::string& what) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw UserError(tmp + ": " + what + " failed (" + errno_reason(err) + ")");
  };
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("write");
    done += static_cast<size_t>(n);
  }
  // fsync before rename: otherwise a crash can leave the new name pointing at a file whose data never hit disk.
  if (::fsync(fd) != 0) fail("fsync");
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw UserError(tmp + ": close failed (" + errno_reason(err) + ")");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw UserError(path + ": cannot rename " + tmp + " over it (" + errno_reason(err) + ")");
  }
}

namespace {

// mkdir -p `dir`, walking down from the root so that an error names the component that failed; `prefix` starts
// every message (it names what the user gave), followed by the component and the reason and ")".
void create_directories_named(const std::string& dir, const std::string& prefix) {
  // Walk down from the root, creating each missing component: the error then names the component that failed.
  std::string sofar;
  size_t pos = 0;
  while (pos <= dir.size()) {
    const size_t next = dir.find('/', pos);
    const size_t end = next == std::string::npos ? dir.size() : next;
    sofar = dir.substr(0, end);
    pos = end + 1;
    if (sofar.empty() || sofar == "." || sofar == "..") continue;
    struct stat st {};
    if (::stat(sofar.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) continue;
      throw UserError(prefix + "'" + sofar + "' is " + file_type_name(st.st_mode) + ")");
    }
    if (errno != ENOENT) throw UserError(prefix + "'" + sofar + "': " + errno_reason(errno) + ")");
    if (::mkdir(sofar.c_str(), 0777) != 0 && errno != EEXIST)
      throw UserError(prefix + "'" + sofar + "': " + errno_reason(errno) + ")");
  }
}

}  // namespace

void create_directories_or_throw(const std::string& dir, const std::string& what) {
  if (dir.empty()) return;
  create_directories_named(dir, (what.empty() ? std::string() : what + " ") + "'" + dir + "': cannot create directories (");
}

std::string relative_path_note(const std::string& path, const std::string& extra) {
  if (path.empty() || path[0] == '/') return "";
  char buf[4096];
  const std::string cwd = ::getcwd(buf, sizeof buf) ? std::string(buf) : std::string("?");
  return " (relative paths are resolved from the working directory '" + cwd + "'" + extra + ")";
}

void create_parent_directories(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos || slash == 0) return;  // the working directory, or the root
  const std::string dir = path.substr(0, slash);
  create_directories_named(dir, path + ": cannot create its folder '" + dir + "' (");
}

}  // namespace pi0
