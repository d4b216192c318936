// manifest.json: what a checkpoint or bundle directory holds, written last before the directory is committed, so
// that a reader can tell an intact directory from one whose files were altered, truncated or swapped.
//
//   {"format": 1, "algorithm": "xxh3_64", "step": 20,
//    "files": {"model.safetensors": {"size": 123, "xxh3": "0123456789abcdef"}, "assets/x/norm_stats.json": ...}}
//
// Every regular file of the directory is listed except manifest.json itself and the COMPLETE marker; "step" is
// present for training checkpoints (and then every listed .safetensors file carries the same step in its
// __metadata__). Verification has two levels: check_manifest() reads only sizes and safetensors headers (cheap,
// used to choose a checkpoint), verify_contents() reads every byte once (checksums, and finiteness of every
// floating-point tensor). Layout and policy: docs/formats.md, "Checkpoint".
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "pi0/io/checkpoint_files.h"
#include "pi0/io/checksum.h"

namespace pi0::io {

struct Manifest {
  std::optional<int64_t> step;              ///< training step of a checkpoint; nullopt for bundles
  std::map<std::string, FileDigest> files;  ///< path relative to the directory ('/'-separated) → digest
};

/// Writes dir/manifest.json atomically, listing every regular file under `dir` (recursively) except the manifest
/// and the COMPLETE marker. Digests in `known` (relative path → digest computed while the file was written) are
/// used as they are; other files are read and hashed now (small files: JSON, YAML, tokenizer).
void write_manifest(const std::string& dir, std::optional<int64_t> step,
                    const std::map<std::string, FileDigest>& known = {});

/// The manifest of `dir`, or nullopt if it has none (written before manifests existed). UserError if malformed.
std::optional<Manifest> read_manifest(const std::string& dir);

/// Cheap checks (sizes and safetensors headers only): every listed file exists with its listed size, no file
/// is unlisted, and with a step every listed .safetensors file's __metadata__ "step" equals it. Throws
/// pi0::UserError naming the file and what disagrees.
void check_manifest(const std::string& dir, const Manifest& manifest);

/// Reads every byte once (the files in parallel): each listed file's XXH3 must match the manifest and every
/// floating-point tensor of each .safetensors file must be finite. Without a manifest (nullopt) only the
/// finiteness of the .safetensors files directly in `dir` is checked. Throws pi0::UserError naming the file (and
/// the tensor for non-finite values).
void verify_contents(const std::string& dir, const std::optional<Manifest>& manifest);

/// Reads the safetensors file `path` once: returns its digest, and throws pi0::UserError naming the file and
/// tensor if a floating-point tensor holds NaN or Inf.
FileDigest scan_safetensors(const std::string& path);

}  // namespace pi0::io
