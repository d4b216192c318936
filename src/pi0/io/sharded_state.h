// Tensor state (AdamW moments, EMA averages) that data-parallel ranks save in pieces (dist.shard), read back into
// any partition: the same world size, another one, or none.
//
// A state is either one file "<prefix>.safetensors" holding whole tensors, or one file per rank,
// "<prefix>.rank<r>-of-<W>.safetensors", each holding that rank's pieces as 1-D tensors and, in its metadata
// under "pieces", the range of every piece: {"<name>": [begin, end, numel]} over the row-major flattening of the
// full tensor. Tensors a shard file stores without a range (e.g. the optimizer's step count) are whole.
// Each rank writes its own file (no gather: rank 0 would otherwise need the whole state, the memory sharding
// saves), and the reader stitches ranges together from whichever files hold them.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pi0/io/checksum.h"

namespace pi0::io {

class SafetensorsFile;

/// "<prefix>.safetensors" when world_size is 1, else "<prefix>.rank<r>-of-<W>.safetensors".
std::string state_file_name(const std::string& prefix, int64_t rank, int64_t world_size);

/// Paths of `prefix`'s state files in checkpoint `dir`: the single file, or every rank's file in rank order; empty
/// if there are none. Throws pi0::UserError naming the file when a rank's file is missing, ranks disagree on the
/// world size, or both forms are present.
std::vector<std::string> state_files(const std::string& dir, const std::string& prefix);

/// One piece to write: elements [begin, begin + data.numel()) of tensor `name`, whose full size is `numel`.
struct StatePiece {
  std::string name;
  int64_t begin = 0;
  int64_t numel = 0;
  torch::Tensor data;  ///< 1-D
};

/// Writes `pieces` (ranges in the metadata) and `whole` tensors to `path` like save_safetensors (atomic, digest).
FileDigest save_state_pieces(const std::string& path, const std::vector<StatePiece>& pieces,
                             const std::vector<std::pair<std::string, torch::Tensor>>& whole,
                             std::map<std::string, std::string> metadata);

/// Reads ranges of tensors out of a set of state files (as returned by state_files).
class StateReader {
 public:
  explicit StateReader(const std::vector<std::string>& files);
  ~StateReader();
  StateReader(StateReader&&) noexcept;
  StateReader& operator=(StateReader&&) noexcept;

  /// Every stored tensor's name and full element count.
  const std::map<std::string, int64_t>& numels() const { return numels_; }
  /// The files, for messages ("a, b").
  std::string describe() const;

  /// A destination: elements [begin, begin + dst.numel()) of `name` go into `dst` (contiguous; any dtype unless
  /// exact_dtype).
  struct Request {
    std::string name;
    int64_t begin = 0;
    torch::Tensor dst;
  };
  /// Fills every request. Pieces that match a request exactly are streamed (SafetensorsFile::read_into_many, in
  /// file order); partial overlaps are copied from the mapping. `exact_dtype`: a stored dtype other than the
  /// destination's is an error (own checkpoints hold exactly what their trainer wrote). Throws pi0::UserError
  /// naming the files and tensor when elements are missing.
  void read(const std::vector<Request>& requests, bool exact_dtype) const;

 private:
  struct Stored {
    size_t file = 0;
    std::string key;  ///< tensor name inside the file
    int64_t begin = 0, end = 0;
    bool whole = false;  ///< stored with its full shape
  };
  std::vector<std::string> files_;
  std::vector<std::unique_ptr<SafetensorsFile>> opened_;
  std::map<std::string, std::vector<Stored>> stored_;
  std::map<std::string, int64_t> numels_;
};

}  // namespace pi0::io
