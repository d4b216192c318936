// Where each parameter lives and in which dtype: the one rule the trainer builds its model from (apply_placement)
// and the memory plan counts from (breakdown, plan_rank_memory), so the plan and the allocation cannot drift
// apart. A placement table holds, per parameter in registration order: whether it trains (the freeze preset,
// freeze.h), its storage dtype, the dtype its operations compute in, whether a compute-dtype copy is kept between
// forwards, and where its storage lives. Everything is derived from names and shapes, so a full-size table costs
// nothing (model::parameter_layout) and `pi0-train --print-params` reports what a run would allocate.
//
// The rule, by train.precision (bytes per element):
//   precision   | trainable storage | frozen storage | grad | AdamW moments | cast cache     | compute
//   "float32"   | f32 (4)           | f32 (4)        | 4    | 2 × 4         | —              | f32
//   "bf16-mixed"| f32 master (4)    | bf16 (2)       | 4    | 2 × 4         | bf16 (2) [1]   | bf16
//   "bf16"      | bf16 (2)          | bf16 (2)       | 2    | 2 × 2         | f32 (4) [2]    | bf16
// Gradients and AdamW's moments take the parameter's storage dtype; the EMA is float32 (4) for what trains
// (averaging frozen weights gives the weights themselves). Frozen weights only feed bf16 matmuls under bf16-mixed,
// so they are stored in bf16. [1] trainable layer weights only (not norm scales, embedding tables, lm_head),
// and only with train.weight_cast_cache (nn::Dense keeps the copy from one forward to the next); besides, as in
// [2], a frozen layer weight stored in bf16 and read in float32 gets a float32 copy. [2] the layers the model keeps
// in float32 (below: projections, time MLPs, adaRMS modulation), with train.weight_cast_cache.
//
// train.offload=optimizer moves what trains to the host (Residence::kHost): its master weight, AdamW's moments and
// the EMA live in host memory (pageable), with a float32 gradient accumulation only where gradients are summed
// (gradient accumulation; data parallelism adds it in plan_rank_memory) and, on CUDA, a pinned transfer buffer in the
// device copy's dtype (gradients in, next weights out); the device keeps a copy of the weight in the dtype its
// operations read — bf16 for layer weights under bf16-mixed (so no cast cache), the storage dtype for norm scales,
// embeddings and the patch convolution — plus the gradients in flight to the host.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pi0/config/config.h"
#include "pi0/model/param_layout.h"

namespace pi0::model {
class Pi0Impl;
}

namespace pi0::train {

/// Valid precision strings: "float32", "bf16-mixed", "bf16".
const std::vector<std::string>& precision_modes();

/// Where a parameter's training state lives: the training device (train.device), or the host
/// (train.offload=optimizer: master weight, gradient accumulation, AdamW moments and EMA; a copy on the device).
enum class Residence { kDevice, kHost };

/// One parameter's placement.
struct ParamPlacement {
  std::string name;   ///< state_dict key, e.g. "action_in_proj.weight"
  int64_t numel = 0;  ///< elements
  bool trainable = false;
  torch::ScalarType storage = torch::kFloat32;  ///< the parameter's tensor (the master copy of what trains)
  /// What its operations run in: the table's compute dtype (bf16 casts of float32 weights), except the layers the
  /// model keeps in float32 (action/state projections, time MLPs, adaRMS modulation).
  torch::ScalarType compute = torch::kFloat32;
  bool cast_cached = false;  ///< a compute-dtype copy is kept between forwards (nn::Dense's cast cache)
  Residence residence = Residence::kDevice;  ///< the parameter, its gradient, AdamW moments and EMA
  /// kHost: the dtype of the weight's copy on the device, the one its operations read (compute dtype for layer
  /// weights, storage dtype for the rest); its gradient on the device has this dtype too.
  torch::ScalarType device_copy = torch::kFloat32;

  bool on_host() const { return residence == Residence::kHost; }
  int64_t weight_bytes() const { return numel * static_cast<int64_t>(c10::elementSize(storage)); }
  /// The device copy of a host-resident parameter (0 otherwise); its gradient in flight has the same size.
  int64_t device_copy_bytes() const {
    return on_host() ? numel * static_cast<int64_t>(c10::elementSize(device_copy)) : 0;
  }
  /// Gradient (same dtype as the storage); 0 when frozen.
  int64_t grad_bytes() const { return trainable ? weight_bytes() : 0; }
  /// AdamW's exp_avg and exp_avg_sq (storage dtype); 0 when frozen.
  int64_t optimizer_bytes() const { return 2 * grad_bytes(); }
  /// Float32 EMA of a trainable parameter.
  int64_t ema_bytes() const { return trainable ? 4 * numel : 0; }
  int64_t cast_bytes() const { return cast_cached ? numel * static_cast<int64_t>(c10::elementSize(compute)) : 0; }
};

struct PlacementTable {
  std::string precision;  ///< train.precision
  bool ema = false;       ///< train.ema_decay > 0
  torch::ScalarType compute = torch::kFloat32;  ///< the model's compute dtype (Pi0Impl::set_compute_dtype)
  torch::ScalarType buffers = torch::kFloat32;  ///< the model's buffers (bf16 under "bf16")
  bool offload = false;                         ///< train.offload=optimizer: what trains lives on the host
  /// offload: a float32 gradient accumulation per host-resident parameter (train.grad_accum_steps > 1); without
  /// it each gradient is used in the dtype it arrives in
  bool host_accumulation = true;
  /// offload: a pinned transfer buffer per host-resident parameter in its device copy's dtype (a CUDA device)
  bool host_transfer = false;
  std::vector<ParamPlacement> params;           ///< registration order (named_parameters())

