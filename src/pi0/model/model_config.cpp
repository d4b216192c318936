#include "pi0/model/model_config.h"

#include "pi0/common/check.h"

namespace pi0::model {

Pi0Options options_from_config(const config::ModelConfig& m) {
  Pi0Options o;
  o.pi05 = m.type == "pi05";
  auto variant = [](const std::string& key, const std::string& name) {
    try {
      return gemma_variant(name);
    } catch (const UserError& e) {
      throw UserError(key + ": " + e.what());
    }
  };
  o.paligemma = variant("model.paligemma_variant", m.paligemma_variant);
  o.paligemma.vocab_size = m.vocab_size;
  o.action_expert = variant("model.action_expert_variant", m.action_expert_variant);
  try {
    o.siglip = siglip_variant(m.siglip_variant);
  } catch (const UserError& e) {
    throw UserError(std::string("model.siglip_variant: ") + e.what());
  }
  if (m.image_size % o.siglip.patch_size != 0) {
    throw UserError("model.image_size must be a multiple of the SigLIP patch size " +
                    std::to_string(o.siglip.patch_size) + " (got " + std::to_string(m.image_size) + ")");
  }
  o.siglip.image_size = m.image_size;
  o.action_dim = m.action_dim;
  o.action_horizon = m.action_horizon;
  o.max_token_len = m.max_token_len > 0 ? m.max_token_len : (o.pi05 ? 200 : 48);
  const auto& p = o.paligemma;
  const auto& e = o.action_expert;
  if (p.depth != e.depth || p.head_dim != e.head_dim || p.num_heads != e.num_heads ||
      p.num_kv_heads != e.num_kv_heads) {
    throw UserError("model.paligemma_variant '" + m.paligemma_variant + "' and model.action_expert_variant '" +
                    m.action_expert_variant + "' must share depth, heads and head_dim (joint attention)");
  }
  return o;
}

}  // namespace pi0::model
