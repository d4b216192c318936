// AdamW over an explicit list of named trainable parameters, and global-norm gradient clipping.
// Mirrors torch.optim.AdamW (single-tensor path) and torch.nn.utils.clip_grad_norm_, which openpi's PyTorch
// trainer uses with β = (0.9, 0.95), eps 1e-8, weight decay 1e-10 and max norm 1.0 (openpi-reference §8.2).
// Only the parameters handed in get state, so frozen weights cost no optimizer memory.
//
// NOTE: state dtype = parameter dtype: float32 parameters (the float32 and bf16-mixed precision modes) get
// float32 moments; bfloat16 parameters (pure "bf16" mode) get bfloat16 moments, as torch.optim.AdamW does.
// NOTE: one step count for all parameters (as optax). A parameter whose grad is undefined at step() is skipped
// (no decay, no moment update, like torch), but later bias corrections still use the shared count.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>
#include <torch/version.h>

// LibTorch >= 2.0 has every _foreach_* op used here (lerp, scalar-list-free addcdiv, norm).
#if TORCH_VERSION_MAJOR >= 2
#define PI0_HAVE_FOREACH 1
#else
#define PI0_HAVE_FOREACH 0
#endif

namespace pi0::train {

struct AdamWOptions {
  double beta1 = 0.9;           ///< first-moment decay
  double beta2 = 0.95;          ///< second-moment decay
  double eps = 1e-8;            ///< added to sqrt(v̂)
  double weight_decay = 1e-10;  ///< decoupled: p ← p − lr·wd·p before the Adam update (all trainable params)
  bool foreach = true;          ///< multi-tensor (_foreach_*) update where LibTorch has it (>= 2.0)
  /// float32 parameters in host memory: one pass over each tensor (train/host_update.h's host_update, on its own
  /// thread pool) instead of the op sequence's eight. The same function for every host update, offloaded
  /// (train.offload) or not, so the two stay bit-identical.
  bool fused_host = true;
};

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

class AdamW {
 public:
  /// `params`: (state_dict name, parameter) of every trainable parameter; names must be unique.
  explicit AdamW(NamedTensors params, AdamWOptions options = {});

  /// One update with learning rate `lr` (from the schedule, evaluated at the 0-based update index), from each
  /// parameter's .grad.
  void step(double lr);
  /// The same from explicit gradients, aligned with params() (undefined = no gradient this step): for sharded
  /// training, whose parameters are views of owned elements and whose gradients live elsewhere. `grad_scale`:
  /// clipping's factor (clip_scale), applied as the update reads each gradient (host parameters) or in place before
  /// it (the others), so no separate pass over the gradients is needed.
  void step(double lr, const std::vector<torch::Tensor>& grads, double grad_scale = 1.0);
  /// step() in pieces, for an update that overlaps other work (train.offload updates the layers in the forward's
  /// order while the next step starts): begin_step() counts the step, then step_part() updates the parameters at
  /// `indices` (into params()) from `grads` (aligned with params()). Pieces covering every parameter once equal one
  /// step() bit for bit: the update is elementwise.
  void begin_step();
  void step_part(double lr, const std::vector<torch::Tensor>& grads, const std::vector<size_t>& indices,
                 double grad_scale = 1.0);
  /// The moments, aligned with params(): for a caller that fuses the update with other work (train.offload's host
  /// update: AdamW, EMA and the upload staging in one pass, host_update.h).
  const std::vector<torch::Tensor>& exp_avgs() const { return exp_avg_; }
  const std::vector<torch::Tensor>& exp_avg_sqs() const { return exp_avg_sq_; }

  /// Number of step() calls so far (also restored by load_state_dict and restore_step_count).
  int64_t step_count() const { return step_; }
  /// For state read back piece by piece (sharded checkpoints) into the tensors of state_dict().
  void restore_step_count(int64_t step) { step_ = step; }
  const AdamWOptions& options() const { return options_; }
  const NamedTensors& params() const { return params_; }

