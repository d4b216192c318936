// Bucketed gradient all-reduce for data-parallel training (what torch DDP's Reducer does, reduced to what the
// trainer needs). Trainable parameters are packed into buckets of about dist.bucket_size_mb, one dtype per bucket,
// filled in reverse registration order: the order in which backward produces their gradients. Each parameter's
// AccumulateGrad node gets a post hook; when the last gradient of a bucket has been accumulated, the bucket is
// copied into a flat buffer and its all-reduce starts asynchronously while backward continues. wait() finishes
// the step: it launches what never became ready (unused parameters count as zeros), waits, divides by the world
// size and copies the averages back into the .grad tensors.
// The trigger is a GradAccumulationHooks callback (grad_hooks.h says why it is the AccumulateGrad post hook).
//
// Launch order: buckets are launched strictly in index order (a ready bucket waits for its predecessors), so every
// rank issues the same collectives in the same order even if hooks fire in a slightly different order.
// Re-entrant gradient checkpointing may accumulate a parameter more than once per backward (one inner backward per
// use); a second accumulation after its bucket was launched marks the bucket for a second all-reduce in wait(),
// which is exact and, since all ranks run the same graph, issued by all ranks alike.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "pi0/distributed/process_group.h"

namespace pi0::distributed {

struct GradReducerStats {
  int64_t steps = 0;            ///< synchronized backward passes reduced
  double wait_seconds = 0;      ///< time spent inside wait(): communication not hidden behind backward
  double comm_seconds = 0;      ///< per step, first launch → last completion, summed: the communication span
  int64_t late_launches = 0;    ///< buckets launched by wait() (unused parameters), summed over steps
  int64_t rereductions = 0;     ///< buckets reduced twice (parameter accumulated after its bucket was launched)
};

class GradReducer {
 public:
  /// `params`: the trainable parameters in registration order (name, tensor); all on pg.device().
  /// `bucket_bytes`: target bucket size (dist.bucket_size_mb · 2^20); a parameter larger than that gets its own.
  GradReducer(ProcessGroup& pg, std::vector<std::pair<std::string, torch::Tensor>> params, int64_t bucket_bytes);
  ~GradReducer();  ///< detaches the hooks
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  /// false on non-final gradient-accumulation micro-steps: hooks do nothing, gradients just accumulate locally.
  void enable_sync(bool sync);
  /// After the synchronized backward: every trainable .grad holds the mean over ranks (undefined grads of
  /// parameters no rank used stay undefined). Throws DistError when a peer fails.
  void wait();

  int64_t num_buckets() const;
  /// Parameter names per bucket (tests, logs).
  std::vector<std::vector<std::string>> bucket_names() const;
  const GradReducerStats& stats() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace pi0::distributed
