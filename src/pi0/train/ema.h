// Exponential moving average of parameters (openpi JAX train loop, openpi-reference §8.2):
// after each optimizer step  ema = d·ema + (1 − d)·param,  initialized to the parameters. Kept in float32
// whatever the parameter dtype, so bf16 training still averages in full precision.
//
// NOTE: openpi averages *all* parameters, frozen ones included. A frozen parameter never changes, so its average
// is the parameter itself (up to float rounding of d·p + (1 − d)·p); we recommend handing in only the trainable
// parameters, which gives the same weights without a float32 copy of the frozen ones (the memory breakdown in
// placement.h assumes this choice). Anything missing from the EMA is exported from the live model.
#pragma once
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pi0/train/optimizer.h"

namespace pi0::train {

class Ema {
 public:
  /// `params`: (name, parameter) pairs to average (referenced, not copied); decay d in [0, 1), e.g. 0.99.
  Ema(NamedTensors params, double decay);

  /// ema ← d·ema + (1 − d)·param for every tracked parameter (call after optimizer.step()).
  void update();
  /// The same for the parameters at `indices` (into the params handed in): an update in pieces (train.offload's, in
  /// the forward's order) that equals update() bit for bit when the pieces cover every parameter once.
  void update(const std::vector<size_t>& indices);

  double decay() const { return decay_; }
  /// The float32 averages, aligned with the params handed in (train.offload's fused host update writes them).
  const std::vector<torch::Tensor>& averages() const { return averages_; }
  /// name → float32 average (shallow; clone before mutating). Keys equal the parameter names.
  std::map<std::string, torch::Tensor> state_dict() const;
  /// Restores averages; every tracked name must be present with its shape (UserError naming `source` and key).
  /// (A resume streams checkpoint files into state_dict()'s tensors instead: io::StateReader.)
  void load_state_dict(const std::map<std::string, torch::Tensor>& state, const std::string& source = "EMA state");

  /// Copies the averages into `weights` (e.g. model named parameters for export), each cast to the
  /// destination's dtype; names absent from `weights` or not tracked here are skipped.
  void copy_to(std::map<std::string, torch::Tensor>& weights) const;
  /// Same for a module's parameters; every tracked name must be a parameter of `model` (programmer error).
  void copy_to(torch::nn::Module& model) const;

 private:
  void update_other(const std::vector<size_t>& indices);  // parameters not in host float32: ATen's ops

  NamedTensors params_;
  std::vector<torch::Tensor> averages_;
  double decay_;
};

/// RAII swap: while alive, `model` holds the EMA weights (for evaluation or export); the live weights are
/// restored on destruction. Keeps one copy of the tracked parameters in their own dtype.
class ScopedEmaWeights {
 public:
  ScopedEmaWeights(const Ema& ema, torch::nn::Module& model);
  ~ScopedEmaWeights();
  ScopedEmaWeights(const ScopedEmaWeights&) = delete;
  ScopedEmaWeights& operator=(const ScopedEmaWeights&) = delete;

 private:
  torch::nn::Module& model_;
  std::map<std::string, torch::Tensor> backup_;
};

}  // namespace pi0::train
