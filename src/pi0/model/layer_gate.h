// A hook the model calls before each transformer layer runs. With train.offload the host updates the weights in the
// forward's order while the next step already runs, and the forward waits at each layer only until that layer's
// weights have landed on the device (train/offload.h).
#pragma once
#include <cstdint>
#include <functional>

namespace pi0::model {

enum class LayerStack {
  kVision,  ///< SigLIP's encoder layers
  kJoint,   ///< the joint Gemma layers (both experts: one attention over prefix and suffix)
};

/// Called with the stack and the layer's index before the layer's forward (not before a recomputation in backward:
/// the weights a recomputation reads have been in place since that layer's forward).
using LayerGate = std::function<void(LayerStack stack, int64_t layer)>;

}  // namespace pi0::model
