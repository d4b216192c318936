// Freezing presets and the parameter / memory breakdown. Everything works on parameter NAMES (openpi PyTorch
// state_dict keys), so the same code runs on an instantiated model and on model::parameter_layout() — the
// latter reports full-size counts and memory without allocating 3B parameters.
// Which tensors each preset trains: docs/freezing.md. openpi reference: §8.3 (freeze filters).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
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

/// Counts and estimated persistent training memory of one component (or of the whole model).
struct ComponentStats {
  std::string name;              ///< model::kComponents entry, or "total"
  int64_t total = 0;             ///< parameters (elements)
  int64_t trainable = 0;
  int64_t frozen = 0;
  int64_t weight_bytes = 0;      ///< parameter storage
  int64_t grad_bytes = 0;        ///< gradients of trainable parameters
  int64_t optimizer_bytes = 0;   ///< AdamW exp_avg + exp_avg_sq of trainable parameters
  int64_t ema_bytes = 0;         ///< float32 EMA of trainable parameters (0 when EMA is off)
  /// bf16 copies of trainable float32 layer weights (nn::Dense's cast cache, bf16-mixed only): kept from one
  /// forward to the next, so persistent too
  int64_t cast_bytes = 0;
  double trainable_percent() const { return total > 0 ? 100.0 * static_cast<double>(trainable) / total : 0.0; }
  int64_t memory_bytes() const { return weight_bytes + grad_bytes + optimizer_bytes + ema_bytes + cast_bytes; }
};

/// Breakdown per component in model::kComponents order plus the sum.
/// Memory model (bytes per parameter; activations are estimated separately, model/activation_memory.h):
///   precision   | trainable weight | frozen weight | grad | AdamW state | cast cache
///   "float32"   | 4                | 4             | 4    | 8           | 0
///   "bf16-mixed"| 4 (f32 master)   | 2             | 4    | 8           | 2 (layer weights; not norms, embeddings)
///   "bf16"      | 2                | 2             | 2    | 4           | 0
/// EMA: 4 bytes per *trainable* parameter (see ema.h: averaging frozen weights gives the weights themselves).
struct ParamBreakdown {
  std::string precision;
  bool ema = false;
  std::vector<ComponentStats> components;  ///< one per model::kComponents entry (zeros when absent)
  ComponentStats total;
};

/// Valid precision strings: "float32", "bf16-mixed", "bf16".
const std::vector<std::string>& precision_modes();

/// UserError for an unknown precision or a mask of the wrong length.
ParamBreakdown breakdown(const std::vector<model::ParamSpec>& layout, const std::vector<bool>& trainable,
                         const std::string& precision, bool ema);

/// Aligned text table, counts with thousands separators, memory in GiB.
std::string format_breakdown(const ParamBreakdown& b);
/// {"precision":…, "ema":…, "total":{…}, "vision":{…}, …}; each entry holds total, trainable, frozen,
/// trainable_percent and the *_bytes fields.
nlohmann::json breakdown_json(const ParamBreakdown& b);

/// "3238048528" → "3,238,048,528".
std::string with_thousands(int64_t n);



}  // namespace pi0::train
