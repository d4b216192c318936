#include "pi0/model/activation_memory.h"

#include <algorithm>

#include "pi0/common/check.h"

namespace pi0::model {

namespace {

// Bytes one Gemma layer keeps per token of its own expert (norms, MLP, gated residuals).
int64_t gemma_expert_bytes_per_token(const GemmaOptions& g, int64_t e, bool gated) {
  const int64_t norms = 2 * (8 + e) * g.width;  // float32 input and normalized value, output in e
  const int64_t mlp = 4 * e * g.mlp_dim;
  return norms + mlp + (gated ? 2 * e * g.width : 0);
}

// Bytes the joint attention of one layer keeps per token: q regrouped for the matmul, k, v and the output.
int64_t attention_bytes_per_token(const GemmaOptions& g, int64_t e) {
  return e * g.head_dim * (2 * g.num_heads + 2 * g.num_kv_heads);
}

}  // namespace

ActivationMemory activation_memory(const Pi0Options& o, int64_t batch, int64_t num_cameras, int64_t compute_bytes,
                                   bool checkpointing) {
  PI0_CHECK(batch > 0 && num_cameras > 0, "batch and num_cameras must be positive");
  PI0_CHECK(compute_bytes == 2 || compute_bytes == 4, "compute_bytes must be 2 or 4 (got ", compute_bytes, ")");
  const int64_t e = compute_bytes;
  const auto& p = o.paligemma;
  const auto& x = o.action_expert;
  const auto& s = o.siglip;
  const int64_t patches = s.num_patches();
  const int64_t tp = num_cameras * patches + o.max_token_len;  // prefix tokens
  const int64_t ts = o.action_horizon + (o.pi05 ? 0 : 1);     // suffix tokens
  const int64_t t = tp + ts;
  const int64_t images = batch * num_cameras;

  // One joint layer (both experts) and one SigLIP layer over the whole batch.
  const int64_t logits = batch * p.num_heads * t * t;
  const int64_t per_logit = e == 4 ? 4 : 4 + e;  // float32 softmax output (+ its cast to e when that is a copy)
  const int64_t joint_layer = batch * (tp * gemma_expert_bytes_per_token(p, e, false) +
                                       ts * gemma_expert_bytes_per_token(x, e, o.pi05) +
                                       t * attention_bytes_per_token(p, e)) +
                              logits * per_logit;
  const int64_t vision_heads = s.num_heads;
  const int64_t vision_layer = images * patches * (2 * (4 + e) * s.width + 4 * e * s.width + 2 * e * s.mlp_dim) +
                               images * vision_heads * patches * patches * per_logit;
  // Inputs the checkpointed layers keep: the residual streams in e (and the [B,We] adaRMS condition, negligible).
  const int64_t joint_inputs = batch * (tp * p.width + ts * x.width) * e;
  const int64_t vision_inputs = images * patches * s.width * e;
  // Around the layers: image patches, the SigLIP output and projection, the prefix embedding, the final norms.
  const int64_t outside = images * patches * (3 * s.patch_size * s.patch_size * 4 + 2 * s.width * e + p.width * e) +
                          batch * (tp * p.width + ts * x.width) * (8 + e);

  ActivationMemory m;
  if (checkpointing) {
    m.saved = p.depth * joint_inputs + s.depth * vision_inputs + outside + std::max(joint_layer, vision_layer);
    m.last_layer = vision_layer;
  } else {
    m.saved = p.depth * joint_layer + s.depth * vision_layer + outside;
    m.last_layer = vision_layer;
  }
  // The float32 logits of one layer and their gradient in backward, or SigLIP's for all images.
  m.transient = 8 * std::max(logits, images * vision_heads * patches * patches);
  return m;
}

}  // namespace pi0::model
