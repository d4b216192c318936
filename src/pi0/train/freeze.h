// Freezing presets: which parameters train. Everything works on parameter NAMES (openpi PyTorch state_dict keys),
// so the same code runs on an instantiated model and on model::parameter_layout() (full-size masks without
// allocating 3B parameters). What the trainable flags imply for dtypes, devices and bytes: placement.h.
// Which tensors each preset trains: docs/freezing.md. openpi reference: §8.3 (freeze filters).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pi0/model/param_layout.h"

namespace pi0::train {

/// Valid preset names, in documentation order: "full", "projection-only", "+vision", "+language",
/// "action-expert-only", "freeze-vision", "lora", "lora-only".
const std::vector<std::string>& freeze_presets();

/// Per-name trainable flag. The preset decides first, then `include` regexes (std::regex ECMAScript, full match
/// against the name) make matching parameters trainable, then `exclude` regexes freeze matching ones (exclude
/// wins). UserError for an unknown preset (lists the valid ones, suggests the closest), an invalid regex, a regex
/// that matches no name, or "lora"/"lora-only" on a model without LoRA factors.
std::vector<bool> trainable_mask(const std::vector<std::string>& names, const std::string& preset,
                                 const std::vector<std::string>& include = {},
                                 const std::vector<std::string>& exclude = {});

/// Names of a layout, in order.
std::vector<std::string> names_of(const std::vector<model::ParamSpec>& layout);

/// Sets requires_grad on every parameter of `model` from trainable_mask over its named_parameters(); returns the
/// mask (named_parameters() order).
std::vector<bool> apply_freeze(torch::nn::Module& model, const std::string& preset,
                               const std::vector<std::string>& include = {},
                               const std::vector<std::string>& exclude = {});

}  // namespace pi0::train
