// The training job: flow-matching fine-tuning of pi0 / pi0.5 with AdamW, warmup-cosine LR, clipping, EMA,
// gradient accumulation, freezing presets / LoRA, mixed precision and exact resume. The Trainer is checkpointed
// state (step, RNG, loader position, optimizer, EMA), which it hands to its Checkpointer (checkpointer.h) as a
// CheckpointedState; run() reads top to bottom in one function: resume; loop { step; maybe log; maybe save }.
#pragma once
#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <optional>
#include <string>

#include <torch/torch.h>

#include "pi0/common/profiler.h"
#include "pi0/config/config.h"
#include "pi0/data/loader.h"
#include "pi0/distributed/grad_sync.h"
#include "pi0/distributed/process_group.h"
#include "pi0/io/model_weights.h"
#include "pi0/model/pi0.h"
#include "pi0/train/checkpointer.h"
#include "pi0/train/data_setup.h"
#include "pi0/train/ema.h"
#include "pi0/train/placement.h"
#include "pi0/train/metrics_processor.h"
#include "pi0/train/offload.h"
#include "pi0/train/optimizer.h"

namespace pi0::train {

struct RunOptions {
  bool resume = false;  ///< continue from the newest complete checkpoint in checkpoint.run_dir
  /// With resume: accept a checkpoint written with another held-out validation set (pi0-train
  /// --new-validation-set); without it such a resume is refused (Checkpointer::set_validation_set).
  bool new_validation_set = false;
  int64_t rank = 0;
  int64_t world_size = 1;
  /// Data parallel: set when world_size > 1 (rank and world_size must match it). Gradients are averaged over
  /// ranks, rank 0 logs and writes checkpoints, every rank's RNG and loader position are checkpointed.
  std::shared_ptr<distributed::ProcessGroup> process_group;
  /// false: no checkpoint after the last step (benchmarks measure steps; a full-size checkpoint is ~50 GB). Periodic
  /// saves (checkpoint.save_interval) and the save on a stop signal still happen.
  bool final_checkpoint = true;
  /// pi0-train --profile-steps: the profiler (common/profiler.h) records options.steps of the coming steps after
  /// options.wait_steps and writes its trace and table into options.dir (rank r > 0: <dir>/rank<r>); nullopt: off.
  std::optional<ProfilerOptions> profile;
};

/// Raised when training must stop (non-finite loss or gradient norm); names the step and rank.
class TrainingError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Noise and flow-matching time of one optimizer step, given instead of drawn from the trainer's generator
/// (parity tests replay a reference's values). One entry per micro-batch, this rank's rows.
struct StepNoise {
  std::vector<torch::Tensor> noise;  ///< [B,H,A] per micro-batch
  std::vector<torch::Tensor> time;   ///< [B] per micro-batch, in (0, 1]
};

/// What one optimizer step did.
struct StepResult {
  double loss = 0.0;       ///< mean loss over the micro-batches (this rank), before the update: flow matching, or
                           ///< with train.ki the weighted sum of the FAST cross-entropy and flow matching
  double grad_norm = 0.0;  ///< global gradient norm before clipping
  bool skipped = false;    ///< non-finite loss or gradient norm: no update (allowed by train.max_nonfinite_skips)
  bool stop = false;       ///< a stop signal reached some rank (checked alongside the loss, in one collective)
  /// train.ki: the step's parts, means over the micro-batches (this rank): loss = ce_weight·ce + flow_weight·flow.
  struct Ki {
    double ce = 0.0;        ///< FAST cross-entropy (per-example mean over valid targets, batch mean)
    double flow = 0.0;      ///< flow-matching loss (reduced as without KI: mean, or train.loss_mask's masked mean)
    double correct = 0.0;   ///< FAST targets predicted by the argmax (sum over the micro-batches)
    double targets = 0.0;   ///< FAST targets (sum)
  };
  std::optional<Ki> ki;
  /// model.type pi0_fast: loss is openpi's pi0-FAST cross-entropy (per-example mean over the FAST layout's loss-masked
  /// targets, batch mean); its accuracy's parts, sums over the micro-batches (this rank).
  struct FastAccuracy {
    double correct = 0.0;  ///< targets predicted by the argmax
    double targets = 0.0;  ///< loss-masked targets
  };
  std::optional<FastAccuracy> fast;
  /// model.type pi0_fast and train.ki: examples whose teacher-forced FAST prediction holds no actions
  /// (train/fast_decoding.h) and examples with FAST targets, sums over the micro-batches (this rank).
  struct FastDecoding {
    double undecodable = 0.0;
    double sequences = 0.0;
  };
  std::optional<FastDecoding> fast_decoding;
  /// train.subtask: the subtask cross-entropy (per-example mean over its targets, batch mean; mean over the
  /// micro-batches) and its accuracy's parts (sums); the loss adds train.subtask.weight times the cross-entropy.
  struct Subtask {
    double ce = 0.0;
    double correct = 0.0;
    double targets = 0.0;
  };
  std::optional<Subtask> subtask;
};

class Trainer {
 public:
  Trainer(config::Config cfg, RunOptions options = {});
  ~Trainer();

  /// Trains until train.num_steps or a stop signal (SIGINT/SIGTERM: finishes the step, saves, returns).
  /// Returns the number of completed optimizer steps.
  int64_t run();

