// Parameter names and shapes of a pi0 / pi0.5 model computed from its options alone, so full-size models can
// be counted, checked against checkpoint files and planned for memory without allocating 3B parameters.
// A test cross-checks this layout against an instantiated model's named_parameters().
#pragma once
#include <string>
#include <vector>

#include "pi0/model/pi0.h"

namespace pi0::model {

struct ParamSpec {
  std::string name;            ///< openpi PyTorch state_dict key, e.g. "action_in_proj.weight"
  std::vector<int64_t> shape;  ///< e.g. {1024, 32}
  int64_t numel() const;
};

/// Every parameter of Pi0(options), in registration order.
std::vector<ParamSpec> parameter_layout(const Pi0Options& options);

/// Components of the breakdown, in print order.
inline const std::vector<std::string> kComponents = {"vision", "language", "embedding", "action_expert",
                                                     "projections", "lora"};

/// Component of a parameter name: "vision" (SigLIP and its projector to the prefix width), "language"
/// (prefix Gemma without its token embedding), "embedding" (prefix token embedding), "action_expert",
/// "projections" (action/state/time projections), "lora" (any LoRA factor).
std::string component_of(const std::string& name);

/// Common name prefixes (one place, used by loaders, freezing and the breakdown).
inline const std::string kVisionPrefix = "paligemma_with_expert.paligemma.model.vision_tower.";
inline const std::string kProjectorPrefix = "paligemma_with_expert.paligemma.model.multi_modal_projector.";
inline const std::string kLanguagePrefix = "paligemma_with_expert.paligemma.model.language_model.";
inline const std::string kExpertPrefix = "paligemma_with_expert.gemma_expert.model.";
inline const std::string kEmbeddingName = kLanguagePrefix + "embed_tokens.weight";

}  // namespace pi0::model
