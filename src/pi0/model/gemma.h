// Gemma transformer expert (openpi gemma.py; PT transformers GemmaModel as patched by openpi).
// Two experts (prefix "paligemma" and suffix "action expert") run layer by layer with one joint attention;
// this file holds the per-expert weights, joint_attention() holds the shared attention math.
// Shapes: B batch, T tokens of one expert, S key tokens, W width, N query heads, K kv heads, D head dim.
#pragma once
#include <string>

#include <torch/torch.h>

#include "pi0/config/model_dims.h"
#include "pi0/nn/dense.h"
#include "pi0/nn/embedding.h"
#include "pi0/nn/rms_norm.h"

namespace pi0::model {

/// A Gemma expert: its dimensions (config::GemmaDims: width, depth, mlp_dim, num_heads, num_kv_heads, head_dim,
/// lora_rank, lora_alpha; the same fields the config's explicit model.*_variant maps set) and what the model adds.
/// Start from gemma_variant(): a default-constructed one has no dimensions.
struct GemmaOptions : config::GemmaDims {
  int64_t vocab_size = 0;   ///< token embedding rows; 0 = no embedding (action expert)
  int64_t cond_dim = 0;     ///< > 0: adaptive RMSNorm driven by a [B,cond_dim] vector (pi0.5 action expert)
};

/// Named variants of openpi gemma.py get_config: "dummy", "gemma_300m", "gemma_2b" (+ "_lora" suffixes), and
/// "small_512" / "small_256" (6 layers, head_dim 64) for the CPU benchmark, and "dummy_lora" (rank 4, alpha 8; not
/// in openpi) so tests can exercise LoRA on a tiny model.
/// vocab_size is set to 257152 (PaliGemma) for every variant; callers clear it for the action expert.
GemmaOptions gemma_variant(const std::string& name);

constexpr int64_t kPaligemmaVocabSize = 257152;

class GemmaAttentionImpl : public torch::nn::Module {
 public:
  explicit GemmaAttentionImpl(const GemmaOptions& o);
  nn::Dense q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
};
TORCH_MODULE(GemmaAttention);

class GemmaMlpImpl : public torch::nn::Module {
 public:
  explicit GemmaMlpImpl(const GemmaOptions& o);
  /// GeGLU: down(gelu_tanh(gate(x)) · up(x)).
  torch::Tensor forward(const torch::Tensor& x);
  nn::Dense gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(GemmaMlp);

class GemmaDecoderLayerImpl : public torch::nn::Module {
 public:
  explicit GemmaDecoderLayerImpl(const GemmaOptions& o);
  GemmaAttention self_attn{nullptr};
  GemmaMlp mlp{nullptr};
  nn::RMSNorm input_layernorm{nullptr};           ///< pre-attention norm (JAX pre_attention_norm)
  nn::RMSNorm post_attention_layernorm{nullptr};  ///< pre-FFW norm despite the HF name (JAX pre_ffw_norm)
};
TORCH_MODULE(GemmaDecoderLayer);

/// One expert: optional token embedding, `depth` layers, final norm. Parameter names equal HF GemmaModel's.
class GemmaModelImpl : public torch::nn::Module {
 public:
  explicit GemmaModelImpl(GemmaOptions o);
  /// tokens [B,L] → embeddings [B,L,W] · sqrt(W) (only the prefix expert has an embedding).
  torch::Tensor embed(const torch::Tensor& tokens);

  GemmaOptions options;
  nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers_list{nullptr};
  std::vector<GemmaDecoderLayer> layers;
  nn::RMSNorm norm{nullptr};
};
TORCH_MODULE(GemmaModel);

/// Per-layer key/value cache of the prefix: k, v [B,K,S,D], keys stored after RoPE.
struct KVCache {
  std::vector<torch::Tensor> k, v;
  /// The simplified weights' cache (model/fused_inference.h): per layer one [B, Tp+Ts, 2K, D] buffer, each row the
  /// token's K heads then its V heads; rows [0, Tp) the prefix's (k and v above are views of them), the rest written
  /// by the suffix passes in place. Empty on the modules' path.
  std::vector<torch::Tensor> kv;
};

}  // namespace pi0::model
