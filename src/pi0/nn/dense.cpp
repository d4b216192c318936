#include "pi0/nn/dense.h"

#include <cmath>

#include "pi0/nn/matmul.h"
#include "pi0/nn/param_device.h"

namespace pi0::nn {

DenseImpl::DenseImpl(DenseOptions options_) : options(std::move(options_)) { reset(); }

void DenseImpl::reset() {
  weight = register_parameter("weight", torch::empty({options.out_features(), options.in_features()}, param_options()));
  if (options.bias()) bias = register_parameter("bias", torch::empty({options.out_features()}, param_options()));
  if (!skip_init()) initialize();
}

void DenseImpl::initialize() {
  torch::NoGradGuard no_grad;
  if (bias.defined()) bias.zero_();
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

namespace {
// `p` in `dtype`, through `slot` when caching is on.
torch::Tensor cast(const torch::Tensor& p, c10::ScalarType dtype, CachedCast& slot, bool cache) {
  if (p.scalar_type() == dtype) return p;
  if (!cache) return p.to(dtype);
  const bool with_grad = p.requires_grad();
  if (!slot.value.defined() || slot.value.scalar_type() != dtype || slot.data != p.data_ptr() ||
      slot.version != p._version() || slot.with_grad != with_grad) {
    // Record the cast's autograd edge whenever the parameter trains, even under no_grad: a checkpointed layer's
    // first forward runs without grad, and its recomputation in backward reuses this very copy.
    torch::AutoGradMode grad_mode(with_grad);
    slot.value = p.to(dtype);
    slot.data = p.data_ptr();
    slot.version = p._version();
    slot.with_grad = with_grad;
  }
  return slot.value;
}
}  // namespace

torch::Tensor DenseImpl::forward(const torch::Tensor& x) {
  const auto dtype = x.scalar_type();
  const bool cache = cast_cache_enabled;
  auto w = cast(weight, dtype, cast_w, cache);
  torch::Tensor b;
  if (bias.defined()) b = cast(bias, dtype, cast_b, cache);
  auto y = nn::linear(x, w, b);
  if (lora_a.defined()) {
    auto a = cast(lora_a, dtype, cast_a, cache), bb = cast(lora_b, dtype, cast_bb, cache);
    auto h = nn::linear(x, a);  // [..., rank]
    // The scaling costs a pass over the [..., out] product and another over its gradient. openpi's variants have
    // alpha = rank: a scaling of 1 is skipped; a power of two ≥ 1 scales the rank-wide h instead, which gives the same
    // bits forward and backward (multiplying by 2^k commutes with every rounding, and ≥ 1 cannot underflow); any
    // other scaling stays where it was.
    if (lora_scaling == 1.0) {
      y = y + nn::linear(h, bb);
    } else if (lora_scaling_is_exact_on_h()) {
      y = y + nn::linear(h * lora_scaling, bb);
    } else {
      y = y + nn::linear(h, bb) * lora_scaling;
    }
  }
  return y;
}

namespace {
template <typename Fn>
void for_each_dense(torch::nn::Module& module, Fn fn) {
  if (auto* d = dynamic_cast<DenseImpl*>(&module)) fn(*d);
  for (const auto& child : module.modules(/*include_self=*/false))
    if (auto* d = dynamic_cast<DenseImpl*>(child.get())) fn(*d);
}
}  // namespace

void clear_cast_cache(torch::nn::Module& module) {
  for_each_dense(module, [](DenseImpl& d) { d.drop_casts(); });
}

void set_cast_cache(torch::nn::Module& module, bool enabled) {
  for_each_dense(module, [enabled](DenseImpl& d) {
    d.cast_cache_enabled = enabled;
    if (!enabled) d.drop_casts();
  });
}

int64_t cast_cache_bytes(torch::nn::Module& module) {
  int64_t bytes = 0;
  for_each_dense(module, [&bytes](DenseImpl& d) {
    for (const CachedCast* c : {&d.cast_w, &d.cast_b, &d.cast_a, &d.cast_bb})
      if (c->value.defined()) bytes += c->value.numel() * static_cast<int64_t>(c->value.element_size());
  });
  return bytes;
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

bool DenseImpl::lora_scaling_is_exact_on_h() const {
  int exponent = 0;
  return lora_scaling >= 1.0 && std::frexp(lora_scaling, &exponent) == 0.5;
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
  drop_casts();
}

int64_t merge_all_lora(torch::nn::Module& module) {
  int64_t merged = 0;
  for_each_dense(module, [&](DenseImpl& d) {
    if (d.has_lora()) {
      d.merge_lora();
      ++merged;
    }
  });
  return merged;
}

torch::Tensor gelu_tanh(const torch::Tensor& x) {
  return torch::gelu(x, "tanh");
}

namespace {

// gelu_tanh(gate) · up with the composite's operations forward and backward (same bits), but autograd keeps only
// gate and up: the composite also kept gelu_tanh(gate) for the product's backward, a third [.., F] tensor in the
// MLP; here backward recomputes it (one elementwise pass over gate, cheap next to the MLP's GEMMs).
struct GeluTanhMulFunction : public torch::autograd::Function<GeluTanhMulFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& gate,
                               const torch::Tensor& up) {
    ctx->save_for_backward({gate, up});
    return gelu_tanh(gate) * up;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &gate = saved[0], &up = saved[1];
    const auto& g = grads[0];
    torch::Tensor dgate, dup;
    if (ctx->needs_input_grad(0)) dgate = torch::gelu_backward(g * up, gate, "tanh");
    if (ctx->needs_input_grad(1)) dup = g * gelu_tanh(gate);
    return {dgate, dup};
  }
};

}  // namespace

torch::Tensor gelu_tanh_mul(const torch::Tensor& gate, const torch::Tensor& up) {
  return GeluTanhMulFunction::apply(gate, up);
}

}  // namespace pi0::nn
