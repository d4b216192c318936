// A rank's share of the trainable parameters under dist.shard (shard_layout.h says how elements are assigned):
// 1-D views of the owned elements, which AdamW and the EMA update in place, and the broadcast that brings every
// rank's updated elements to all the others after the optimizer step. The broadcast goes bucket by bucket from
// each bucket's owner; it moves the bytes an all-gather of the shards would. Why broadcasts and not an all-gather: shards differ in size by up to an element, and LibTorch
// 1.13's Gloo has neither uneven all-gathers nor reduce-scatter.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "pi0/distributed/process_group.h"
#include "pi0/distributed/shard_layout.h"

namespace pi0::distributed {

class ParameterShards {
 public:
  /// `params`: (name, parameter) of every trainable parameter in registration order, identical on all ranks.
  ParameterShards(ProcessGroup& pg, std::vector<std::pair<std::string, torch::Tensor>> params);

  const ShardLayout& layout() const { return layout_; }
  /// The pieces this rank owns, in layout order.
  const std::vector<Piece>& owned() const { return owned_; }
  /// (parameter name, 1-D view of its owned elements), aligned with owned().
  const std::vector<std::pair<std::string, torch::Tensor>>& owned_views() const { return owned_views_; }
  /// Views of the owned elements of each parameter's .grad, aligned with owned(); undefined where .grad is
  /// (dist.shard=optimizer: the gradients were all-reduced in full).
  std::vector<torch::Tensor> owned_grad_views() const;
  /// Every piece goes from its owner to all other ranks: pieces grouped into buckets of about `bucket_bytes`
  /// (ShardLayout::buckets; a bucket of one piece is sent in place, without a copy); at most `window_bytes` in flight.
  void broadcast_updates(int64_t bucket_bytes, int64_t window_bytes);

 private:
  ProcessGroup& pg_;
  std::vector<std::pair<std::string, torch::Tensor>> params_;
  ShardLayout layout_;
  std::vector<Piece> owned_;
  std::vector<std::pair<std::string, torch::Tensor>> owned_views_;
};

/// Element range [begin, end) of `t` flattened (a view: `t` must be contiguous).
torch::Tensor flat_range(const torch::Tensor& t, int64_t begin, int64_t end);

}  // namespace pi0::distributed
