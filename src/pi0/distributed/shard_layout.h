// Which data-parallel rank owns which part of the trainable parameters' optimizer state, EMA and (with
// dist.shard=gradients) gradients: ZeRO stages 1 and 2 (Rajbhandari et al., 2020) over whole-element ranges.
//
// The trainable parameters are laid end to end, flattened, in backward order (reverse registration order, the
// order in which backward produces their gradients), and the resulting byte range [0, T) is cut into world_size
// consecutive ranges of about T / world_size bytes, at element boundaries. A parameter that straddles a cut is
// split into pieces, so every rank owns within one element of an equal share. Why ranges and not whole
// parameters: pi0's token embedding alone is 16 % of the trainable bytes, more than an eighth, so whole-parameter
// ownership could not balance 8 ranks. The layout depends only on the sizes and the world size: every rank computes
// the same one, and a checkpoint describes its pieces by (name, begin, end), which any other layout can read back.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace pi0::distributed {

enum class ShardMode {
  kNone,       ///< every rank holds all optimizer state, EMA and gradients (plain data parallel)
  kOptimizer,  ///< AdamW moments and EMA partitioned (ZeRO-1); gradients all-reduced in full
  kGradients,  ///< also gradients: each one reduced to its owner, freed elsewhere (ZeRO-2)
};

/// dist.shard's value ("none", "optimizer", "gradients"; the config loader has validated it).
ShardMode parse_shard_mode(const std::string& value);
const char* to_string(ShardMode mode);

/// A contiguous range of one parameter's elements (row-major flattening), owned by one rank.
struct Piece {
  size_t param = 0;   ///< index into the parameter list given to ShardLayout
  int64_t begin = 0;  ///< first element
  int64_t end = 0;    ///< one past the last element
  int64_t owner = 0;  ///< rank
  int64_t numel() const { return end - begin; }
  bool operator==(const Piece& o) const {
    return param == o.param && begin == o.begin && end == o.end && owner == o.owner;
  }
};

/// Consecutive pieces (layout order) with one owner and one parameter dtype, packed into one flat buffer for one
/// collective: what the sharded gradient reduction and the weight broadcast send, so a step issues a few large
/// collectives instead of one per parameter piece.
struct PieceBucket {
  std::vector<size_t> pieces;    ///< indices into ShardLayout::pieces()
  std::vector<int64_t> offsets;  ///< element offset of each piece in the flat buffer
  int64_t numel = 0;
  int64_t owner = 0;
};

class ShardLayout {
 public:
  /// `numels[i]`, `element_sizes[i]`: element count and bytes per element of parameter i (registration order).
  ShardLayout(const std::vector<int64_t>& numels, const std::vector<int64_t>& element_sizes, int64_t world_size);

  int64_t world_size() const { return world_size_; }
  /// Every piece, in layout (backward) order; a parameter with no elements has no piece.
  const std::vector<Piece>& pieces() const { return pieces_; }
  /// The pieces `rank` owns, in layout order (at most one per parameter).
  std::vector<Piece> owned_by(int64_t rank) const;
  /// Parameter bytes owned by `rank`, and the largest share (what per-rank memory plans must budget).
  int64_t bytes_of(int64_t rank) const { return bytes_.at(static_cast<size_t>(rank)); }
  int64_t max_bytes() const;
  /// The pieces grouped into buckets of at most `max_bytes` (a larger piece gets a bucket of its own); pieces of
  /// parameters whose `kinds` (e.g. dtype) differ never share one.
  std::vector<PieceBucket> buckets(int64_t max_bytes, const std::vector<int>& kinds) const;

 private:
  std::vector<int64_t> element_sizes_;
  int64_t world_size_;
  std::vector<Piece> pieces_;
  std::vector<int64_t> bytes_;
};

}  // namespace pi0::distributed
