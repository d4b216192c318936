// train.offload=optimizer: what trains lives in host memory and the device holds only the weights its operations
// read. Per host-resident parameter (placement.h, Residence::kHost):
//   host    master weight, AdamW moments, EMA (float32, pageable: never DMA'd), one transfer buffer in the device
//           copy's dtype (pinned on CUDA: the gradient comes in there, the next weights go out from there), and a
//           float32 accumulation only where gradients must be summed (gradient accumulation, data parallelism, a
//           gradient arriving in pieces)
//   device  a copy of the weight in the dtype its layer reads (bf16 for layer weights under bf16-mixed)
// The model's parameter *is* the device copy, so the forward and backward run unchanged. Each copy's gradient leaves
// the device as soon as backward has accumulated it (the AccumulateGrad post hook of grad_hooks.h; on CUDA a copy on
// a side stream into the transfer buffer) and the host thread sums its squares there, in the dtype it arrived in
// (host_update.h: one pass, no temporaries), so no whole gradient buffer stays on the device and none is converted.
// After the last micro-batch the trainer reads the norm with the loss, and the update runs on the host thread layer
// group by layer group in the forward's order while the next step starts: per group one pass (host_update) does
// clipping, AdamW, the EMA and writes the next weights in the copy's dtype into the transfer buffers, which are then
// uploaded; the next forward waits at each layer (the model's layer gate) only until that layer's weights have landed.
//
// Bit for bit: a copy's gradient is what the plain path's cast back-propagates to its float32 master (bf16 → float32
// is exact), summed in the same order and dtype where it is summed, and the update is the same host_update over the
// same values; on the CPU build an offloaded run gives the plain run's losses, norms, weights, moments and EMA exactly
// (tests/integration/test_offload.cpp).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pi0/model/layer_gate.h"
#include "pi0/train/optimizer.h"
#include "pi0/train/placement.h"

namespace pi0::model {
class Pi0Impl;
}

namespace pi0::train {

class Ema;

/// Total memory of `device` in bytes (a CUDA device's, or the share the caching allocator is capped at with
/// setMemoryFraction, on LibTorch >= 2.9), 0 for the CPU: what train.offload=auto and gradient_checkpointing=auto plan
/// against.
int64_t device_memory_bytes(const torch::Device& device);

/// Starts CUDA and its caching allocator on `device` (no-op for the CPU). They start lazily, at the first CUDA
/// tensor, and the allocator's get/setMemoryFraction assert until then.
void init_cuda_allocator(const torch::Device& device);

/// The layer whose update group a host-resident parameter joins, by its name: {kVision, i} for SigLIP's layer i,
/// {kJoint, i} for joint layer i (both experts), nullopt for what lies outside the layers (the first group). Ordered
/// as the groups are updated: nullopt first, then SigLIP's layers, then the joint ones. The one rule for the offload
/// and bench_host_optimizer's replay.
std::optional<std::pair<model::LayerStack, int64_t>> update_layer_of(const std::string& name);

class OptimizerOffload {
 public:
  /// `model`: built on the host with `table` applied and its weights loaded. Every host-resident parameter's tensor
  /// becomes its master (pinned on CUDA) and the model's parameter a new tensor on `device` in the table's
  /// device_copy dtype. The caller then moves the rest of the model (frozen weights, buffers) to the device.
  /// `norms_as_they_arrive`: the host thread sums each accumulated gradient's squares during the last micro-batch
  /// (gradient_sum_of_squares()); off under data parallelism, where the all-reduce changes the gradients after.
  OptimizerOffload(model::Pi0Impl& model, const PlacementTable& table, torch::Device device,
                   bool norms_as_they_arrive);
  ~OptimizerOffload();
  OptimizerOffload(const OptimizerOffload&) = delete;
  OptimizerOffload& operator=(const OptimizerOffload&) = delete;

  /// (name, master) of every host-resident parameter in registration order: what AdamW, the EMA, the gradient sync
  /// and the checkpoints work on. Trainable leaves that are never part of a graph; after the last micro-batch's
  /// after_backward their .grad is the host accumulation.
  const NamedTensors& masters() const { return masters_; }

