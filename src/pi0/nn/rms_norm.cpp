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

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// y = n·(1 + scale) [+ shift], n = x·rstd, rstd = 1/sqrt(mean(x²) + eps), in float32 (float64 stays float64);
// `scale` is the plain norm's [W] weight or the adaptive norm's [B,1|T,W] modulation. Forward and backward are the
// composite expression's own operations — the ones autograd runs for it (derivatives.yaml's formulas for mul,
// rsqrt, mean and pow), in the same roundings, so values and gradients are bit-identical to it — but autograd keeps
// only x (in its own dtype: the residual stream, bf16 in mixed precision) and rstd ([..., 1] float32), not the
// composite's float32 copy of x, its square, n and their intermediates; backward recomputes n = x·rstd (same bits).
// A bf16 layer's two norms keep 2·(2 + 2) bytes per token and width instead of 2·(8 + 2).
// Both forms share one forward and backward; the plain one takes no shift (an undefined tensor cannot be an input
// of an autograd function on LibTorch 1.13).
torch::Tensor rms_norm_forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& scale,
                               const torch::Tensor& shift, double eps) {
  const auto x32 = upcast(x);
  const auto rstd = torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  const auto n = x32 * rstd;
  auto y = n * (1.0 + scale.to(x32.scalar_type()));
  if (shift.defined()) y = y + shift;
  ctx->save_for_backward({x, rstd, scale});
  return y.to(x.scalar_type());
}

// Gradients of x, scale and (with_shift) shift, each as autograd forms it for the composite.
variable_list rms_norm_backward(AutogradContext* ctx, const torch::Tensor& grad, bool with_shift) {
  const auto saved = ctx->get_saved_variables();
  const auto &x = saved[0], &rstd = saved[1], &scale = saved[2];
  const auto g = grad.to(rstd.scalar_type());  // backward of the cast to x's dtype
  const auto x32 = upcast(x);
  const auto n = x32 * rstd;
  torch::Tensor dx, dscale, dshift;
  if (ctx->needs_input_grad(0)) {
    const auto dn = g * (1.0 + scale.to(g.scalar_type()));       // y = n·(1 + scale)
    const auto dr = (dn * x32).sum_to_size(rstd.sizes());         // n = x·rstd, rstd's share
    const auto da = -0.5 * dr * rstd.pow(3);                      // rstd = rsqrt(a)
    const auto dp = da.expand(x32.sizes()) / x32.size(-1);        // a = mean(p) + eps
    dx = (dn * rstd + dp * (2.0 * x32.pow(1.0))).to(x.scalar_type());  // x's share of n, and p = x²
  }
  if (ctx->needs_input_grad(1)) dscale = (g * n).sum_to_size(scale.sizes()).to(scale.scalar_type());
  if (!with_shift) return {dx, dscale, torch::Tensor()};
  if (ctx->needs_input_grad(2)) dshift = g.sum_to_size(scale.sizes());  // shift has scale's shape
  return {dx, dscale, dshift, torch::Tensor()};
}

struct RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& scale, double eps) {
    return rms_norm_forward(ctx, x, scale, torch::Tensor(), eps);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return rms_norm_backward(ctx, grads[0], false);
  }
};

struct RmsNormShiftFunction : public torch::autograd::Function<RmsNormShiftFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& scale,
                               const torch::Tensor& shift, double eps) {
    return rms_norm_forward(ctx, x, scale, shift, eps);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return rms_norm_backward(ctx, grads[0], true);
  }
};

}  // namespace

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& scale, const torch::Tensor& shift, double eps) {
  return shift.defined() ? RmsNormShiftFunction::apply(x, scale, shift, eps) : RmsNormFunction::apply(x, scale, eps);
}

std::pair<torch::Tensor, torch::Tensor> RMSNormImpl::forward(const torch::Tensor& x, const torch::Tensor& cond) {
  if (!adaptive()) {
    TORCH_CHECK(!cond.defined(), "plain RMSNorm got a conditioning vector");
    return {rms_norm(x, weight, torch::Tensor(), options.eps()), torch::Tensor()};
  }
  TORCH_CHECK(cond.defined(), "adaptive RMSNorm needs a conditioning vector");
  // cond [B,C] conditions every token alike ([B,1,3W]); [B,T,C] each token its own (per-token flow time).
  auto mod = dense->forward(cond.to(x.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32));
  if (mod.dim() == 2) mod = mod.unsqueeze(1);
  const auto parts = mod.chunk(3, -1);                                     // scale, shift, gate
  return {rms_norm(x, parts[0], parts[1], options.eps()), parts[2]};
}

}  // namespace pi0::nn
