// What one training step's forward and backward do and hold, counted rather than timed (issue 47: "LoRA that is
// faster because it does less", proven without a GPU): the operations it dispatches by phase and name, counted as
// bench_infer counts sampling's (common/op_count.h; backward's products and gradient checkpointing's recomputation
// included), and the bytes it keeps in weights, cast copies and gradients at the end of backward, measured from the
// model's tensors. `bench_train --count-ops` prints it per row; tests pin what a frozen weight may cost.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pi0/common/op_count.h"
#include "pi0/model/observation.h"
#include "pi0/model/pi0.h"

namespace pi0::train {

struct StepCensus {
  OpCount ops;          ///< the whole forward + backward
  KernelTally kernels;  ///< its kernels by phase ("pi0::forward", "pi0::backward", "pi0::recompute") and name
  int64_t recomputations = 0;  ///< layers gradient checkpointing ran again in backward
  /// Parameters by storage: float32 ones (masters of what trains; frozen ones only under float32) and the rest
  /// (bf16), each split into trainable and frozen.
  int64_t float32_trainable_bytes = 0, float32_frozen_bytes = 0, other_trainable_bytes = 0, other_frozen_bytes = 0;
  int64_t cast_cache_bytes = 0;  ///< nn::Dense's compute-dtype copies alive at the end of backward
  int64_t grad_bytes = 0;        ///< gradients held at the end of backward (every parameter's .grad)
  int64_t frozen_grad_bytes = 0;  ///< of which on parameters that do not train (should be 0)

  /// Kernels of one phase (all phases when empty), summed over names.
  int64_t kernels_in(const std::string& phase = "") const;
  /// Kernels named `name` (e.g. "aten::mm") in `phase` (all phases when empty).
  int64_t kernels_named(const std::string& name, const std::string& phase = "") const;
  nlohmann::json to_json() const;
  /// Lines for a benchmark's output: the totals, the phases, the bytes and the `top` most frequent kernels.
  std::string format(int64_t top = 12) const;
};

/// Runs `model`'s training forward (compute_loss with `noise` and `time`, the mean as the loss) and backward once, as
/// Trainer::train_step does for one micro-batch, counting its operations on this thread; then measures the held
/// bytes and leaves the model as it found it (gradients and cast copies dropped). `batch` on the model's device.
StepCensus census_training_step(model::Pi0Impl& model, const model::Batch& batch, const torch::Tensor& noise,
                                const torch::Tensor& time);

}  // namespace pi0::train
