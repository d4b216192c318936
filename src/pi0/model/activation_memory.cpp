#include "pi0/model/activation_memory.h"

#include <algorithm>

#include "pi0/common/check.h"

namespace pi0::model {

namespace {

// Bytes one Gemma layer keeps per token of its own expert (norms, MLP, gated residuals).
int64_t gemma_expert_bytes_per_token(const GemmaOptions& g, int64_t e, bool gated) {
  // Each norm (nn::rms_norm) keeps its input and, for the next projection, its output, both in e (plus a float32
  // statistic per token, negligible).
  const int64_t norms = 2 * 2 * e * g.width;
  // GeGLU (nn::gelu_tanh_mul) keeps the gate and up projections, the down projection its input.
  const int64_t mlp = 3 * e * g.mlp_dim;
  return norms + mlp + (gated ? 2 * e * g.width : 0);
}

// Bytes the joint attention of one layer keeps per token: q regrouped for the matmul, k, v and the output.
int64_t attention_bytes_per_token(const GemmaOptions& g, int64_t e) {
  return e * g.head_dim * (2 * g.num_heads + 2 * g.num_kv_heads);
}

}  // namespace

ActivationMemory activation_memory(const Pi0Options& o, int64_t batch, int64_t num_cameras, int64_t compute_bytes,
                                   const CheckpointedLayers& checkpointed, const TextBlocks& blocks,
                                   const GradientReach& reach) {
  PI0_CHECK(batch > 0 && num_cameras > 0, "batch and num_cameras must be positive");
  const auto all = all_layers(o);
  PI0_CHECK(checkpointed.vision >= 0 && checkpointed.vision <= all.vision && checkpointed.language >= 0 &&
                checkpointed.language <= all.language,
            "checkpointed layers (", checkpointed.vision, ", ", checkpointed.language, ") outside 0..", all.vision,
            " and 0..", all.language);
  PI0_CHECK(compute_bytes == 2 || compute_bytes == 4, "compute_bytes must be 2 or 4 (got ", compute_bytes, ")");
  PI0_CHECK(blocks.fast >= 0 && blocks.subtask >= 0 && (!blocks.any() || o.pi05),
            "the FAST and subtask blocks (knowledge insulation, subtask prediction: pi0.5 only) must be >= 0 (got ",
            blocks.fast, ", ", blocks.subtask, ")");
  const int64_t e = compute_bytes;
  const auto& p = o.paligemma;
  const auto& x = o.action_expert;
  const auto& s = o.siglip;
  const int64_t patches = s.num_patches();
  const int64_t tp = num_cameras * patches + o.max_token_len;  // prefix tokens
  const int64_t ts = o.action_horizon + (o.pi05 ? 0 : 1);     // suffix tokens
  const int64_t t = tp + ts;
  const int64_t images = batch * num_cameras;
  const int64_t f = blocks.fast, tt = blocks.subtask;
  const bool two_pass = blocks.any();  // compute_prefix_loss: the backbone's pass, then the expert's
  const int64_t tb = tp + tt + f;      // the backbone's rows [P; T; F]
  const int64_t seen = tp + tt;        // the rows whose keys/values the expert reads
  // In two passes, pass 2 concatenates a copy of the P ∪ T keys/values (detached under insulation) before the
  // suffix's.
  const int64_t kv_p = 2 * e * p.num_kv_heads * p.head_dim;  // bytes of one token's keys and values in one layer
  const int64_t kv_copy = two_pass ? batch * kv_p * seen : 0;

  // One joint layer (both experts; in two passes a pass-1 layer and a pass-2 layer) and one SigLIP layer over the
  // whole batch.
  const int64_t logits = two_pass ? batch * p.num_heads * (tb * tb + ts * (seen + ts)) : batch * p.num_heads * t * t;
  const int64_t largest_logits = two_pass ? batch * p.num_heads * std::max(tb * tb, ts * (seen + ts)) : logits;
  const int64_t per_logit = e == 4 ? 4 : 4 + e;  // float32 softmax output (+ its cast to e when that is a copy)
  // A part backward does not reach keeps nothing (GradientReach).
  const int64_t joint_layer = batch * ((reach.prefix ? tb * gemma_expert_bytes_per_token(p, e, false) : 0) +
                                       ts * gemma_expert_bytes_per_token(x, e, o.pi05) +
                                       (tb + ts) * attention_bytes_per_token(p, e)) +
                              logits * per_logit + kv_copy;
  const int64_t vision_heads = s.num_heads;
  const int64_t vision_layer =
      reach.vision ? images * patches * (2 * (4 + e) * s.width + 4 * e * s.width + 2 * e * s.mlp_dim) +
                         images * vision_heads * patches * patches * per_logit
                   : 0;
  // Inputs the checkpointed layers keep: the residual streams in e (and the [B,We] adaRMS condition, negligible);
  // in two passes also each pass-1 layer's cached keys/values, which pass 2 reads.
  const int64_t joint_inputs = batch * (tb * p.width + ts * x.width) * e + (two_pass ? batch * kv_p * tb : 0);
  const int64_t vision_inputs = reach.vision ? images * patches * s.width * e : 0;
  // Around the layers: image patches, the SigLIP output and projection, the prefix embedding, the final norms.
  const int64_t outside = (reach.vision ? images * patches * (3 * s.patch_size * s.patch_size * 4 + 2 * s.width * e +
                                                              p.width * e)
                                        : 0) +
                          batch * (tb * p.width + ts * x.width) * (8 + e);
  // The cross-entropies' float32 logits at every target row (B·F and B·T of them at most), kept for the
  // log-softmax.
  const int64_t fast_logits = batch * f * p.vocab_size * 4, subtask_logits = batch * tt * p.vocab_size * 4;

  // The model never recomputes the last joint layer, so depth − 1 and depth checkpointed joint layers are the same
  // run: both are planned as the whole stack checkpointed, whose figure counts the last layer as its input (its
  // tensors and a recomputed layer are never alive together, and the recomputed-layer term covers them).
  const int64_t cv = reach.vision ? checkpointed.vision : 0;  // a frozen SigLIP is never recomputed
  const int64_t cl = checkpointed.language > 0 && checkpointed.language >= p.depth - 1 ? p.depth : checkpointed.language;
  const int64_t inputs = cv * vision_inputs + cl * joint_inputs;
  const int64_t whole_vision = (s.depth - cv) * vision_layer, whole_joint = (p.depth - cl) * joint_layer;
  // The three moments of the file comment: forward's end; a joint layer recomputed (the later, whole joint layers
  // already freed); a SigLIP layer recomputed. The joint inputs are kept in the last, as the whole-stack figure
  // always has (backward has freed most of them by then).
  int64_t held = whole_vision + whole_joint;
  if (cl > 0) held = std::max(held, whole_vision + joint_layer);
  if (cv > 0) held = std::max(held, vision_layer);
  ActivationMemory m;
  m.saved = inputs + outside + held + fast_logits + subtask_logits;
  m.last_layer = reach.vision ? vision_layer : joint_layer;  // the first layer backward differentiates
  // The float32 logits of one layer and their gradient in backward, or SigLIP's for all images, or one chunk of a
  // cross-entropy's logits with their gradient (each block has chunks of its own).
  m.transient = 8 * std::max({largest_logits, reach.vision ? images * vision_heads * patches * patches : 0,
                              std::min(kKiLogitChunk, batch * f) * p.vocab_size,
                              std::min(kKiLogitChunk, batch * tt) * p.vocab_size});
  m.ki_logits = fast_logits;
  m.subtask_logits = subtask_logits;
  m.kv_copies = (p.depth - cl) * kv_copy;
  return m;
}

ActivationMemory activation_memory(const Pi0Options& o, int64_t batch, int64_t num_cameras, int64_t compute_bytes,
                                   bool checkpointing, const TextBlocks& blocks, const GradientReach& reach) {
  return activation_memory(o, batch, num_cameras, compute_bytes,
                           checkpointing ? all_layers(o) : CheckpointedLayers{}, blocks, reach);
}

}  // namespace pi0::model
