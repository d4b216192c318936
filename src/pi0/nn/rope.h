// Rotary position embedding, split-half ("rotate_half") layout, theta 10000 (openpi gemma.py _apply_rope).
#pragma once
#include <torch/torch.h>

namespace pi0::nn {

/// x [B,T,H,D] (any float dtype), positions [B,T] integer. Computed in float32, returned in x's dtype:
/// θ_i = pos / theta^(2i/D), out = [x1·cosθ − x2·sinθ ; x2·cosθ + x1·sinθ] with x1 = x[..., :D/2].
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& positions, double theta = 10000.0);

/// cos θ and sin θ [B,T,1,D/2] for `positions` [B,T], in `dtype` (float32, or float64 for gradient checks). They
/// depend on the positions only, so a forward computes them once for all layers (and a checkpointed layer's
/// recomputation reuses them) instead of once per q/k projection per layer.
struct RopeTables {
  torch::Tensor cos, sin;
};
RopeTables rope_tables(const torch::Tensor& positions, int64_t head_dim, torch::ScalarType dtype,
                       double theta = 10000.0);
/// apply_rope with precomputed tables (same arithmetic, same result).
torch::Tensor apply_rope(const torch::Tensor& x, const RopeTables& tables);

/// The same rotation as whole-width tables [B,T,1,D]: cos θ over both halves, and sin θ signed (−sin θ on the first
/// half, +sin θ on the second), so that out = x·cos + roll(x, D/2)·sin. Made once per pass for inference, where
/// it turns apply_rope's nine kernels into five (same products; the sum may be fused, a float32 rounding apart).
struct RotaryTables {
  torch::Tensor cos, sin;
};
RotaryTables rotary_tables(const RopeTables& tables);
torch::Tensor apply_rope(const torch::Tensor& x, const RotaryTables& tables);

/// Tables for a stacked [q | k | v] projection viewed as [B,T,R+P,D]: the rotation on the first R heads and the
/// identity on the last P (cos 1, sin 0), so one pass rotates q and k and passes v through unchanged (exactly:
/// v·1 + roll(v)·0, for finite v). [B,T,R+P,D], made once per pass of the simplified weights.
RotaryTables rotary_tables(const RopeTables& tables, int64_t rotated_heads, int64_t plain_heads);

/// apply_rope(x, tables) = x·cos + roll(x, D/2)·sin in two halves, for a pass that writes heads of the result to
/// different places: the factors once, then rope_heads for each destination. x stays in its dtype: the product
/// with the float32 table promotes (float32 arithmetic, no upcast pass, no trailing cast), so a bf16 pass is 3
/// operations plus one per extra destination instead of 5, with the same bits (the upcast of bf16 is exact and
/// every sum is float32 either way; the result rounds once).
struct RopeFactors {
  torch::Tensor xc;  ///< x·cos, the tables' dtype
  torch::Tensor xr;  ///< roll(x, D/2), x's dtype
  torch::Tensor sin;
};
RopeFactors rope_factors(const torch::Tensor& x, const RotaryTables& tables);
/// Heads [h0, h0+nh) of the rotation in `out`'s dtype, written into `out` (any strides; [B,T,nh,D] or a view of
/// that many elements in the same order, e.g. [B,T,K,G,D]). Under autograd (out= is not differentiable) returns
/// the heads as a new tensor of x's dtype instead and leaves `out` alone.
torch::Tensor rope_heads(const RopeFactors& f, int64_t h0, int64_t nh, torch::Tensor out);

/// Sinusoidal timestep embedding (openpi posemb_sincos): t [B] → [B, dim], sin half first; computed in float64.
torch::Tensor posemb_sincos(const torch::Tensor& t, int64_t dim, double min_period = 4e-3, double max_period = 4.0);

}  // namespace pi0::nn
