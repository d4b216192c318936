// Token / position embedding and the SigLIP patch convolution as this library's own modules, so their parameters
// are created on the ParamDeviceScope's device (torch::nn::Embedding and Conv2d always start on the CPU). Names,
// shapes, initialization and random-number use equal torch::nn's, so seeded models are unchanged.
#pragma once
#include <torch/torch.h>

namespace pi0::nn {

/// weight [num, dim], initialized N(0, 1) like torch::nn::Embedding.
class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(int64_t num, int64_t dim);
  /// ids [...] (integer) → [..., dim] in the weight's dtype.
  torch::Tensor forward(const torch::Tensor& ids);
  torch::Tensor weight;
};
TORCH_MODULE(Embedding);

/// Non-overlapping patches: weight [out, in, p, p], bias [out]; stride p, no padding. Initialized like
/// torch::nn::Conv2d (Kaiming-uniform with a = √5, bias U(±1/√fan_in)).
class PatchConvImpl : public torch::nn::Module {
 public:
  PatchConvImpl(int64_t in_channels, int64_t out_channels, int64_t patch);
  /// x [B,in,H,W] → [B,out,H/p,W/p].
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;
  int64_t patch;
};
TORCH_MODULE(PatchConv);

}  // namespace pi0::nn
