// A callback after each trainable parameter's gradient has been accumulated into its .grad: the trigger both
// gradient reducers (plain all-reduce and sharded reduce) start their communication from.
//
// Why a post hook on the AccumulateGrad node and not Tensor::register_hook: a tensor hook sees the incoming
// gradient of one backward before it is added to .grad, so with gradient accumulation it would see only the last
// micro-step; the AccumulateGrad post hook runs after the addition and reads the complete .grad. (2.1+ has
// Tensor::register_post_accumulate_grad_hook for the same thing; 1.13 does not.) The node is held here so every
// graph reuses it and the hook stays attached.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include <torch/torch.h>

namespace torch::autograd {
struct Node;
}

namespace pi0::distributed {

class GradAccumulationHooks {
 public:
  /// `params`: trainable leaf parameters; `on_accumulated(i)` runs on the autograd thread after params[i]'s .grad
  /// has been updated (possibly more than once per backward, e.g. under re-entrant checkpointing).
  GradAccumulationHooks(const std::vector<torch::Tensor>& params, std::function<void(size_t)> on_accumulated);
  ~GradAccumulationHooks();  ///< detaches the hooks
  GradAccumulationHooks(const GradAccumulationHooks&) = delete;
  GradAccumulationHooks& operator=(const GradAccumulationHooks&) = delete;

 private:
  std::shared_ptr<std::function<void(size_t)>> callback_;
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks_;
};

}  // namespace pi0::distributed
