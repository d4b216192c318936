// Gradient reduction for dist.shard=gradients (ZeRO-2): each piece of each gradient (shard_layout.h) is summed
// into its owner only, and every rank drops a parameter's .grad as soon as its pieces are on their way, so between
// steps a rank holds gradients for its own share and, during backward, for what is still in flight.
//
// Per backward (every micro-step of gradient accumulation: accumulating whole gradients locally first would hold
// them all, which is what this mode exists to avoid): pieces are grouped into buckets of one owner and one dtype
// (ShardLayout::buckets, about dist.bucket_size_mb each). When the gradients of a bucket's parameters have been
// accumulated (GradAccumulationHooks), its pieces are packed into a flat buffer and a c10d reduce to the owner
// starts, strictly in bucket order so every rank issues the same collectives in the same order; a parameter's
// .grad is released once all its pieces are packed. At most `window_bytes` of reductions stay in flight;
// completed ones are added into the owner's accumulators (one per owned bucket). A parameter no rank used this
// backward contributes zeros and stays without a gradient (all ranks run the same graph); one accumulated again
// after its bucket left (re-entrant checkpointing) is reduced again in wait(), which is exact because reductions
// add up.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "pi0/distributed/grad_reducer.h"
#include "pi0/distributed/process_group.h"
#include "pi0/distributed/shard_layout.h"

namespace pi0::distributed {

class ShardedGradReducer {
 public:
  /// `params`: the trainable parameters in registration order (all on pg.device()); `layout`: their ShardLayout;
  /// `bucket_bytes`: target bucket size (dist.bucket_size_mb · 2^20); `window_bytes`: reductions in flight.
  ShardedGradReducer(ProcessGroup& pg, std::vector<std::pair<std::string, torch::Tensor>> params,
                     const ShardLayout& layout, int64_t bucket_bytes, int64_t window_bytes);
  ~ShardedGradReducer();
  ShardedGradReducer(const ShardedGradReducer&) = delete;
  ShardedGradReducer& operator=(const ShardedGradReducer&) = delete;

  /// After each backward: finishes its reductions; every trainable .grad is undefined afterwards.
  void wait();
  /// After the last micro-step's wait(): this rank's owned gradient pieces (aligned with layout.owned_by(rank)),
  /// averaged over ranks; undefined where the parameter got no gradient since clear().
  std::vector<torch::Tensor> finish_step();
  /// Drops the accumulated pieces (after the optimizer step, or a skipped one).
  void clear();

  /// Bytes of gradient accumulators this rank holds now.
  int64_t held_bytes() const;
  const GradReducerStats& stats() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace pi0::distributed
