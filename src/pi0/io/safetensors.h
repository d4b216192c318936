// Reading and writing the safetensors format (huggingface/safetensors), the format of converted pi0 checkpoints.
//
// Layout: an 8-byte little-endian u64 N, N bytes of JSON header
//   {"<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}
// (possibly padded with spaces), then the raw little-endian data buffer; offsets are relative to its start.
//
// Reading memory-maps the file and hands out tensors that view the mapping, so a 13 GB checkpoint is never held
// twice: the only copy made is the one into the model's parameters (see docs/formats.md). Whole models load
// through read_into_many, which streams the file with large sequential reads instead of faulting the mapping in.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "pi0/io/checksum.h"

namespace pi0::io {

/// The torch scalar type stored under a safetensors dtype name ("F32", "BF16", ...); nullopt for names this
/// LibTorch build cannot represent (e.g. "U32" before torch 2.3) or that are not safetensors dtypes at all.
std::optional<torch::ScalarType> scalar_type_from_dtype(const std::string& dtype);

/// The safetensors dtype name for a torch scalar type; nullopt for types safetensors cannot store (complex,
/// quantized).
std::optional<std::string> dtype_from_scalar_type(torch::ScalarType scalar_type);

/// One tensor entry of a safetensors header.
struct TensorInfo {
  std::string dtype;                                 ///< safetensors dtype name, e.g. "BF16"
  torch::ScalarType scalar_type = torch::kFloat32;  ///< the matching torch type
  std::vector<int64_t> shape;                        ///< e.g. {18, 2048, 256}; empty for a 0-dim tensor
  uint64_t data_begin = 0;  ///< first byte, relative to the start of the data buffer
  uint64_t data_end = 0;    ///< one past the last byte, relative to the start of the data buffer

  int64_t numel() const;
  uint64_t nbytes() const { return data_end - data_begin; }
};

/// How a SafetensorsFile expects to be read; passed to the kernel as a read-ahead hint (madvise).
enum class AccessPattern {
  kNormal,      ///< a few tensors, in any order (default kernel read-ahead)
  kSequential,  ///< every tensor, roughly in file order (model loading): aggressive read-ahead
};

/// A safetensors file opened read-only through a private memory mapping. The header is parsed and fully validated
/// on construction; tensors are materialized lazily by get()/get_copy().
///
/// Thread-safety: all const member functions may be called concurrently.
class SafetensorsFile {
 public:
  /// Maps and validates `path`; throws pi0::UserError ("<path>: <what is wrong>") for a missing, truncated or
  /// malformed file.
  explicit SafetensorsFile(const std::string& path, AccessPattern access = AccessPattern::kNormal);

  const std::string& path() const { return path_; }
  /// Tensor names in lexicographic order.
  const std::vector<std::string>& names() const { return names_; }
  size_t size() const { return names_.size(); }
  bool contains(const std::string& name) const { return infos_.count(name) != 0; }
  /// Header entry of `name`; throws pi0::UserError if the file has no such tensor.
  const TensorInfo& info(const std::string& name) const;
  /// The optional "__metadata__" map (empty if absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Size of the whole file in bytes.
  uint64_t file_size() const;
  /// File offset of the data buffer (8 + header length).
  uint64_t data_start() const { return data_start_; }

  /// A CPU tensor that views the mapped file without copying. It keeps the mapping alive, so it stays valid after
  /// this object is destroyed. The mapping is read-only: writing into the view (in-place ops) crashes with SIGSEGV,
  /// so copy first (get_copy, or param.copy_(view)) when the data must change.
  /// NOTE: the one exception to "no copy": a tensor whose bytes are not aligned to its element size in the file
  /// (foreign writers may produce this; save_safetensors never does) is returned as an aligned copy, because
  /// misaligned typed access is undefined behaviour.
  torch::Tensor get(const std::string& name) const;

  /// An owned, writable CPU copy of `name`, converted to `dtype` if given.
  torch::Tensor get_copy(const std::string& name, std::optional<torch::ScalarType> dtype = std::nullopt) const;

