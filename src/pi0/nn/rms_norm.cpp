#include "pi0/nn/rms_norm.h"

#include "pi0/nn/param_device.h"

namespace pi0::nn {

RMSNormImpl::RMSNormImpl(RMSNormOptions options_) : options(options_) { reset(); }

void RMSNormImpl::reset() {
  if (adaptive()) {
    dense = register_module("dense", Dense(DenseOptions(options.cond_dim(), 3 * options.width()).init("zeros")));
  } else {
    weight = register_parameter("weight", filled_param({options.width()}, 0.0));
  }
}

std::pair<torch::Tensor, torch::Tensor> RMSNormImpl::forward(const torch::Tensor& x, const torch::Tensor& cond) {
  const auto x32 = upcast(x);
  const auto n = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + options.eps());
  if (!adaptive()) {
    TORCH_CHECK(!cond.defined(), "plain RMSNorm got a conditioning vector");
    return {(n * (1.0 + weight.to(x32.scalar_type()))).to(x.scalar_type()), torch::Tensor()};
  }
  TORCH_CHECK(cond.defined(), "adaptive RMSNorm needs a conditioning vector");
  // cond [B,C] conditions every token alike ([B,1,3W]); [B,T,C] each token its own (per-token flow time).
  auto mod = dense->forward(cond.to(x32.scalar_type()));
  if (mod.dim() == 2) mod = mod.unsqueeze(1);
  const auto parts = mod.chunk(3, -1);                                     // scale, shift, gate
  const auto y = n * (1.0 + parts[0]) + parts[1];
  return {y.to(x.scalar_type()), parts[2]};
}

}  // namespace pi0::nn