  /// The trainable flags, in registration order.
  std::vector<bool> trainable_mask() const;
};

/// The rule applied to `layout` with its trainable flags. UserError for an unknown precision (lists the valid
/// ones, suggests the closest); PI0_CHECK for a mask of the wrong length.
PlacementTable make_placement(const std::vector<model::ParamSpec>& layout, const std::vector<bool>& trainable,
                              const std::string& precision, bool ema, bool cast_cache, bool offload = false);
/// The table of a config: its model's layout (shapes only), train.freeze and its regexes, train.precision,
/// train.ema_decay and train.weight_cast_cache, with `offload` (train.offload resolved: "auto" is decided by the
/// memory plan, memory_plan.h). What the trainer builds and what --print-params counts.
PlacementTable make_placement(const config::Config& cfg, bool offload);
/// The same with train.offload as written ("auto" counts as none).
PlacementTable make_placement(const config::Config& cfg);

/// `model`'s parameters, each with its entry of `table`, in registration order. PI0_CHECKs (naming `who`) that
/// they are the table's parameters in the table's order: what is built is what the plan counts.
std::vector<std::pair<const ParamPlacement*, torch::Tensor>> placed_parameters(model::Pi0Impl& model,
                                                                               const PlacementTable& table,
                                                                               const char* who);

/// Applies `table` to a built model (before its weights are loaded): requires_grad per the trainable flags, each
/// parameter's storage dtype and the model's compute and buffer dtypes. `weights_from_file`: the parameters are
/// uninitialized (resume, init_weights) and get new storage in their dtype instead of a conversion (never touched
/// in float32); LoRA factors, never in a base file, are drawn and converted. The model's parameters must be the
/// table's, in order (checked: the plan counts what is built).
void apply_placement(model::Pi0Impl& model, const PlacementTable& table, bool weights_from_file);

/// Counts and persistent training memory of one component (or of the whole model).
struct ComponentStats {
  std::string name;              ///< model::kComponents entry, or "total"
  int64_t total = 0;             ///< parameters (elements)
  int64_t trainable = 0;
  int64_t frozen = 0;
  int64_t weight_bytes = 0;      ///< parameter storage
  int64_t grad_bytes = 0;        ///< gradients of trainable parameters
  int64_t optimizer_bytes = 0;   ///< AdamW exp_avg + exp_avg_sq of trainable parameters
  int64_t ema_bytes = 0;         ///< float32 EMA of trainable parameters (0 when EMA is off)
  /// Copies in the compute dtype of layer weights stored in another (nn::Dense's cast cache): bf16 copies of
  /// trainable float32 layer weights under bf16-mixed, float32 copies of bf16-stored weights of the layers read in
  /// float32 (frozen ones under bf16-mixed; all under bf16); kept from one forward to the next, so persistent too
  int64_t cast_bytes = 0;
  /// train.offload=optimizer: the device copies of host-resident parameters (weights in the dtype they are read in)
  int64_t device_copy_bytes = 0;
  /// train.offload=optimizer: what lives in host memory: the master weights, AdamW moments and EMA of host-resident
  /// parameters, their float32 gradient accumulation where one is kept and their pinned transfer buffers (CUDA),
  /// PlacementTable::host_accumulation / host_transfer (0 without offload)
  int64_t host_bytes = 0;
  /// What stays on the training device between steps: everything of device-resident parameters, the device copies
  /// of host-resident ones.
  int64_t on_device_bytes = 0;
  double trainable_percent() const { return total > 0 ? 100.0 * static_cast<double>(trainable) / total : 0.0; }
  int64_t memory_bytes() const {
    return weight_bytes + grad_bytes + optimizer_bytes + ema_bytes + cast_bytes + device_copy_bytes;
  }
  /// What stays on the training device between steps.
  int64_t device_bytes() const { return on_device_bytes; }
};

/// Breakdown per component in model::kComponents order plus the sum; activations are estimated separately
/// (model/activation_memory.h).
struct ParamBreakdown {
  std::string precision;
  bool ema = false;
  bool offload = false;  ///< train.offload=optimizer (the table's)
  std::vector<ComponentStats> components;  ///< one per model::kComponents entry (zeros when absent)
  ComponentStats total;
};

/// The bytes of `table`, summed per component.
ParamBreakdown breakdown(const PlacementTable& table);
/// The same for `layout` and its mask under `precision`, with the cast cache on: breakdown(make_placement(...)).
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
