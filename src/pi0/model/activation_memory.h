// Analytic estimate of the activation memory of one training step (compute_loss forward + backward), derived
// from the tensors autograd keeps for backward in pi0.cpp, gemma.cpp, siglip.cpp and nn/ (like flops.h, from the
// shapes alone). It completes the persistent-memory plan of `pi0-train --print-params` (train/freeze.h), whose
// measured peaks were 15-21 % higher without it (docs/benchmarks.md).
//
// Per transformer layer, in bytes per token (e = compute element size: 2 for bf16 / bf16-mixed, 4 for float32):
//   Gemma layer   2 RMSNorms · (8 + e)·W          (float32 input, normalized value, output fed to the projections)
//                 + e·D·(2N + 2K)                 (q regrouped, k and v for the matmuls, attention output)
//                 + 4e·M                          (GeGLU: gate, gelu(gate), up, product)
//                 + 2e·W with adaRMS gates        (gated residuals keep the projection outputs)
//   + per layer   N·T·S·(4 + e')                  (softmax output in float32, probabilities in e, joint T×S;
//                                                  e' = 0 in float32, where both are the same tensor)
//   SigLIP layer  2 LayerNorms · (4 + e)·Ws + 4e·Ws + 2e·Ms, + Nv·P²·(4 + e') per image
// W, M: width and MLP width; N, K, D: query heads, key/value heads, head dim; T = S = prefix + suffix tokens.
// Without gradient checkpointing every layer's tensors are alive at the end of the forward pass. A checkpointed
// layer keeps only its input, and backward recomputes one layer at a time, so with every layer checkpointed the
// peak holds the inputs of all layers plus the largest single layer. With only the first layers of a stack
// checkpointed (CheckpointedLayers), the peak is the largest of three moments: the end of the forward pass (the
// whole layers and the checkpointed inputs); the recomputation of a joint layer, when backward has freed the later,
// whole joint layers but the whole SigLIP layers are still alive; the recomputation of a SigLIP layer, when only
// inputs are left. Either way the largest transient of the attention (float32 logits and
// their gradient, 8·N·T·S bytes) comes on top. Backward frees a layer's tensors as it creates the gradients of
// that layer's weights, so the step's peak is the larger of "all activations, no gradients yet" and "all
// gradients, plus what the last layer to be differentiated still holds" (train::MemoryPlan::peak_bytes). Biases, LoRA factors (rank ≪ W), norms' per-row statistics
// and the loss's O(B·H·A) tensors are left out: they are < 1 % at the sizes that matter.
#pragma once
#include <cstdint>

#include "pi0/model/pi0.h"

namespace pi0::model {

/// Activation memory of one training step, in bytes.
struct ActivationMemory {
  int64_t saved = 0;      ///< tensors kept for backward at the peak (all layers', or their inputs + one layer)
  int64_t last_layer = 0;  ///< still alive when backward reaches the first layer (the recomputed layer, with
                           ///< checkpointing; else the first SigLIP layer's tensors)
  int64_t transient = 0;  ///< the largest short-lived working set on top (attention logits of one layer)
  int64_t peak() const { return saved + transient; }
};

/// Estimate for a batch of `batch` samples with `num_cameras` images each, computing in `compute_bytes`-byte
/// elements (2 or 4), with the layers of `checkpointed` recomputed in backward (each count 0 to its stack's depth).
ActivationMemory activation_memory(const Pi0Options& o, int64_t batch, int64_t num_cameras, int64_t compute_bytes,
                                   const CheckpointedLayers& checkpointed);
/// The same with every layer checkpointed (all_layers(o)) or none.
ActivationMemory activation_memory(const Pi0Options& o, int64_t batch, int64_t num_cameras, int64_t compute_bytes,
                                   bool checkpointing);

}  // namespace pi0::model
