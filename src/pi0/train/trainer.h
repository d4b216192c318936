// The training job: flow-matching fine-tuning of pi0 / pi0.5 with AdamW, warmup-cosine LR, clipping, EMA,
// gradient accumulation, freezing presets / LoRA, mixed precision and exact resume. The Trainer is checkpointed
// state (step, RNG, loader position, optimizer, EMA); run() reads top to bottom in one function.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include <torch/torch.h>

#include "pi0/config/config.h"
#include "pi0/data/loader.h"
#include "pi0/dist/grad_reducer.h"
#include "pi0/dist/process_group.h"
#include "pi0/model/pi0.h"
#include "pi0/train/data_setup.h"
#include "pi0/train/ema.h"
#include "pi0/train/freeze.h"
#include "pi0/train/optimizer.h"

namespace pi0::train {

struct RunOptions {
  bool resume = false;  ///< continue from the newest complete checkpoint in checkpoint.run_dir
  int64_t rank = 0;
  int64_t world_size = 1;
  /// Data parallel: set when world_size > 1 (rank and world_size must match it). Gradients are averaged over
  /// ranks, rank 0 logs and writes checkpoints, every rank's RNG and loader position are checkpointed.
  std::shared_ptr<dist::ProcessGroup> process_group;
};

/// Raised when training must stop (non-finite loss or gradient norm); names the step and rank.
class TrainingError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Trainable-parameter breakdown of the configured model computed from shapes only (full-size models are never
/// allocated), under the configured freeze preset, precision and EMA setting.
ParamBreakdown planned_breakdown(const config::Config& cfg);

class Trainer {
 public:
  Trainer(config::Config cfg, RunOptions options = {});
  ~Trainer();

  /// Trains until train.num_steps or a stop signal (SIGINT/SIGTERM: finishes the step, saves, returns).
  /// Returns the number of completed optimizer steps.
  int64_t run();

  model::Pi0& model() { return model_; }
  int64_t step() const { return step_; }
  const config::Config& config() const { return cfg_; }
  /// Writes a checkpoint of the current state (run() calls it at save_interval and at the end).
  std::string save_checkpoint();
  /// Gradient all-reduce statistics (nullptr in single-process runs).
  const dist::GradReducerStats* reducer_stats() const { return reducer_ ? &reducer_->stats() : nullptr; }

 private:
  void build_model();
  void restore(const std::string& checkpoint_dir);
  int64_t local_batch() const;
  void check_and_sync_replicas();

  config::Config cfg_;
  RunOptions options_;
  torch::Device device_{torch::kCPU};
  model::Pi0 model_{nullptr};
  std::vector<bool> trainable_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<Ema> ema_;
  std::shared_ptr<dist::ProcessGroup> pg_;      ///< null in single-process runs
  std::unique_ptr<dist::GradReducer> reducer_;  ///< null in single-process runs
  DataPipeline data_;
  /// Noise and flow-matching time; CPU, saved with checkpoints. Seeded alike on every rank: each rank draws the
  /// values of the whole global batch and keeps its slice, so results do not depend on the world size.
  at::Generator rng_;
  int64_t step_ = 0;
  int64_t nonfinite_skips_ = 0;
};

}  // namespace pi0::train
