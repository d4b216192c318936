#include "pi0/distributed/shard_layout.h"

#include <algorithm>

#include "pi0/common/check.h"

namespace pi0::distributed {

ShardMode parse_shard_mode(const std::string& value) {
  if (value == "none") return ShardMode::kNone;
  if (value == "optimizer") return ShardMode::kOptimizer;
  if (value == "gradients") return ShardMode::kGradients;
  throw UserError("dist.shard: '" + value + "' is not a sharding mode; expected none, optimizer or gradients");
}

const char* to_string(ShardMode mode) {
  switch (mode) {
    case ShardMode::kNone: return "none";
    case ShardMode::kOptimizer: return "optimizer";
    case ShardMode::kGradients: return "gradients";
  }
  return "?";
}

ShardLayout::ShardLayout(const std::vector<int64_t>& numels, const std::vector<int64_t>& element_sizes,
                         int64_t world_size)
    : element_sizes_(element_sizes), world_size_(world_size), bytes_(static_cast<size_t>(std::max<int64_t>(world_size, 1)), 0) {
  PI0_CHECK(world_size >= 1, "ShardLayout: world size ", world_size);
  PI0_CHECK(numels.size() == element_sizes.size(), "ShardLayout: sizes and element sizes differ in length");
  int64_t total = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    PI0_CHECK(numels[i] >= 0 && element_sizes[i] > 0, "ShardLayout: bad size of parameter ", i);
    total += numels[i] * element_sizes[i];
  }
  // Rank r owns the elements whose first byte lies in [cut(r), cut(r + 1)).
  auto cut = [&](int64_t r) { return total / world_size * r + total % world_size * r / world_size; };
  int64_t offset = 0;  // bytes before the current parameter
  int64_t rank = 0;
  for (size_t i = numels.size(); i-- > 0;) {
    const int64_t n = numels[i], es = element_sizes[i];
    int64_t begin = 0;
    while (begin < n) {
      while (rank + 1 < world_size && offset + begin * es >= cut(rank + 1)) ++rank;
      // Elements of this parameter up to the next rank's cut (rounded up to whole elements).
      int64_t end = n;
      if (rank + 1 < world_size) {
        const int64_t next = cut(rank + 1) - offset;  // byte position of the cut inside this parameter
        end = std::min(n, std::max(begin + 1, (next + es - 1) / es));
      }
      pieces_.push_back({i, begin, end, rank});
      bytes_[static_cast<size_t>(rank)] += (end - begin) * es;
      begin = end;
    }
    offset += n * es;
  }
}

std::vector<Piece> ShardLayout::owned_by(int64_t rank) const {
  std::vector<Piece> out;
  for (const auto& p : pieces_)
    if (p.owner == rank) out.push_back(p);
  return out;
}

std::vector<PieceBucket> ShardLayout::buckets(int64_t max_bytes, const std::vector<int>& kinds) const {
  PI0_CHECK(kinds.size() == element_sizes_.size(), "ShardLayout::buckets: ", kinds.size(), " kinds for ",
            element_sizes_.size(), " parameters");
  std::vector<PieceBucket> out;
  int64_t bytes = 0;
  for (size_t k = 0; k < pieces_.size(); ++k) {
    const auto& p = pieces_[k];
    const int64_t nbytes = p.numel() * element_sizes_[p.param];
    const bool fits = !out.empty() && out.back().owner == p.owner &&
                      kinds[pieces_[out.back().pieces.back()].param] == kinds[p.param] && bytes + nbytes <= max_bytes;
    if (!fits) {
      out.emplace_back();
      out.back().owner = p.owner;
      bytes = 0;
    }
    auto& b = out.back();
    b.pieces.push_back(k);
    b.offsets.push_back(b.numel);
    b.numel += p.numel();
    bytes += nbytes;
  }
  return out;
}

int64_t ShardLayout::max_bytes() const { return *std::max_element(bytes_.begin(), bytes_.end()); }

}  // namespace pi0::distributed
