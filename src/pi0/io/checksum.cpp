#include "pi0/io/checksum.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include <xxhash.h>

#include "pi0/common/check.h"
#include "pi0/common/files.h"

namespace pi0::io {

Xxh3::Xxh3() : state_(XXH3_createState()) {
  PI0_CHECK(state_ != nullptr, "XXH3_createState: out of memory");
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

Xxh3::~Xxh3() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Xxh3::update(const void* data, size_t n) {
  if (n > 0) XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, n);
}

std::string Xxh3::hex() const {
  char out[17];
  std::snprintf(out, sizeof out, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_))));
  return out;
}

FileDigest digest_file(const std::string& path) {
  // A FIFO or device in a checkpoint would block or never end the hash.
  if (const auto problem = input_file_problem(path); !problem.empty()) throw UserError(path + ": " + problem);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw UserError(path + ": cannot open (" + std::strerror(errno) + ")");
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  // 8 MiB reads: large enough that the syscall cost vanishes, small enough to stay mostly in L3 while hashed.
  std::vector<char> buf(8u << 20);
  Xxh3 hash;
  FileDigest d;
  while (true) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw UserError(path + ": read failed (" + std::strerror(err) + ")");
    }
    if (n == 0) break;
    hash.update(buf.data(), static_cast<size_t>(n));
    d.size += static_cast<uint64_t>(n);
  }
  ::close(fd);
  d.xxh3 = hash.hex();
  return d;
}

}  // namespace pi0::io
