#include "pi0/nn/matmul.h"

#include "pi0/common/check.h"

namespace pi0::nn {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

torch::Tensor f32(const torch::Tensor& t) { return t.to(torch::kFloat32); }

// (a·b + bias) in float32, rounded to a's dtype; a [..., M, K], b [..., K, N] with equal batch dims, bias [N].
// Saves the operands in their own dtype and upcasts again in backward: a saved float32 copy would double the
// activation memory the plan (train::plan_memory) counts.
struct Float32Matmul : torch::autograd::Function<Float32Matmul> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& a, const torch::Tensor& b,
                               const c10::optional<torch::Tensor>& bias) {
    ctx->save_for_backward({a, b});
    // needs_input_grad counts tensor inputs only: an absent bias has no index.
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    auto y = torch::matmul(f32(a), f32(b));
    if (bias && bias->defined()) y.add_(f32(*bias));
    return y.to(a.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& a = saved[0];
    const auto& b = saved[1];
    const auto g = f32(grads[0]);
    torch::Tensor ga, gb, gbias;
    if (ctx->needs_input_grad(0)) ga = torch::matmul(g, f32(b).transpose(-1, -2)).to(a.scalar_type());
    if (ctx->needs_input_grad(1)) gb = torch::matmul(f32(a).transpose(-1, -2), g).to(b.scalar_type());
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) gbias = g.reshape({-1, g.size(-1)}).sum(0).to(a.scalar_type());
    return {ga, gb, gbias};
  }
};

}  // namespace

bool needs_float32_accumulation(const torch::Tensor& t) {
  return t.device().is_cpu() && (t.scalar_type() == torch::kBFloat16 || t.scalar_type() == torch::kHalf);
}

torch::Tensor matmul(const torch::Tensor& a, const torch::Tensor& b) {
  if (!needs_float32_accumulation(a) || a.scalar_type() != b.scalar_type()) return torch::matmul(a, b);
  PI0_CHECK(a.dim() >= 2 && a.dim() == b.dim() && a.sizes().slice(0, a.dim() - 2) == b.sizes().slice(0, b.dim() - 2),
            "nn::matmul takes operands of equal rank and batch dimensions (got ", a.sizes(), " and ", b.sizes(), ")");
  return Float32Matmul::apply(a, b, c10::nullopt);
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias) {
  if (!needs_float32_accumulation(x) || x.scalar_type() != w.scalar_type() ||
      (bias.defined() && bias.scalar_type() != x.scalar_type())) {
    return torch::nn::functional::linear(x, w, bias);
  }
  auto out_sizes = x.sizes().vec();
  out_sizes.back() = w.size(0);
  // As an optional: apply() takes a plain Tensor argument for a variable, and an undefined one is none.
  const c10::optional<torch::Tensor> b = bias.defined() ? c10::optional<torch::Tensor>(bias) : c10::nullopt;
  return Float32Matmul::apply(x.reshape({-1, x.size(-1)}), w.t(), b).view(out_sizes);
}

torch::Tensor conv2d(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias, int64_t stride) {
  if (!needs_float32_accumulation(x)) return torch::conv2d(x, w, bias, {stride, stride});
  // Through autograd's casts: the saved float32 copies are of the images and the patch kernel only, small next to
  // the activations of the layers after it.
  return torch::conv2d(f32(x), f32(w), bias.defined() ? f32(bias) : bias, {stride, stride}).to(x.scalar_type());
}

}  // namespace pi0::nn