  /// Copies tensor `name` into `dst` (a parameter: same shape, any dtype or device; converted on the way, without
  /// recording autograd history). Throws pi0::UserError if the shapes differ. See read_into_many.
  void read_into(const std::string& name, const torch::Tensor& dst, uint64_t chunk_bytes = kReadChunkBytes) const;

  /// Copies each (name, destination) pair as read_into does, reading the file in file order whatever the order of
  /// `requests`: the loading path for whole models and optimizer state. The data is read with large sequential
  /// pread() calls (`chunk_bytes` each) by a reader thread into a small ring of staging buffers while the calling
  /// thread converts and copies the previous chunk, so loading runs at the disk's speed and the resident set grows
  /// by three chunks, not by the file (nothing is mapped). `on_done(name, bytes)` is called after each tensor.
  /// All shapes are checked before anything is read.
  void read_into_many(const std::vector<std::pair<std::string, torch::Tensor>>& requests,
                      const std::function<void(const std::string&, uint64_t)>& on_done = {},
                      uint64_t chunk_bytes = kReadChunkBytes) const;
  static constexpr uint64_t kReadChunkBytes = 16ull << 20;

  /// Drops this process's page-table references to the pages holding `name` (madvise MADV_DONTNEED). The data stays
  /// in the page cache and views stay valid (touching them faults the pages back in); the point is to keep the
  /// resident set at one copy of the checkpoint while loading: copy a tensor into its parameter, then release it.
  void release(const std::string& name) const;

 private:
  struct Mapping;

  void parse_header(const char* header, uint64_t header_len);

  std::string path_;
  std::shared_ptr<const Mapping> mapping_;
  uint64_t data_start_ = 0;
  std::vector<std::string> names_;
  std::map<std::string, TensorInfo> infos_;
  std::map<std::string, std::string> metadata_;
};

/// Writes `tensors` (any device, any layout: each is made contiguous and copied to CPU one at a time) and
/// `metadata` to `path` as safetensors. Header keys are sorted; the header is padded with spaces so the data buffer
/// starts at a multiple of 8 bytes, and tensors are laid out by decreasing element size, then by name, with no gaps,
/// so every tensor is aligned to its element size and the file passes the reference reader's coverage check.
/// The file is written to `path + ".tmp"`, fsync'ed and renamed over `path`, so readers see either the old file
/// or the complete new one; on failure `path` is untouched and the temporary file is removed.
/// Returns the file's size and XXH3, computed from the bytes as they were written (for manifests).
/// Throws pi0::UserError on duplicate or reserved names, unsupported dtypes or I/O errors.
FileDigest save_safetensors(const std::string& path,
                            const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                            const std::map<std::string, std::string>& metadata = {});

/// A tensor to write that is produced only when its turn comes (a dtype conversion, an EMA overlay, zeros), so a
/// whole file's worth of converted tensors never exists at once: the writer's peak is one produced tensor.
struct LazyTensor {
  std::string name;
  torch::ScalarType dtype = torch::kFloat32;  ///< what produce() returns
  std::vector<int64_t> shape;
  std::function<torch::Tensor()> produce;     ///< any device/layout; must match dtype and shape
};

/// save_safetensors for lazily produced tensors: same layout, atomicity and errors; each tensor is produced,
/// written and dropped in turn. `progress` (if set) is called with (bytes written, total bytes) after each tensor.
FileDigest save_safetensors_lazy(const std::string& path, const std::vector<LazyTensor>& tensors,
                                 const std::map<std::string, std::string>& metadata = {},
                                 const std::function<void(uint64_t, uint64_t)>& progress = {});

/// Every tensor of `path` as an owned, writable CPU copy, by name (small files: optimizer/EMA state,
/// observations). Throws pi0::UserError like SafetensorsFile.
std::map<std::string, torch::Tensor> read_safetensors(const std::string& path);

}  // namespace pi0::io