  /// Before the forward of micro-batch `micro` of `n`: micro 0 starts the step's accumulation and waits until the
  /// weights outside the layers have landed (on CUDA: the compute stream waits for their copies); each layer's own
  /// wait is wait_for_layer.
  void before_forward(int64_t micro, int64_t n);
  /// After micro-batch `micro` of `n`'s backward: waits until its gradients are in the host accumulation. After the
  /// last one each master's .grad is its accumulation (undefined where no micro-batch produced a gradient).
  void after_backward(int64_t micro, int64_t n);
  /// The accumulated gradients' sum of squares (float64 scalar on the host), computed per tensor by the host thread
  /// as the last micro-batch's gradients arrived: equal to gradient_sum_of_squares() over the masters' .grad. Only
  /// with norms_as_they_arrive.
  torch::Tensor gradient_sum_of_squares() const;
  bool norms_as_they_arrive() const;
  /// The device copies take the masters' new values, all of them now (MasterWeightsScope after a load), group by
  /// group as update_in_forward_order uploads them, so the forward's waits are the same.
  void upload();

  /// The gradients the update applies, aligned with masters() (undefined: none this step): the transfer buffers or
  /// accumulations holding them, in the dtype they are in (bf16 for bf16 copies without accumulation). Valid after
  /// the last micro-batch's after_backward until the update has read them.
  std::vector<torch::Tensor> gradients() const;

  /// One step's host update: AdamW (already counted with begin_step) at `lr`, the gradients scaled by `grad_scale`
  /// (clipping), then the EMA (when set) — the trainer's plain update, fused.
  struct HostStep {
    AdamW* optimizer = nullptr;
    Ema* ema = nullptr;
    double lr = 0;
    double grad_scale = 1.0;
    std::vector<torch::Tensor> grads;  ///< gradients(), held until the update has read them
  };
  /// The host update overlapped with the next step, the way the trainer runs it: on the host thread, group by group
  /// in the forward's order (everything outside the transformer layers, then SigLIP's layers, then the joint
  /// layers), one host_update pass per group does clipping, AdamW and the EMA over those masters and writes the new
  /// weights into the group's transfer buffers, which are uploaded. Returns at once. The next forward waits only for
  /// what it reads: before_forward for the first group, wait_for_layer (the model's layer gate) for each layer's. The
  /// result is the plain AdamW::step + Ema::update + upload(), bit for bit: each group's update is elementwise, the
  /// same arithmetic, and lands before anything reads it.
  void update_in_forward_order(HostStep step);
  /// Blocks until a pending update_in_forward_order has finished and rethrows its failure: before anything reads the
  /// masters, the AdamW moments or the EMA (checkpoints, exports, tests).
  void finish_update() const;
  /// The model's layer gate (model/layer_gate.h): returns once the layer's parameters of a pending update have
  /// landed (on CUDA: the compute stream waits for their copies).
  void wait_for_layer(model::LayerStack stack, int64_t layer);
  /// Before a forward outside a training step (validation): returns once every group's weights of a pending update
  /// have landed (on CUDA: the compute stream waits for their copies).
  void wait_for_weights();
  /// Index lists of masters() in update order (the groups above; empty groups left out), for tests.
  std::vector<std::vector<size_t>> update_groups() const;

  /// While alive, the model's host-resident parameters are the masters (checkpoints save and load exactly what the
  /// plain path holds); on destruction the device copies are back, refreshed from the masters.
  class MasterWeightsScope {
   public:
    MasterWeightsScope(OptimizerOffload* offload);  ///< null: nothing to do (no offload)
    ~MasterWeightsScope() noexcept(false);
    MasterWeightsScope(const MasterWeightsScope&) = delete;
    MasterWeightsScope& operator=(const MasterWeightsScope&) = delete;

   private:
    OptimizerOffload* offload_;
    std::vector<torch::Tensor> device_;
  };

  /// Measured from the tensors (tests compare them with the plan): the masters, accumulations, AdamW moments and EMA
  /// are counted by their owners; these are the masters, the float32 accumulations plus the pinned transfer buffers,
  /// and the device copies.
  int64_t master_bytes() const;
  int64_t accumulation_bytes() const;
  int64_t device_copy_bytes() const;
  /// Where a step's host time goes (train.offload in metrics.jsonl and the progress line), wall seconds of the step
  /// that last ran before_forward(0) .. after_backward(last):
  struct StepTimes {
    double host_grad = 0;     ///< the host thread on this step's gradients (waits for copies, sums, norms)
    double host_update = 0;   ///< the host thread on the previous step's update (it ran during this step's start)
    double forward_wait = 0;  ///< the main thread waiting for that update's weights (before_forward, layer gates)
  };
  StepTimes step_times() const;
  /// The threads of the host side, for the log: the update pool's size.
  std::string describe_threads() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  NamedTensors masters_;
};

}  // namespace pi0::train
