#include "pi0/model/model_config.h"

#include "pi0/common/check.h"

namespace pi0::model {
namespace {

GemmaOptions gemma_from_spec(const std::string& key, const config::GemmaSpec& s) {
  if (s.is_named()) {
    try {
      return gemma_variant(s.variant);
    } catch (const UserError& e) {
      throw UserError(key + ": " + e.what());
    }
  }
  GemmaOptions o;
  static_cast<config::GemmaDims&>(o) = s;  // the spec's dimensions are GemmaOptions' own fields
  o.vocab_size = kPaligemmaVocabSize;
  return o;
}

SiglipOptions siglip_from_spec(const config::SiglipSpec& s) {
  if (s.is_named()) {
    try {
      return siglip_variant(s.variant);
    } catch (const UserError& e) {
      throw UserError(std::string("model.siglip_variant: ") + e.what());
    }
  }
  SiglipOptions o;
  static_cast<config::SiglipDims&>(o) = s;  // likewise; image_size comes from model.image_size
  return o;
}

}  // namespace

Pi0Options options_from_config(const config::ModelConfig& m) {
  Pi0Options o;
  o.pi05 = m.type == "pi05";
  o.fast = m.type == "pi0_fast";
  o.paligemma = gemma_from_spec("model.paligemma_variant", m.paligemma_variant);
  o.paligemma.vocab_size = m.vocab_size;
  o.action_expert = gemma_from_spec("model.action_expert_variant", m.action_expert_variant);
  o.siglip = siglip_from_spec(m.siglip_variant);
  if (m.image_size % o.siglip.patch_size != 0) {
    throw UserError("model.image_size must be a multiple of the SigLIP patch size " +
                    std::to_string(o.siglip.patch_size) + " (got " + std::to_string(m.image_size) + ")");
  }
  o.siglip.image_size = m.image_size;
  o.action_dim = m.action_dim;
  o.action_horizon = m.action_horizon;
  o.max_token_len = m.max_token_len > 0 ? m.max_token_len : o.fast ? 250 : o.pi05 ? 200 : 48;
  if (o.fast) return o;  // no action expert: model.action_expert_variant is ignored
  const auto& p = o.paligemma;
  const auto& e = o.action_expert;
  // Joint attention: both experts' queries, keys and values meet in one attention per layer.
  const std::pair<const char*, std::pair<int64_t, int64_t>> shared[] = {{"depth", {p.depth, e.depth}},
                                                                        {"num_heads", {p.num_heads, e.num_heads}},
                                                                        {"num_kv_heads", {p.num_kv_heads, e.num_kv_heads}},
                                                                        {"head_dim", {p.head_dim, e.head_dim}}};
  for (const auto& [name, values] : shared) {
    if (values.first != values.second) {
      throw UserError("model.action_expert_variant " + m.action_expert_variant.describe() + " must have the " + name +
                      " of model.paligemma_variant " + m.paligemma_variant.describe() + " (got " +
                      std::to_string(values.second) + ", expected " + std::to_string(values.first) +
                      "; joint attention needs equal depth, num_heads, num_kv_heads and head_dim)");
    }
  }
  return o;
}

}  // namespace pi0::model
