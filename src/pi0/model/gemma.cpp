#include "pi0/model/gemma.h"

#include <cmath>

#include "pi0/common/check.h"
#include "pi0/common/interrupt.h"

namespace pi0::model {

GemmaOptions gemma_variant(const std::string& name) {
  GemmaOptions o;
  std::string base = name;
  const std::string lora_suffix = "_lora";
  bool lora = base.size() > lora_suffix.size() &&
              base.compare(base.size() - lora_suffix.size(), lora_suffix.size(), lora_suffix) == 0;
  if (lora) base = base.substr(0, base.size() - lora_suffix.size());
  if (base == "dummy") {
    o = GemmaOptions{{64, 4, 128, 8, 1, 16}};
    if (lora) o.lora_rank = 4, o.lora_alpha = 8.0;  // not in openpi: lets tests run the LoRA path on a tiny model
  } else if (base == "small_512") {  // CPU benchmark sizes (configs/bench_cpu.yaml)
    o = GemmaOptions{{512, 6, 2048, 8, 1, 64}};
  } else if (base == "small_256") {
    o = GemmaOptions{{256, 6, 1024, 8, 1, 64}};
  } else if (base == "gemma_300m") {
    o = GemmaOptions{{1024, 18, 4096, 8, 1, 256}};
    if (lora) o.lora_rank = 32, o.lora_alpha = 32.0;
  } else if (base == "gemma_2b") {
    o = GemmaOptions{{2048, 18, 16384, 8, 1, 256}};
    if (lora) o.lora_rank = 16, o.lora_alpha = 16.0;
  } else {
    throw UserError("unknown Gemma variant '" + name +
                    "' (expected dummy, dummy_lora, small_256, small_512, gemma_300m, gemma_2b, gemma_300m_lora or gemma_2b_lora)");
  }
  if (lora && o.lora_rank == 0) throw UserError("Gemma variant '" + name + "' has no LoRA form");
  o.vocab_size = kPaligemmaVocabSize;
  return o;
}

namespace {
nn::Dense dense(int64_t in, int64_t out, const GemmaOptions& o) {
  nn::Dense d(nn::DenseOptions(in, out).bias(false));
  if (o.lora_rank > 0) d->enable_lora(o.lora_rank, o.lora_alpha);
  return d;
}
}  // namespace

GemmaAttentionImpl::GemmaAttentionImpl(const GemmaOptions& o) {
  const int64_t q_width = o.num_heads * o.head_dim, kv_width = o.num_kv_heads * o.head_dim;
  q_proj = register_module("q_proj", dense(o.width, q_width, o));
  k_proj = register_module("k_proj", dense(o.width, kv_width, o));
  v_proj = register_module("v_proj", dense(o.width, kv_width, o));
  o_proj = register_module("o_proj", dense(q_width, o.width, o));
}

GemmaMlpImpl::GemmaMlpImpl(const GemmaOptions& o) {
  gate_proj = register_module("gate_proj", dense(o.width, o.mlp_dim, o));
  up_proj = register_module("up_proj", dense(o.width, o.mlp_dim, o));
  down_proj = register_module("down_proj", dense(o.mlp_dim, o.width, o));
}

torch::Tensor GemmaMlpImpl::forward(const torch::Tensor& x) {
  return down_proj->forward(nn::gelu_tanh_mul(gate_proj->forward(x), up_proj->forward(x)));
}

GemmaDecoderLayerImpl::GemmaDecoderLayerImpl(const GemmaOptions& o) {
  self_attn = register_module("self_attn", GemmaAttention(o));
  mlp = register_module("mlp", GemmaMlp(o));
  input_layernorm = register_module("input_layernorm", nn::RMSNorm(nn::RMSNormOptions(o.width).cond_dim(o.cond_dim)));
  post_attention_layernorm =
      register_module("post_attention_layernorm", nn::RMSNorm(nn::RMSNormOptions(o.width).cond_dim(o.cond_dim)));
}

GemmaModelImpl::GemmaModelImpl(GemmaOptions o) : options(o) {
  if (o.vocab_size > 0) {
    embed_tokens = register_module("embed_tokens", nn::Embedding(o.vocab_size, o.width));
  }
  layers_list = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.depth; ++i) {
    interruption_point();  // a full-size random init takes tens of seconds: a stop ends it within one layer
    layers.push_back(GemmaDecoderLayer(o));
    layers_list->push_back(layers.back());
  }
  norm = register_module("norm", nn::RMSNorm(nn::RMSNormOptions(o.width).cond_dim(o.cond_dim)));
}

torch::Tensor GemmaModelImpl::embed(const torch::Tensor& tokens) {
  PI0_CHECK(embed_tokens, "this Gemma expert has no token embedding");
  return embed_tokens->forward(tokens) * std::sqrt(static_cast<double>(options.width));
}

}  // namespace pi0::model
