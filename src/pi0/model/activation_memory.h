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
//
// Knowledge insulation (train.ki, docs/ki.md: Pi0Impl::compute_ki_loss) replaces the joint pass by two passes and
// adds, with F = train.ki.max_fast_tokens and Tp' = Tp + F:
//   pass 1 (backbone)  Tp' prefix tokens through the prefix expert: the Gemma terms above at Tp', its attention
//                      logits N·Tp'²
//   pass 2 (expert)    the Ts suffix tokens against the P keys/values: logits N·Ts·(Tp + Ts), and per layer a copy of
//                      the detached P keys and values, concatenated before the suffix's for the attention and kept
//                      for its backward: 2e·K·D·Tp per sample ("detached K/V copies")
//   checkpointed       a recomputed pass-1 layer's cached keys/values stay alive for pass 2: 2e·K·D·Tp' per sample
//   CE logits          float32 logits over the vocabulary at every FAST target row, B·F·V·4, kept for the
//                      log-softmax's backward (computed only at those rows, in chunks of 256 rows, which bounds the
//                      transient: the logits' gradient and exp of one chunk, 8·min(256, B·F)·V)
// Subtask prediction (train.subtask, docs/subtask.md) runs the same two passes (with or without insulation; the
// expert's K/V are detached only under insulation, but copied either way) with T = train.subtask.max_tokens more
// backbone rows [P; T; F], which the expert reads too: pass 2 attends to Tp + T keys/values (logits
// N·Ts·(Tp + T + Ts), K/V copies 2e·K·D·(Tp + T)), and the block's own CE keeps float32 logits at its target
// rows, B·T·V·4 at most (the cue's rows are never targets, but its length is the tokenizer's: the plan takes T),
// in chunks of 256 rows of their own.
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
  /// The text blocks' own terms, parts of `saved` (0 without them): the float32 CE logits at the FAST target rows
  /// (knowledge insulation) and at the subtask target rows (subtask prediction), and the copies of the prefix keys
  /// and values (P and the subtask block) the expert's pass concatenates before its own (of the layers whole at the
  /// peak; detached under insulation).
  int64_t ki_logits = 0, subtask_logits = 0, kv_copies = 0;
  int64_t peak() const { return saved + transient; }
};

/// Which parts of the model backward reaches (train::plan_memory derives it from the trainable flags). A part no
/// gradient passes through records no graph, so it keeps nothing for backward and nn::checkpoint never recomputes
/// it: a frozen SigLIP under `lora-only`, `freeze-vision` or `action-expert-only`; the prefix expert's own tensors
/// (norms, MLP) when nothing at or below it trains (`action-expert-only`, `projection-only`). The joint attention
/// keeps its tensors whenever the suffix trains (its queries, keys and values are one tensor each).
struct GradientReach {
  bool vision = true;  ///< some SigLIP parameter trains
  bool prefix = true;  ///< the prefix tokens' hidden states need gradients (SigLIP, the projector, the embedding or
                       ///< a prefix Gemma parameter or LoRA factor trains)
};

/// Rows of the FAST cross-entropy's logits computed at once (Pi0Impl::compute_ki_loss's default chunk).
constexpr int64_t kKiLogitChunk = 256;

/// The text blocks the backbone reads after the prompt (Pi0Impl::compute_prefix_loss), in tokens per sample; either
/// one turns the joint pass into the backbone's pass and the expert's.
struct TextBlocks {
  int64_t fast = 0;     ///< F: train.ki.max_fast_tokens with knowledge insulation (pi0.5 only), else 0
  int64_t subtask = 0;  ///< T: train.subtask.max_tokens with subtask prediction (pi0.5 only), else 0
  bool any() const { return fast > 0 || subtask > 0; }
};

/// Estimate for a batch of `batch` samples with `num_cameras` images each, computing in `compute_bytes`-byte
/// elements (2 or 4), with the layers of `checkpointed` recomputed in backward (each count 0 to its stack's depth).
/// `blocks`: the FAST and subtask blocks' lengths (none by default).
/// `reach`: the parts backward reaches (by default all: a full fine-tune).
ActivationMemory activation_memory(const Pi0Options& o, int64_t batch, int64_t num_cameras, int64_t compute_bytes,
                                   const CheckpointedLayers& checkpointed, const TextBlocks& blocks = {},
                                   const GradientReach& reach = {});
/// The same with every layer checkpointed (all_layers(o)) or none.
ActivationMemory activation_memory(const Pi0Options& o, int64_t batch, int64_t num_cameras, int64_t compute_bytes,
                                   bool checkpointing, const TextBlocks& blocks = {}, const GradientReach& reach = {});

}  // namespace pi0::model
