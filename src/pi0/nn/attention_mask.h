// Attention mask and RoPE positions from (input_mask, ar_mask), as openpi's make_attn_mask (pi0.py).
// A token may attend to every valid token whose cumulative ar count is ≤ its own: ar=false tokens form
// bidirectional blocks with what precedes them, ar=true starts a new causal block.
#pragma once
#include <torch/torch.h>

namespace pi0::nn {

/// input_mask [B,T] bool, ar_mask [T] or [B,T] bool → allowed [B,T,T] bool (query i, key j).
torch::Tensor make_attn_mask(const torch::Tensor& input_mask, const torch::Tensor& ar_mask);

/// positions = cumsum(input_mask) − 1 (padding does not advance the position), int64 [B,T].
torch::Tensor positions_from_mask(const torch::Tensor& input_mask);

/// A pass whose tokens (input_mask [B,T], ar_mask) follow a cached prefix (prefix_mask [B,Tp]): each token sees
/// the prefix's valid tokens and its own pass's as make_attn_mask allows → [B,T,Tp+T] bool (the cached keys first).
torch::Tensor make_cached_attn_mask(const torch::Tensor& prefix_mask, const torch::Tensor& input_mask,
                                    const torch::Tensor& ar_mask);
/// The positions of such a pass: they continue after the prefix's valid tokens, int64 [B,T].
torch::Tensor positions_after(const torch::Tensor& prefix_mask, const torch::Tensor& input_mask);

/// Value added to masked attention logits (openpi gemma.py big_neg).
constexpr double kMaskValue = -2.3819763e38;

}  // namespace pi0::nn