  /// Key of the step count in the state map (an int64 scalar tensor).
  static constexpr const char* kStepKey = "step";
  /// "<name>.exp_avg", "<name>.exp_avg_sq" for every parameter, plus kStepKey; tensors are shallow copies
  /// (clone before mutating). Writable to safetensors as is.
  std::map<std::string, torch::Tensor> state_dict() const;
  /// Restores what state_dict() produced. Every expected key must be present with the parameter's shape
  /// (UserError names `source` (e.g. the file) and the missing or mismatched key); unexpected keys are an error
  /// too, since they mean the checkpoint was written for another set of trainable parameters. (A resume streams
  /// checkpoint files into state_dict()'s tensors instead, io::StateReader, and restores the count with
  /// restore_step_count.)
  void load_state_dict(const std::map<std::string, torch::Tensor>& state, const std::string& source = "optimizer state");

 private:
  NamedTensors params_;
  std::vector<torch::Tensor> exp_avg_, exp_avg_sq_;
  AdamWOptions options_;
  int64_t step_ = 0;
};

/// AdamW's update of float32 tensors in host memory in one pass over their elements (host_update.h's host_update on
/// the host pool): with the optimizer on the host (train.offload) the update is memory-bound, and the op sequence
/// reads and writes each tensor ~8 times. Same formulas, in float32, as torch.optim.AdamW: p·(1 − lr·wd),
/// m lerped towards g by 1 − β1, v·β2 + (1 − β2)·g², p − lr/(1 − β1ᵗ) · m / (√v / √(1 − β2ᵗ) + ε). `step` is the
/// 1-based update count. Every tensor must be contiguous float32 in host memory (gradients float32 or bfloat16), the
/// four lists aligned; each gradient is multiplied by `grad_scale` as it is read.
void host_adamw_step(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
                     const std::vector<torch::Tensor>& exp_avgs, const std::vector<torch::Tensor>& exp_avg_sqs,
                     double lr, int64_t step, const AdamWOptions& options, double grad_scale = 1.0);
/// Whether host_adamw_step takes this parameter and gradient (contiguous, host memory, same size; a float32
/// parameter, a float32 or bfloat16 gradient).
bool host_adamw_takes(const torch::Tensor& param, const torch::Tensor& grad);

/// Calls fn on consecutive groups of the parallel `lists` (same length; grouped by the first list's device,
/// dtype and a bound of max_elements elements), for multi-tensor ops whose temporaries must stay bounded.
void for_each_group(const std::vector<std::vector<torch::Tensor>*>& lists,
                    const std::function<void(const std::vector<std::vector<torch::Tensor>>&)>& fn,
                    int64_t max_elements = int64_t{1} << 26);

/// Global L2 norm of all defined gradients of `params` (accumulated in float64), returned before clipping.
/// When the norm exceeds max_norm, every gradient is scaled in place by max_norm / (norm + 1e-6), like
/// torch.nn.utils.clip_grad_norm_. A non-finite norm is returned with the gradients left untouched, so the
/// caller can stop before optimizer.step().
double clip_grad_norm(std::vector<torch::Tensor>& params, double max_norm);
/// The same over gradient tensors (undefined ones skipped). `sum_over_ranks` (when set) turns this rank's sum of
/// squares into the global one: with sharded gradients each rank holds a disjoint part.
double clip_gradients(const std::vector<torch::Tensor>& grads, double max_norm,
                      const std::function<double(double)>& sum_over_ranks = {});
/// clip_gradients in its two halves, for a caller that reads the sum together with other values (the trainer reads
/// it with the step's loss: one wait for the GPU per step). The sum of squares of the defined gradients as a float64
/// scalar on their device (undefined when there are none); nothing is read to the host.
torch::Tensor gradient_sum_of_squares(const std::vector<torch::Tensor>& grads);
/// One tensor's sum of squares as a float64 scalar on its device. On the CPU it is host_update.h's
/// host_sum_of_squares (one pass, no temporaries, an order fixed by the size, the same for a bf16 tensor and its
/// float32 values), and gradient_sum_of_squares adds these up in list order, so a caller holding the per-tensor
/// values (the optimizer offload computes them as gradients arrive) gets the same bits by adding them in that order.
torch::Tensor tensor_sum_of_squares(const torch::Tensor& g);
/// Clipping's factor: max_norm / (norm + 1e-6) when `norm` (finite) exceeds max_norm, else 1 (like
/// torch.nn.utils.clip_grad_norm_). AdamW::step takes it as grad_scale.
double clip_scale(double norm, double max_norm);
/// Scales every defined gradient in place by clip_scale(norm, max_norm) when that is not 1.
void scale_gradients_to_norm(const std::vector<torch::Tensor>& grads, double norm, double max_norm);

}  // namespace pi0::train
