#include "pi0/io/manifest.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <vector>

#include <nlohmann/json.hpp>

#include "pi0/common/check.h"
#include "pi0/common/files.h"
#include "pi0/common/fs.h"
#include "pi0/common/strings.h"
#include "pi0/io/safetensors.h"

namespace fs = pi0::posix_fs;

namespace pi0::io {
namespace {

constexpr int kFormat = 1;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Regular files under `dir` as '/'-separated relative paths, without the manifest and the COMPLETE marker.
std::vector<std::string> listed_files(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const auto rel = e.path().lexically_relative(dir).generic_string();
    if (rel == kManifestFile || rel == kCompleteMarker) continue;
    out.push_back(rel);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// True when any element of the `n` little-endian values at `p` has an all-ones exponent (NaN or Inf). The loop
// has no early exit so the compiler vectorizes it: the scan runs at memory speed.
template <class U>
bool any_nonfinite(const char* p, size_t n, U exponent_mask) {
  U bad = 0;
  for (size_t i = 0; i < n; ++i) {
    U v;
    std::memcpy(&v, p + i * sizeof(U), sizeof(U));
    bad |= static_cast<U>((v & exponent_mask) == exponent_mask);
  }
  return bad != 0;
}

bool any_nonfinite(torch::ScalarType t, const char* p, size_t nbytes) {
  switch (t) {
    case torch::kFloat64: return any_nonfinite<uint64_t>(p, nbytes / 8, 0x7ff0000000000000ull);
    case torch::kFloat32: return any_nonfinite<uint32_t>(p, nbytes / 4, 0x7f800000u);
    case torch::kFloat16: return any_nonfinite<uint16_t>(p, nbytes / 2, 0x7c00u);
    case torch::kBFloat16: return any_nonfinite<uint16_t>(p, nbytes / 2, 0x7f80u);
    default: return false;  // integer, bool; float8 is not checked
  }
}

// A read-only private mapping of a whole file.
struct Mapped {
  char* addr = nullptr;
  size_t size = 0;
  explicit Mapped(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw UserError(path + ": cannot open (" + std::strerror(errno) + ")");
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      ::close(fd);
      throw UserError(path + ": cannot stat (" + std::strerror(errno) + ")");
    }
    size = static_cast<size_t>(st.st_size);
    if (size > 0) {
      void* a = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (a == MAP_FAILED) {
        ::close(fd);
        throw UserError(path + ": mmap failed (" + std::strerror(errno) + ")");
      }
      addr = static_cast<char*>(a);
      ::madvise(addr, size, MADV_SEQUENTIAL);  // a hint: aggressive read-ahead, pages dropped behind the scan
    }
    ::close(fd);
  }
  ~Mapped() {
    if (addr) ::munmap(addr, size);
  }
  Mapped(const Mapped&) = delete;
  Mapped& operator=(const Mapped&) = delete;
};

FileDigest verify_file(const fs::path& dir, const std::string& rel, const FileDigest* expected) {
  const auto path = (dir / rel).string();
  const FileDigest got = ends_with(rel, ".safetensors") ? scan_safetensors(path) : digest_file(path);
  if (expected && (got.size != expected->size || got.xxh3 != expected->xxh3)) {
    throw UserError(path + ": contents differ from " + (dir / kManifestFile).string() + " (checksum " + got.xxh3 +
                    ", expected " + expected->xxh3 + "): the file changed after it was saved");
  }
  return got;
}

}  // namespace

FileDigest scan_safetensors(const std::string& path) {
  const SafetensorsFile file(path);  // validates the header
  std::vector<const TensorInfo*> tensors;
  std::map<const TensorInfo*, std::string> names;
  for (const auto& n : file.names()) {
    const TensorInfo* ti = &file.info(n);
    tensors.push_back(ti);
    names[ti] = n;
  }
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->data_begin < b->data_begin; });
  const Mapped m(path);
  Xxh3 hash;
  constexpr size_t kPiece = 4u << 20;  // hashed, then checked while still in cache
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  size_t done_pages = 0;  // bytes [0, done_pages) released from the mapping
  auto consume = [&](size_t begin, size_t end, const TensorInfo* ti) {
    for (size_t lo = begin; lo < end; lo += kPiece) {
      const size_t hi = std::min(end, lo + kPiece);
      hash.update(m.addr + lo, hi - lo);
      if (ti && any_nonfinite(ti->scalar_type, m.addr + lo, hi - lo)) {
        throw UserError(path + ": tensor '" + names.at(ti) + "' (" + ti->dtype +
                        ") holds non-finite values (NaN or Inf); the saved state is unusable");
      }
      // Keep the resident set small on multi-GB files: the pages stay in the page cache for the loader.
      const size_t release_to = hi / page * page;
      if (release_to > done_pages) {
        ::madvise(m.addr + done_pages, release_to - done_pages, MADV_DONTNEED);
        done_pages = release_to;
      }
    }
  };
  // Overlapping tensors are refused by SafetensorsFile, so the file is consumed in order, each byte once.
  size_t cursor = 0;
  for (const TensorInfo* ti : tensors) {
    const size_t begin = file.data_start() + ti->data_begin, end = file.data_start() + ti->data_end;
    if (begin < cursor) continue;  // empty tensor inside an already consumed range
    consume(cursor, begin, nullptr);
    // A tensor misaligned to its element size (foreign writers) would split elements across pieces; such
    // files are not ours, and are only hashed, not scanned.
    const bool aligned = (begin % c10::elementSize(ti->scalar_type)) == 0 &&
                         (kPiece % c10::elementSize(ti->scalar_type)) == 0;
    consume(begin, end, aligned ? ti : nullptr);
    cursor = end;
  }
  consume(cursor, m.size, nullptr);
  return {m.size, hash.hex()};
}

