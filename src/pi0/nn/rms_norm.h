// RMSNorm and adaptive RMSNorm of Gemma (openpi gemma.py RMSNorm; PT GemmaRMSNorm).
// Plain:    y = n·(1 + weight), n = x / sqrt(mean(x²) + 1e-6); `weight` is stored as the offset (init 0).
// Adaptive: [scale, shift, gate] = dense(cond) (W → 3W, zero-initialized), y = n·(1 + scale) + shift, and the
//           gate is returned to multiply the residual branch. Computed in float32, returned in x's dtype.
#pragma once
#include <utility>

#include <torch/torch.h>

#include "pi0/nn/dense.h"

namespace pi0::nn {

struct RMSNormOptions {
  explicit RMSNormOptions(int64_t width) : width_(width) {}
  TORCH_ARG(int64_t, width);
  /// Width of the conditioning vector; 0 = plain RMSNorm, > 0 = adaptive (pi0.5 action expert).
  TORCH_ARG(int64_t, cond_dim) = 0;
  TORCH_ARG(double, eps) = 1e-6;
};

class RMSNormImpl : public torch::nn::Module {
 public:
  explicit RMSNormImpl(RMSNormOptions options);
  void reset();
  /// x [B,T,W]; cond [B,C] or [B,T,C] per token (required iff adaptive). Returns (y [B,T,W] in x's dtype, gate
  /// [B,1,W] or [B,T,W], or undefined).
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x, const torch::Tensor& cond = {});
  bool adaptive() const { return options.cond_dim() > 0; }

  RMSNormOptions options;
  torch::Tensor weight;  ///< [W] offset scale, plain norm only
  Dense dense{nullptr};  ///< W_cond → 3W, adaptive norm only
};
TORCH_MODULE(RMSNorm);

/// The normalization both norms compute: n·(1 + scale) [+ shift] in x's dtype, n = x / sqrt(mean(x²) + eps) in
/// float32 (float64 for float64 x); `scale` is a plain norm's [W] weight or an adaptive norm's modulation
/// ([B,1,W] or [B,T,W], like `shift`). Differentiable in all three with a backward of its own that keeps x and one
/// float32 statistic per row, not float32 copies of x and n (the composite's).
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& scale, const torch::Tensor& shift, double eps);

}  // namespace pi0::nn
