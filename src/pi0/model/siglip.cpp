#include "pi0/model/siglip.h"

#include <cmath>

#include "pi0/common/check.h"
#include "pi0/common/interrupt.h"
#include "pi0/nn/checkpoint.h"
#include "pi0/nn/matmul.h"
#include "pi0/nn/param_device.h"
#include "pi0/nn/sdpa.h"

namespace pi0::model {

SiglipOptions siglip_variant(const std::string& name) {
  if (name == "So400m/14") return SiglipOptions{{1152, 27, 4304, 16, 14}, 224};
  if (name == "small/14") return SiglipOptions{{256, 4, 1024, 4, 14}, 224};
  if (name == "tiny/14") return SiglipOptions{{32, 2, 64, 2, 14}, 224};
  throw UserError("unknown SigLIP variant '" + name + "' (expected So400m/14, small/14 or tiny/14)");
}

LayerNorm32Impl::LayerNorm32Impl(int64_t width, double eps_) : eps(eps_) {
  weight = register_parameter("weight", nn::filled_param({width}, 1.0));
  bias = register_parameter("bias", nn::filled_param({width}, 0.0));
}

torch::Tensor LayerNorm32Impl::forward(const torch::Tensor& x) {
  namespace F = torch::nn::functional;
  const auto x32 = nn::upcast(x);
  auto y = F::layer_norm(x32, F::LayerNormFuncOptions({x.size(-1)})
                                  .weight(weight.to(x32.scalar_type()))
                                  .bias(bias.to(x32.scalar_type()))
                                                    .eps(eps));
  return y.to(x.scalar_type());
}

SiglipAttentionImpl::SiglipAttentionImpl(int64_t width, int64_t heads) : num_heads(heads) {
  auto d = [&](const char* name) {
    return register_module(name, nn::Dense(nn::DenseOptions(width, width).init("xavier")));
  };
  q_proj = d("q_proj");
  k_proj = d("k_proj");
  v_proj = d("v_proj");
  out_proj = d("out_proj");
}

torch::Tensor SiglipAttentionImpl::forward(const torch::Tensor& x, bool sdpa) {
  const int64_t b = x.size(0), p = x.size(1), w = x.size(2), d = w / num_heads;
  auto split = [&](const torch::Tensor& t) { return t.view({b, p, num_heads, d}).transpose(1, 2); };  // [B,N,P,D]
  auto q = split(q_proj->forward(x)), k = split(k_proj->forward(x)), v = split(v_proj->forward(x));
  if (sdpa) {
#if PI0_HAVE_SDPA
    auto out = at::scaled_dot_product_attention(q, k, v, {}, 0.0, false, 1.0 / std::sqrt(double(d)));
    return out_proj->forward(out.transpose(1, 2).reshape({b, p, w}));
#else
    PI0_CHECK(false, "SDPA attention needs LibTorch >= 2.1");
#endif
  }
  auto logits = nn::upcast(nn::matmul(q, k.transpose(-1, -2))) * (1.0 / std::sqrt(double(d)));
  auto probs = torch::softmax(logits, -1).to(x.scalar_type());
  auto out = nn::matmul(probs, v).transpose(1, 2).reshape({b, p, w});
  return out_proj->forward(out);
}

SiglipEncoderLayerImpl::SiglipEncoderLayerImpl(const SiglipOptions& o) {
  layer_norm1 = register_module("layer_norm1", LayerNorm32(o.width));
  self_attn = register_module("self_attn", SiglipAttention(o.width, o.num_heads));
  layer_norm2 = register_module("layer_norm2", LayerNorm32(o.width));
  auto mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
  fc1 = mlp->register_module("fc1", nn::Dense(nn::DenseOptions(o.width, o.mlp_dim).init("xavier")));
  fc2 = mlp->register_module("fc2", nn::Dense(nn::DenseOptions(o.mlp_dim, o.width).init("xavier")));
  if (nn::skip_init()) return;
  torch::NoGradGuard no_grad;
  // openpi's MlpBlock initializes the biases with normal(1e-6).
  fc1->bias.normal_(0.0, 1e-6);
  fc2->bias.normal_(0.0, 1e-6);
}

torch::Tensor SiglipEncoderLayerImpl::forward(const torch::Tensor& x, bool sdpa) {
  auto h = x + self_attn->forward(layer_norm1->forward(x), sdpa);
  return h + fc2->forward(nn::gelu_tanh(fc1->forward(layer_norm2->forward(h))));
}

SiglipImpl::SiglipImpl(SiglipOptions o) : options(o) {
  PI0_CHECK(o.image_size % o.patch_size == 0, "image size must be a multiple of the patch size");
  auto embeddings = register_module("embeddings", std::make_shared<torch::nn::Module>());
  patch_embedding = embeddings->register_module("patch_embedding", nn::PatchConv(3, o.width, o.patch_size));
  position_embedding = embeddings->register_module("position_embedding", nn::Embedding(o.num_patches(), o.width));
  if (!nn::skip_init()) {
    torch::NoGradGuard no_grad;
    position_embedding->weight.normal_(0.0, 1.0 / std::sqrt(double(o.width)));
  }
  auto encoder = register_module("encoder", std::make_shared<torch::nn::Module>());
  auto list = encoder->register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.depth; ++i) {
    interruption_point();  // see GemmaModelImpl: a stop ends a long random init within one layer
    layers.push_back(SiglipEncoderLayer(o));
    list->push_back(layers.back());
  }
  post_layernorm = register_module("post_layernorm", LayerNorm32(o.width));
}

torch::Tensor SiglipImpl::forward(const torch::Tensor& images, torch::ScalarType compute_dtype,
                                  int64_t checkpointed_layers, bool sdpa) {
  PI0_CHECK(images.dim() == 4 && images.size(1) == 3, "SigLIP expects [B,3,S,S] images, got ", images.sizes());
  PI0_CHECK(images.size(2) == options.image_size && images.size(3) == options.image_size,
            "SigLIP was built for ", options.image_size, "x", options.image_size, " images, got ", images.sizes());
  // Patch embedding and position embedding in float32 (reference keeps them f32 under bf16 training).
  const auto acc = nn::upcast(torch::empty({}, compute_dtype)).scalar_type();
  auto x = patch_embedding->forward(images.to(patch_embedding->weight.scalar_type()));
  x = x.to(acc).flatten(2).transpose(1, 2);  // [B,P,W]
  x = (x + position_embedding->weight.to(acc).unsqueeze(0)).to(compute_dtype);
  for (int64_t l = 0; l < static_cast<int64_t>(layers.size()); ++l) {
    auto& layer = layers[static_cast<size_t>(l)];
    if (layer_gate) layer_gate(LayerStack::kVision, l);
    if (l < checkpointed_layers) {
      x = nn::checkpoint(
          [layer, sdpa](const nn::TensorList& in) mutable { return nn::TensorList{layer->forward(in[0], sdpa)}; }, {x},
          *layer)[0];
    } else {
      x = layer->forward(x, sdpa);
    }
  }
  return post_layernorm->forward(x);
}

}  // namespace pi0::model