  /// One optimizer update, exactly as run() does it: forward and backward over `micro_batches` (train.grad_accum_steps
  /// of them, this rank's slice), gradient all-reduce, clipping, the non-finite check (throws TrainingError, or
  /// skips within train.max_nonfinite_skips), AdamW at learning rate `lr`, EMA. Noise and time are drawn from the
  /// trainer's generator unless `noise_time` gives them. Does not advance step(); run() does.
  StepResult train_step(const std::vector<model::Batch>& micro_batches, double lr,
                        const std::optional<StepNoise>& noise_time = std::nullopt);

  /// The model. With train.offload=optimizer its trainable parameters are the device copies (compute dtype); the
  /// master weights are trainable_weights(). This and the next two accessors first wait for train.offload's host
  /// update of the last step, which runs on while the next step starts.
  model::Pi0& model();
  /// (name, weight) of every trainable parameter at full precision: the model's own, or with train.offload=optimizer
  /// the host masters.
  const NamedTensors& trainable_weights() const;
  /// The EMA of the trainable parameters (nullptr when train.ema_decay is 0).
  const Ema* ema() const;
  /// train.offload=optimizer in effect (after "auto" was decided); null otherwise.
  const OptimizerOffload* offload() const { return offload_.get(); }
  int64_t step() const { return step_; }
  const config::Config& config() const { return cfg_; }
  /// A validation pass over the pipeline's held-out samples with the current weights (nullopt without a validation
  /// split): the flow-matching loss with noise and time fixed per sample (drawn from the seed and the sample's place
  /// in the set, so the same every pass, across a resume and at any world size), and the squared error of actions
  /// sampled in 10 Euler steps from that noise against the recorded ones, over the robot's own action dims (and
  /// with train.loss_mask episode_end the recorded rows). model.type pi0_fast: its cross-entropy, and the actions of
  /// greedy decoding from the prompt alone read as pi0-infer reads them (ValidationResult::fast_undecodable).
  /// Collective when data-parallel: each rank evaluates every world_size-th sample, the sums are all-reduced.
  std::optional<ValidationResult> validate();
  /// Writes a checkpoint of the current state (run() calls it at save_interval and at the end).
  std::string save_checkpoint();
  /// Gradient reduction statistics (nullptr in single-process runs).
  const distributed::GradReducerStats* reducer_stats() const { return grad_sync_ ? grad_sync_->stats() : nullptr; }
  /// Tensor bytes of training state this rank holds (what dist.shard partitions), measured from the tensors.
  struct RankStateBytes {
    int64_t optimizer = 0;  ///< AdamW moments
    int64_t ema = 0;        ///< EMA averages
    int64_t grads = 0;      ///< gradients after the last step's reduction, before the update
  };
  RankStateBytes rank_state_bytes() const;

 private:
  void build_model();
  /// The placement table (freeze preset, trainable regexes, precision) and the attention setting, made and checked
  /// from shapes before anything is built.
  void plan_model();
  /// What a checkpoint holds of this trainer, by reference.
  CheckpointedState state();
  /// The next train.grad_accum_steps batches of this rank.
  std::vector<model::Batch> next_micro_batches();
  /// Rank 0: stale temporary checkpoints removed, config.yaml written and metrics.jsonl opened (the metrics
  /// processor starts), the plan logged.
  void open_run_dir();
  /// Data parallel, after the first step: each rank's optimizer, EMA and gradient bytes, logged by rank 0.
  void log_held_state();
  /// After a validation pass (and the save at its step): "best so far: step N (val_loss x)", by checkpoint.keep_best's
  /// ranking when it is on. Rank 0. `first_step`: the step this start began at.
  void log_best_so_far(int64_t first_step);
  int64_t local_batch() const;
  void check_and_sync_replicas();

  config::Config cfg_;
  RunOptions options_;
  torch::Device device_{torch::kCPU};
  model::Pi0 model_{nullptr};
  PlacementTable placement_;  ///< where each parameter lives and in which dtype; what the memory plan counts
  std::unique_ptr<OptimizerOffload> offload_;  ///< train.offload=optimizer (placement_.offload)
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<Ema> ema_;
  std::shared_ptr<distributed::ProcessGroup> pg_;  ///< null in single-process runs
  /// Gradient synchronisation (none, DDP, ZeRO-1, ZeRO-2 by dist.shard); also says what this rank's optimizer and
  /// EMA update (everything, or its share of the elements).
  std::unique_ptr<distributed::GradSync> grad_sync_;
  NamedTensors trainable_params_;  ///< every trainable parameter, whatever this rank's share
  int64_t last_grad_bytes_ = 0;
  DataPipeline data_;
  /// train.subtask with a validation split: the cue's ids and EOS, where validation's greedy decoding starts and ends.
  std::vector<int64_t> subtask_cue_;
  int64_t subtask_eos_ = 0;
  /// Noise and flow-matching time; CPU, saved with checkpoints. Seeded alike on every rank: each rank draws the
  /// values of the whole global batch and keeps its slice, so results do not depend on the world size.
  at::Generator rng_;
  int64_t step_ = 0;
  int64_t nonfinite_skips_ = 0;
  Checkpointer checkpointer_;
  std::optional<std::string> resume_dir_;  ///< checkpoint restored by run()
  std::optional<MetricsProcessor> metrics_;  ///< intervals, metrics.jsonl and the progress line (from run())
  /// The latest validation pass's loss and its step: a checkpoint of that step records it (checkpoint.keep_best).
  std::optional<std::pair<int64_t, double>> last_val_;
  /// The lowest validation pass of this start (step, val_loss): "best so far" without checkpoint.keep_best.
  std::optional<std::pair<int64_t, double>> best_val_;
};

}  // namespace pi0::train
