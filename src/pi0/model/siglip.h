// SigLIP ViT image encoder (openpi siglip.py; HF SiglipVisionModel names). Pre-LN blocks with biases,
// tanh-GELU MLP, learned position embedding, final LayerNorm. The patch embedding and position embedding run
// in float32; the blocks in the compute dtype of the input; LayerNorm and softmax in float32.
// Shapes: B images, P patches, W width.
#pragma once
#include <string>

#include <torch/torch.h>

#include "pi0/config/model_dims.h"
#include "pi0/model/layer_gate.h"
#include "pi0/nn/dense.h"
#include "pi0/nn/embedding.h"

namespace pi0::model {

/// A SigLIP tower: its dimensions (config::SiglipDims: width, depth, mlp_dim, num_heads, patch_size; the fields
/// of an explicit model.siglip_variant map) and the input size. Start from siglip_variant().
struct SiglipOptions : config::SiglipDims {
  int64_t image_size = 224;  ///< square input side; P = (image_size / patch_size)²
  int64_t num_patches() const { return (image_size / patch_size) * (image_size / patch_size); }
};

/// "So400m/14" (the released models) and small test variants "tiny/14" (width 32, depth 2) and "small/14".
SiglipOptions siglip_variant(const std::string& name);

/// LayerNorm computed in float32 whatever the input dtype (weight/bias keep their HF names).
class LayerNorm32Impl : public torch::nn::Module {
 public:
  explicit LayerNorm32Impl(int64_t width, double eps = 1e-6);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;
  double eps;
};
TORCH_MODULE(LayerNorm32);

class SiglipAttentionImpl : public torch::nn::Module {
 public:
  SiglipAttentionImpl(int64_t width, int64_t num_heads);
  /// Bidirectional MHA, x [B,P,W]. sdpa: at::scaled_dot_product_attention (on CUDA a fused kernel that never
  /// materializes the [B,N,P,P] logits); otherwise matmul → float32 softmax → matmul, the reference's arithmetic.
  torch::Tensor forward(const torch::Tensor& x, bool sdpa = false);
  int64_t num_heads;
  nn::Dense q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};
};
TORCH_MODULE(SiglipAttention);

class SiglipEncoderLayerImpl : public torch::nn::Module {
 public:
  explicit SiglipEncoderLayerImpl(const SiglipOptions& o);
  torch::Tensor forward(const torch::Tensor& x, bool sdpa = false);
  LayerNorm32 layer_norm1{nullptr}, layer_norm2{nullptr};
  SiglipAttention self_attn{nullptr};
  nn::Dense fc1{nullptr}, fc2{nullptr};  ///< registered as mlp.fc1 / mlp.fc2
};
TORCH_MODULE(SiglipEncoderLayer);

/// HF SiglipVisionTransformer ("vision_model"): embeddings, encoder.layers.i, post_layernorm.
class SiglipImpl : public torch::nn::Module {
 public:
  explicit SiglipImpl(SiglipOptions o);
  /// images [B,3,S,S] float in [-1,1] → tokens [B,P,W] in `compute_dtype`. The first `checkpointed_layers`
  /// blocks' activations are recomputed in backward. sdpa: attention through SDPA (SiglipAttentionImpl).
  torch::Tensor forward(const torch::Tensor& images, torch::ScalarType compute_dtype, int64_t checkpointed_layers,
                        bool sdpa = false);

  SiglipOptions options;
  /// Called before each encoder layer's forward (train.offload's wait for the layer's weights); empty: none.
  LayerGate layer_gate;
  nn::PatchConv patch_embedding{nullptr};
  nn::Embedding position_embedding{nullptr};
  std::vector<SiglipEncoderLayer> layers;
  LayerNorm32 post_layernorm{nullptr};
};
TORCH_MODULE(Siglip);

}  // namespace pi0::model