void write_manifest(const std::string& dir, std::optional<int64_t> step,
                    const std::map<std::string, FileDigest>& known) {
  const fs::path d(dir);
  nlohmann::json files = nlohmann::json::object();
  for (const auto& rel : listed_files(d)) {
    const auto it = known.find(rel);
    const FileDigest digest = it != known.end() ? it->second : digest_file((d / rel).string());
    files[rel] = {{"size", digest.size}, {"xxh3", digest.xxh3}};
  }
  nlohmann::json j = {{"format", kFormat}, {"algorithm", kChecksumAlgorithm}, {"files", files}};
  if (step) j["step"] = *step;
  const auto path = d / kManifestFile;
  write_file_atomic(path.string(), j.dump(2) + "\n");
}

std::optional<Manifest> read_manifest(const std::string& dir) {
  const auto path = fs::path(dir) / kManifestFile;
  if (!fs::exists(path)) return std::nullopt;
  std::ifstream in(path);
  Manifest m;
  try {
    const auto j = nlohmann::json::parse(in);
    const auto format = j.at("format").get<int>();
    if (format != kFormat) throw std::runtime_error("format " + std::to_string(format) + " is not supported");
    const auto algorithm = j.at("algorithm").get<std::string>();
    if (algorithm != kChecksumAlgorithm) throw std::runtime_error("unknown checksum algorithm '" + algorithm + "'");
    if (j.contains("step")) m.step = j.at("step").get<int64_t>();
    for (const auto& [rel, e] : j.at("files").items()) {
      FileDigest d;
      // get<uint64_t>() of -1 gives 18446744073709551615, which the size check would then print.
      if (!e.at("size").is_number_unsigned()) {
        throw std::runtime_error("files[" + quote_value(rel) + "].size is " + e.at("size").dump() +
                                 ", expected a byte count >= 0");
      }
      d.size = e.at("size").get<uint64_t>();
      d.xxh3 = e.at("xxh3").get<std::string>();
      m.files[rel] = d;
    }
  } catch (const std::exception& e) {
    throw UserError(path.string() + ": malformed (" + printable(e.what()) + "); expected {\"format\": 1, \"algorithm\": \"" +
                    kChecksumAlgorithm + "\", \"files\": {...}}");
  }
  return m;
}

void check_manifest(const std::string& dir, const Manifest& manifest) {
  const fs::path d(dir);
  const auto manifest_path = (d / kManifestFile).string();
  for (const auto& [rel, digest] : manifest.files) {
    const auto path = d / rel;
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (ec) throw UserError(path.string() + ": listed in " + manifest_path + " but missing (" + ec.message() + ")");
    if (size != digest.size) {
      throw UserError(path.string() + ": " + std::to_string(size) + " bytes, but " + manifest_path + " lists " +
                      std::to_string(digest.size) + ": the file changed after it was saved");
    }
    if (manifest.step && ends_with(rel, ".safetensors")) {
      const SafetensorsFile file(path.string());
      const auto it = file.metadata().find("step");
      const std::string want = std::to_string(*manifest.step);
      if (it == file.metadata().end() || it->second != want) {
        throw UserError(path.string() + ": holds the state of step " +
                        (it == file.metadata().end() ? std::string("<none>") : it->second) + ", but " +
                        manifest_path + " is for step " + want + " (a file from another checkpoint?)");
      }
    }
  }
  for (const auto& rel : listed_files(d)) {
    if (!manifest.files.count(rel))
      throw UserError((d / rel).string() + ": not listed in " + manifest_path + " (added after it was saved)");
  }
}

void verify_contents(const std::string& dir, const std::optional<Manifest>& manifest) {
  const fs::path d(dir);
  std::vector<std::string> files;
  if (manifest) {
    for (const auto& [rel, digest] : manifest->files) files.push_back(rel);
  } else {
    for (const auto& e : fs::directory_iterator(d)) {
      const auto name = e.path().filename().string();
      if (e.is_regular_file() && ends_with(name, ".safetensors")) files.push_back(name);
    }
    std::sort(files.begin(), files.end());
  }
  // One thread per file: a checkpoint's large files (model, optimizer, EMA) are read concurrently.
  std::vector<std::future<FileDigest>> pending;
  for (const auto& rel : files) {
    const FileDigest* expected = manifest ? &manifest->files.at(rel) : nullptr;
    pending.push_back(std::async(std::launch::async, [&d, rel, expected] { return verify_file(d, rel, expected); }));
  }
  for (auto& p : pending) p.wait();  // every thread done before the first error is raised
  for (auto& p : pending) p.get();
}

}  // namespace pi0::io
