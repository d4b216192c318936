// Activation (gradient) checkpointing: run a function without keeping its activations and recompute it in
// backward. Used per transformer layer. The function must be deterministic (no dropout in these models), and
// its parameters receive their gradients through a re-entrant backward over the recomputed graph, exactly as
// PyTorch's reentrant torch.utils.checkpoint does.
#pragma once
#include <functional>

#include <torch/torch.h>

namespace pi0::nn {

using TensorList = std::vector<torch::Tensor>;
using CheckpointFn = std::function<TensorList(const TensorList&)>;

/// Calls fn(inputs), saving only `inputs`. Undefined tensors may appear in inputs and outputs. Without grad
/// mode this is a plain call.
TensorList checkpoint(const CheckpointFn& fn, const TensorList& inputs);

}  // namespace pi0::nn
