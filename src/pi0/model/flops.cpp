#include "pi0/model/flops.h"

#include "pi0/common/check.h"

namespace pi0::model {

namespace {
// x [tokens,in] · Wᵀ [in,out], plus the LoRA path x·Aᵀ·Bᵀ when rank > 0.
int64_t linear(int64_t tokens, int64_t in, int64_t out, int64_t lora_rank = 0) {
  int64_t f = 2 * tokens * in * out;
  if (lora_rank > 0) f += 2 * tokens * lora_rank * (in + out);
  return f;
}

// Logits q·kᵀ and probs·v for `heads` query heads of head_dim d: T queries against S keys each.
int64_t attention(int64_t batch, int64_t heads, int64_t head_dim, int64_t t, int64_t s) {
  return 2 * (2 * batch * heads * t * s * head_dim);
}

// One Gemma decoder layer's projections (q, k, v, o, gate, up, down) over `tokens` rows.
int64_t gemma_layer_linear(const GemmaOptions& g, int64_t tokens) {
  const int64_t q = g.num_heads * g.head_dim, kv = g.num_kv_heads * g.head_dim, r = g.lora_rank;
  return linear(tokens, g.width, q, r) + 2 * linear(tokens, g.width, kv, r) + linear(tokens, q, g.width, r) +
         2 * linear(tokens, g.width, g.mlp_dim, r) + linear(tokens, g.mlp_dim, g.width, r);
}

struct Lengths {
  int64_t patches, prefix, suffix;
};
Lengths lengths(const Pi0Options& o, int64_t num_cameras) {
  const int64_t p = o.siglip.num_patches();
  return {p, num_cameras * p + o.max_token_len, o.action_horizon + (o.pi05 ? 0 : 1)};
}

int64_t vision_flops(const Pi0Options& o, int64_t images) {
  const auto& s = o.siglip;
  const int64_t p = s.num_patches(), rows = images * p;
  int64_t f = 2 * rows * s.width * (3 * s.patch_size * s.patch_size);  // patch conv = one GEMM per patch
  const int64_t block = 4 * linear(rows, s.width, s.width) + attention(images, s.num_heads, s.width / s.num_heads, p, p) +
                        linear(rows, s.width, s.mlp_dim) + linear(rows, s.mlp_dim, s.width);
  return f + s.depth * block;
}

int64_t suffix_layers_linear(const Pi0Options& o, int64_t batch, int64_t ts) {
  const auto& e = o.action_expert;
  int64_t f = e.depth * gemma_layer_linear(e, batch * ts);
  // pi0.5 adaRMS: each of the 2·depth + 1 norms maps cond [B,We] to scale/shift/gate [B,3·We].
  if (o.pi05) f += (2 * e.depth + 1) * linear(batch, e.width, 3 * e.width);
  return f;
}

int64_t action_io_flops(const Pi0Options& o, int64_t batch) {
  const int64_t we = o.action_expert.width, a = o.action_dim, bh = batch * o.action_horizon;
  int64_t f = linear(bh, a, we) + linear(bh, we, a);  // action_in_proj, action_out_proj
  if (o.pi05) {
    f += 2 * linear(batch, we, we);  // time_mlp_in, time_mlp_out
  } else {
    f += linear(batch, a, we) + linear(bh, 2 * we, we) + linear(bh, we, we);  // state_proj, action_time_mlp
  }
  return f;
}
}  // namespace

ForwardFlops forward_flops(const Pi0Options& o, int64_t batch, int64_t num_cameras) {
  PI0_CHECK(batch > 0 && num_cameras > 0, "batch and num_cameras must be positive");
  const auto len = lengths(o, num_cameras);
  const auto& p = o.paligemma;
  const int64_t t = len.prefix + len.suffix;
  ForwardFlops f;
  f.vision = vision_flops(o, batch * num_cameras);
  f.projector = linear(batch * num_cameras * len.patches, o.siglip.width, p.width);
  f.prefix_linear = p.depth * gemma_layer_linear(p, batch * len.prefix);
  f.suffix_linear = suffix_layers_linear(o, batch, len.suffix);
  f.attention = p.depth * attention(batch, p.num_heads, p.head_dim, t, t);
  f.action_io = action_io_flops(o, batch);
  return f;
}

int64_t training_step_flops(const Pi0Options& o, int64_t batch, int64_t num_cameras) {
  return 3 * forward_flops(o, batch, num_cameras).total();
}

int64_t sampling_flops(const Pi0Options& o, int64_t batch, int64_t num_cameras, int64_t num_steps,
                       bool use_kv_cache) {
  PI0_CHECK(num_steps > 0, "num_steps must be positive");
  const auto full = forward_flops(o, batch, num_cameras);
  const int64_t once = full.vision + full.projector;  // embed_prefix runs once in sample_actions
  if (!use_kv_cache) return once + num_steps * (full.prefix_linear + full.suffix_linear + full.attention + full.action_io);
  const auto len = lengths(o, num_cameras);
  const auto& p = o.paligemma;
  const int64_t prefix_pass = full.prefix_linear + p.depth * attention(batch, p.num_heads, p.head_dim, len.prefix, len.prefix);
  const int64_t suffix_pass = full.suffix_linear + full.action_io +
                              p.depth * attention(batch, p.num_heads, p.head_dim, len.suffix, len.prefix + len.suffix);
  return once + prefix_pass + num_steps * suffix_pass;
}

}  // namespace pi0::model
