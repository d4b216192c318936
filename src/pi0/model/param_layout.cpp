#include "pi0/model/param_layout.h"

namespace pi0::model {

int64_t ParamSpec::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

namespace {

struct Builder {
  std::vector<ParamSpec> specs;
  void add(const std::string& name, std::vector<int64_t> shape) { specs.push_back({name, std::move(shape)}); }
  void dense(const std::string& name, int64_t in, int64_t out, bool bias = true, int64_t lora_rank = 0) {
    add(name + ".weight", {out, in});
    if (bias) add(name + ".bias", {out});
    if (lora_rank > 0) {
      add(name + ".lora_a", {lora_rank, in});
      add(name + ".lora_b", {out, lora_rank});
    }
  }
  void rms_norm(const std::string& name, int64_t width, int64_t cond_dim) {
    if (cond_dim > 0) {
      dense(name + ".dense", cond_dim, 3 * width);
    } else {
      add(name + ".weight", {width});
    }
  }
  void gemma(const std::string& prefix, const GemmaOptions& o) {
    if (o.vocab_size > 0) add(prefix + "embed_tokens.weight", {o.vocab_size, o.width});
    const int64_t q = o.num_heads * o.head_dim, kv = o.num_kv_heads * o.head_dim, r = o.lora_rank;
    for (int64_t l = 0; l < o.depth; ++l) {
      const std::string p = prefix + "layers." + std::to_string(l) + ".";
      dense(p + "self_attn.q_proj", o.width, q, false, r);
      dense(p + "self_attn.k_proj", o.width, kv, false, r);
      dense(p + "self_attn.v_proj", o.width, kv, false, r);
      dense(p + "self_attn.o_proj", q, o.width, false, r);
      dense(p + "mlp.gate_proj", o.width, o.mlp_dim, false, r);
      dense(p + "mlp.up_proj", o.width, o.mlp_dim, false, r);
      dense(p + "mlp.down_proj", o.mlp_dim, o.width, false, r);
      rms_norm(p + "input_layernorm", o.width, o.cond_dim);
      rms_norm(p + "post_attention_layernorm", o.width, o.cond_dim);
    }
    rms_norm(prefix + "norm", o.width, o.cond_dim);
  }
  void siglip(const std::string& prefix, const SiglipOptions& o) {
    add(prefix + "embeddings.patch_embedding.weight", {o.width, 3, o.patch_size, o.patch_size});
    add(prefix + "embeddings.patch_embedding.bias", {o.width});
    add(prefix + "embeddings.position_embedding.weight", {o.num_patches(), o.width});
    for (int64_t i = 0; i < o.depth; ++i) {
      const std::string p = prefix + "encoder.layers." + std::to_string(i) + ".";
      add(p + "layer_norm1.weight", {o.width});
      add(p + "layer_norm1.bias", {o.width});
      for (const char* proj : {"q_proj", "k_proj", "v_proj", "out_proj"})
        dense(p + "self_attn." + proj, o.width, o.width);
      add(p + "layer_norm2.weight", {o.width});
      add(p + "layer_norm2.bias", {o.width});
      dense(p + "mlp.fc1", o.width, o.mlp_dim);
      dense(p + "mlp.fc2", o.mlp_dim, o.width);
    }
    add(prefix + "post_layernorm.weight", {o.width});
    add(prefix + "post_layernorm.bias", {o.width});
  }
};

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

}  // namespace

std::vector<ParamSpec> parameter_layout(const Pi0Options& o) {
  Builder b;
  b.siglip(kVisionPrefix + "vision_model.", o.siglip);
  b.dense(kProjectorPrefix + "linear", o.siglip.width, o.paligemma.width);
  auto prefix = o.paligemma;
  prefix.cond_dim = 0;
  b.gemma(kLanguagePrefix, prefix);
  if (o.fast) return b.specs;  // pi0-FAST: PaliGemma alone
  auto expert = o.action_expert;
  expert.vocab_size = 0;
  expert.cond_dim = o.pi05 ? expert.width : 0;
  b.gemma(kExpertPrefix, expert);
  const int64_t we = o.action_expert.width, a = o.action_dim;
  b.dense("action_in_proj", a, we);
  b.dense("action_out_proj", we, a);
  if (o.pi05) {
    b.dense("time_mlp_in", we, we);
    b.dense("time_mlp_out", we, we);
  } else {
    b.dense("state_proj", a, we);
    b.dense("action_time_mlp_in", 2 * we, we);
    b.dense("action_time_mlp_out", we, we);
  }
  return b.specs;
}

std::string component_of(const std::string& name) {
  if (name.find(".lora_") != std::string::npos) return "lora";
  if (starts_with(name, kVisionPrefix) || starts_with(name, kProjectorPrefix)) return "vision";
  if (name == kEmbeddingName) return "embedding";
  if (starts_with(name, kLanguagePrefix)) return "language";
  if (starts_with(name, kExpertPrefix)) return "action_expert";
  return "projections";
}

}  // namespace pi0::model
