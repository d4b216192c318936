// Gradient synchronisation of one optimizer step, whatever the data-parallel strategy: the trainer calls the same
// four points in the same order (before and after each micro-step's backward, the gradients to apply, after the
// update) and one of these does the work behind them:
//   none       one process: gradients stay where backward put them
//   DDP        dist.shard=none: bucketed all-reduce overlapped with backward (grad_reducer.h)
//   ZeRO-1     dist.shard=optimizer: the same all-reduce; this rank's AdamW and EMA update only its share of the
//              elements (parameter_shards.h), which is then broadcast to every rank
//   ZeRO-2     dist.shard=gradients: each gradient piece reduced to its owner only (sharded_grad_reducer.h)
// torchtitan's parallelize step plays the same part: the train step does not branch on the strategy.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "pi0/distributed/grad_reducer.h"
#include "pi0/distributed/parameter_shards.h"
#include "pi0/distributed/process_group.h"
#include "pi0/distributed/shard_layout.h"

namespace pi0::distributed {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

class GradSync {
 public:
  virtual ~GradSync() = default;

  /// What this rank's optimizer and EMA update: every trainable parameter, or (sharded) 1-D views of the elements
  /// it owns, aligned with gradients().
  virtual const NamedTensors& updated() const = 0;
  /// This rank's share of the parameters when the optimizer state is partitioned (checkpoints save and restore
  /// exactly these pieces); null otherwise.
  virtual const ParameterShards* shards() const { return nullptr; }

  /// Before the backward of micro-step `micro` of `n` (gradient accumulation).
  virtual void before_backward(int64_t micro, int64_t n) { (void)micro, (void)n; }
  /// After that backward.
  virtual void after_backward(int64_t micro, int64_t n) { (void)micro, (void)n; }
  /// After the last micro-step: the gradients this rank's optimizer applies (aligned with updated()), averaged
  /// over ranks; undefined where a parameter got no gradient.
  virtual std::vector<torch::Tensor> gradients() = 0;
  /// Bytes of gradient this rank holds now (after gradients(), before the update).
  virtual int64_t held_grad_bytes() const;
  /// Sums a squared gradient norm over ranks where each holds a disjoint part of the gradient; empty (the local
  /// value is the global one) where every rank holds all of it.
  virtual std::function<double(double)> norm_sum_over_ranks() const { return {}; }
  /// After the optimizer step: every rank's updated elements reach all ranks (sharded), before the EMA.
  virtual void after_update() {}
  /// Drops every trainable gradient (after the update, or a skipped one).
  virtual void clear();
  /// Reduction statistics (nullptr in single-process runs).
  virtual const GradReducerStats* stats() const { return nullptr; }
  /// One line for the start-up log; empty in single-process runs.
  virtual std::string describe() const { return ""; }

 protected:
  explicit GradSync(NamedTensors trainable) : trainable_(std::move(trainable)) {}
  NamedTensors trainable_;  ///< every trainable parameter, whatever this rank's share
};

/// The strategy for `mode` (none without a process group); `bucket_bytes` = dist.bucket_size_mb · 2^20.
std::unique_ptr<GradSync> make_grad_sync(ShardMode mode, std::shared_ptr<ProcessGroup> pg, NamedTensors trainable,
                                         int64_t bucket_bytes);

}  // namespace pi0::distributed
