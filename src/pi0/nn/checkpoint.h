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
/// mode this is a plain call. `params`: fn's parameters; those that train make the outputs require grad even
/// when no input does (a layer after frozen embeddings), and they get their gradients from the recomputation.
/// Backward recomputes fn only when some output received a gradient (a frozen stack is never recomputed) and
/// differentiates only the outputs that did.
TensorList checkpoint(const CheckpointFn& fn, const TensorList& inputs, const TensorList& params = {});
/// checkpoint() with `module`'s parameters as `params`.
TensorList checkpoint(const CheckpointFn& fn, const TensorList& inputs, torch::nn::Module& module);
/// How many recomputations checkpoint() has run in this process (tests count them).
int64_t checkpoint_recomputations();

}  // namespace pi0::nn
