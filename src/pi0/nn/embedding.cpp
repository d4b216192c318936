#include "pi0/nn/embedding.h"

#include <cmath>

#include "pi0/nn/matmul.h"
#include "pi0/nn/param_device.h"

namespace pi0::nn {

EmbeddingImpl::EmbeddingImpl(int64_t num, int64_t dim) {
  weight = register_parameter("weight", torch::empty({num, dim}, param_options()));
  if (skip_init()) return;
  torch::NoGradGuard no_grad;
  weight.normal_(0.0, 1.0);
}

torch::Tensor EmbeddingImpl::forward(const torch::Tensor& ids) { return torch::embedding(weight, ids); }

PatchConvImpl::PatchConvImpl(int64_t in_channels, int64_t out_channels, int64_t patch_) : patch(patch_) {
  weight = register_parameter("weight", torch::empty({out_channels, in_channels, patch, patch}, param_options()));
  bias = register_parameter("bias", torch::empty({out_channels}, param_options()));
  if (skip_init()) return;
  torch::NoGradGuard no_grad;
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_channels * patch * patch));
  bias.uniform_(-bound, bound);
}

torch::Tensor PatchConvImpl::forward(const torch::Tensor& x) {
  return nn::conv2d(x, weight, bias, /*stride=*/patch);
}

}  // namespace pi0::nn
