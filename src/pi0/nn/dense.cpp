#include "pi0/nn/dense.h"

#include <cmath>

namespace pi0::nn {

DenseImpl::DenseImpl(DenseOptions options_) : options(std::move(options_)) { reset(); }

void DenseImpl::reset() {
  weight = register_parameter("weight", torch::empty({options.out_features(), options.in_features()}));
  if (options.bias()) bias = register_parameter("bias", torch::zeros({options.out_features()}));
  torch::NoGradGuard no_grad;
  const auto& init = options.init();
  if (init == "zeros") {
    weight.zero_();
  } else if (init == "xavier") {
    torch::nn::init::xavier_uniform_(weight);
  } else {
    TORCH_CHECK(init == "lecun", "unknown Dense init '", init, "'");
    weight.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(options.in_features())));
  }
}

torch::Tensor DenseImpl::forward(const torch::Tensor& x) {
  const auto dtype = x.scalar_type();
  auto w = weight.scalar_type() == dtype ? weight : weight.to(dtype);
  torch::Tensor b;
  if (bias.defined()) b = bias.scalar_type() == dtype ? bias : bias.to(dtype);
  auto y = torch::nn::functional::linear(x, w, b);
  if (lora_a.defined()) {
    auto a = lora_a.to(dtype), bb = lora_b.to(dtype);
    y = y + torch::nn::functional::linear(torch::nn::functional::linear(x, a), bb) * lora_scaling;
  }
  return y;
}

void DenseImpl::enable_lora(int64_t rank, double alpha) {
  TORCH_CHECK(rank > 0, "LoRA rank must be positive");
  auto opts = weight.options().requires_grad(false);
  // NOTE: openpi initializes both factors with normal(0, 0.01) (lora.py), so the model changes slightly at
  // init; we follow it so LoRA runs are comparable with the reference.
  lora_a = register_parameter("lora_a", torch::randn({rank, options.in_features()}, opts) * 0.01);
  lora_b = register_parameter("lora_b", torch::randn({options.out_features(), rank}, opts) * 0.01);
  lora_scaling = alpha / static_cast<double>(rank);
}

void DenseImpl::merge_lora() {
  if (!lora_a.defined()) return;
  torch::NoGradGuard no_grad;
  auto delta = torch::matmul(lora_b.to(torch::kFloat32), lora_a.to(torch::kFloat32)) * lora_scaling;
  weight.copy_((weight.to(torch::kFloat32) + delta).to(weight.scalar_type()));
  // Unregister by replacing the parameter map entries: Module has no unregister_parameter, so mark empty.
  parameters_.erase("lora_a");
  parameters_.erase("lora_b");
  lora_a = torch::Tensor();
  lora_b = torch::Tensor();
}

int64_t merge_all_lora(torch::nn::Module& module) {
  int64_t merged = 0;
  auto merge = [&](torch::nn::Module& m) {
    if (auto* d = dynamic_cast<DenseImpl*>(&m); d && d->has_lora()) {
      d->merge_lora();
      ++merged;
    }
  };
  merge(module);
  for (const auto& child : module.modules(/*include_self=*/false)) merge(*child);
  return merged;
}

torch::Tensor gelu_tanh(const torch::Tensor& x) {
  return torch::gelu(x, "tanh");
}

}  // namespace pi0::nn
