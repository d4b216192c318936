// File checksums: XXH3-64 from Debian's libxxhash (a fast, well-reviewed non-cryptographic hash). They guard
// against accidents (bit rot, a file copied from another step, a torn copy), not against tampering.
// Used by checkpoint and bundle manifests (manifest.h) and by small checkpoints' base_weights.json.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace pi0::io {

/// Name of the checksum algorithm as recorded in manifests and base_weights.json.
inline constexpr const char* kChecksumAlgorithm = "xxh3_64";

/// Streaming XXH3-64: feed the bytes of a file in order, in pieces of any size.
class Xxh3 {
 public:
  Xxh3();
  ~Xxh3();
  Xxh3(const Xxh3&) = delete;
  Xxh3& operator=(const Xxh3&) = delete;

  void update(const void* data, size_t n);
  /// The hash of everything fed so far, as 16 lowercase hex digits (the object may keep being fed).
  std::string hex() const;

 private:
  void* state_;  // XXH3_state_t, kept out of this header so only checksum.cpp includes xxhash.h
};

/// Size and checksum of a file's bytes.
struct FileDigest {
  uint64_t size = 0;
  std::string xxh3;  ///< 16 hex digits
};

/// Digest of a whole file, read sequentially in large blocks (bounded memory). Throws pi0::UserError if unreadable.
FileDigest digest_file(const std::string& path);

}  // namespace pi0::io
