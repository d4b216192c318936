// The training job: flow-matching fine-tuning of pi0 / pi0.5 with AdamW, warmup-cosine LR, clipping, EMA,
// gradient accumulation, freezing presets / LoRA, mixed precision and exact resume. The Trainer is checkpointed
// state (step, RNG, loader position, optimizer, EMA), which it hands to its Checkpointer (checkpointer.h) as a
// TrainState; run() reads top to bottom in one function: resume; loop { step; maybe log; maybe save }.
#pragma once
#include <algorithm>
#include <chrono>
#include <memory>
#include <set>
#include <optional>
#include <string>

#include <torch/torch.h>

#include "pi0/config/config.h"
#include "pi0/data/loader.h"
#include "pi0/distributed/grad_reducer.h"
#include "pi0/distributed/parameter_shards.h"
#include "pi0/distributed/process_group.h"
#include "pi0/distributed/shard_layout.h"
#include "pi0/distributed/sharded_grad_reducer.h"
#include "pi0/io/model_weights.h"
#include "pi0/model/activation_memory.h"
#include "pi0/model/pi0.h"
#include "pi0/train/checkpointer.h"
#include "pi0/train/data_setup.h"
#include "pi0/train/ema.h"
#include "pi0/train/freeze.h"
#include "pi0/train/metrics.h"
#include "pi0/train/optimizer.h"

namespace pi0::train {

struct RunOptions {
  bool resume = false;  ///< continue from the newest complete checkpoint in checkpoint.run_dir
  int64_t rank = 0;
  int64_t world_size = 1;
  /// Data parallel: set when world_size > 1 (rank and world_size must match it). Gradients are averaged over
  /// ranks, rank 0 logs and writes checkpoints, every rank's RNG and loader position are checkpointed.
  std::shared_ptr<distributed::ProcessGroup> process_group;
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
  double loss = 0.0;       ///< mean flow-matching loss over the micro-batches (this rank), before the update
  double grad_norm = 0.0;  ///< global gradient norm before clipping
  bool skipped = false;    ///< non-finite loss or gradient norm: no update (allowed by train.max_nonfinite_skips)
  bool stop = false;       ///< a stop signal reached some rank (checked alongside the loss, in one collective)
};

/// Trainable-parameter breakdown of the configured model computed from shapes only (full-size models are never
/// allocated), under the configured freeze preset, precision and EMA setting.
ParamBreakdown planned_breakdown(const config::Config& cfg);

/// Planned memory of one training rank: the persistent state of planned_breakdown (weights, AdamW, EMA, cast
/// cache) and, during the step, the activations of one micro-batch (batch_size / (world size ·
/// grad_accum_steps)) and the gradients. Gradients exist only from backward to the optimizer step (zero_grad
/// frees them), and backward frees activations as it creates gradients, so the step holds the larger of the two
/// (see model/activation_memory.h), not their sum. peak_bytes() is what the tensor allocator holds at the peak;
/// the process's resident memory (peak RSS) adds the runtime and the allocator's slack: resident_peak_bytes().
struct MemoryPlan {
  /// Resident memory of pi0-train beyond its tensors and the allocator slack: shared libraries' pages, thread
  /// stacks, the BLAS's buffers, LibTorch's own allocations, the dataset index and the tokenizer. Calibrated on a
  /// training run of a model of almost no size (dummy / tiny variants, vocabulary 1024, batch 1, 224 px, one loader
  /// worker; x86-64 Debian LibTorch 1.13, OpenBLAS, glibc 2.36): its peak RSS, median 0.46 GiB of 5 runs (0.42-
  /// 0.49), minus its own planned tensors (0.11 GiB, mostly activations) and slack (0.11 GiB). 0.13 GiB of it are
  /// the libraries' pages (RssFile). The same with 1 or 2 threads. The full-size presets and a mid-size full
  /// fine-tune check the calibrated plan (docs/benchmarks.md, issue 15).
  static constexpr int64_t kRuntimeFloorBytes = 248ll << 20;

  ParamBreakdown params;
  model::ActivationMemory activations;
  int64_t micro_batch = 0;
  int64_t num_cameras = 0;
  /// kRuntimeFloorBytes plus the data loader's batches beyond the one-sample batches of the floor: (data.prefetch
  /// queued + one per worker being built) · (per-rank batch − 1) float32 images (cameras · 3 · image_size² · 4 B).
  int64_t runtime_bytes = 0;
  /// Freed memory glibc keeps resident at the peak: one activation working set (activations.peak()). Tensors
  /// below glibc's mmap threshold come from its heaps, and the threshold rises to the largest block freed (up to
  /// 32 MiB: after the model build, every activation-sized tensor); backward and the recomputation of
  /// checkpointed layers allocate while the forward's freed blocks of other sizes are still on the free lists.
  /// Measured at full size (batch 1, activation set 0.40 GiB): a fixed 1 MiB threshold
  /// (MALLOC_MMAP_THRESHOLD_=1048576) lowered the peak RSS of the presets by 0.49-0.78 GiB, at 3-5× the page
  /// faults, which is why glibc's default stays; the predictions stay 1-7 % below the measured peaks.
  int64_t allocator_slack_bytes = 0;
  int64_t peak_bytes() const {
    const int64_t grads = params.total.grad_bytes;
    return params.total.memory_bytes() - grads +
           std::max(activations.saved, grads + activations.last_layer) + activations.transient;
  }
  int64_t resident_peak_bytes() const { return peak_bytes() + runtime_bytes + allocator_slack_bytes; }
};
/// Planned for `world_size` ranks; UserError when the global batch does not split evenly (as training would).
MemoryPlan plan_memory(const config::Config& cfg, int64_t world_size = 1);
/// Samples per rank per micro-step (what the loader builds per next()): train.batch_size / (world size ·
/// train.grad_accum_steps). UserError naming both when it does not divide.
int64_t micro_batch_size(const config::TrainConfig& t, int64_t world_size);

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

  model::Pi0& model() { return model_; }
  /// The EMA of the trainable parameters (nullptr when train.ema_decay is 0).
  const Ema* ema() const { return ema_.get(); }
  int64_t step() const { return step_; }
  const config::Config& config() const { return cfg_; }
  /// Writes a checkpoint of the current state (run() calls it at save_interval and at the end).
  std::string save_checkpoint();
  /// Gradient reduction statistics (nullptr in single-process runs).
  const distributed::GradReducerStats* reducer_stats() const {
    return reducer_ ? &reducer_->stats() : sharded_reducer_ ? &sharded_reducer_->stats() : nullptr;
  }
  /// Tensor bytes of training state this rank holds (what dist.shard partitions), measured from the tensors.
  struct RankStateBytes {
    int64_t optimizer = 0;  ///< AdamW moments
    int64_t ema = 0;        ///< EMA averages
    int64_t grads = 0;      ///< gradients after the last step's reduction, before the update
  };
  RankStateBytes rank_state_bytes() const;

 private:
  void build_model();
  /// The freeze preset, trainable regexes and attention setting, checked from shapes before anything is built.
  void check_model_settings() const;
  /// What a checkpoint holds of this trainer, by reference.
  TrainState state();
  /// The next train.grad_accum_steps batches of this rank.
  std::vector<model::Batch> next_micro_batches();
  /// Rank 0: stale temporary checkpoints removed, config.yaml and metrics.jsonl opened, the plan logged. Every
  /// rank: the log interval starts.
  void open_run_dir();
  /// Adds a completed (not skipped) step to the log interval; at log_interval and at the last step logs the
  /// interval's means and writes them to metrics.jsonl.
  void log_step(const StepResult& result, double lr);
  /// Drops every trainable gradient (and, sharded, the owned accumulators).
  void zero_grads();
  int64_t local_batch() const;
  void check_and_sync_replicas();

  config::Config cfg_;
  RunOptions options_;
  torch::Device device_{torch::kCPU};
  model::Pi0 model_{nullptr};
  std::vector<bool> trainable_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<Ema> ema_;
  std::shared_ptr<distributed::ProcessGroup> pg_;      ///< null in single-process runs
  std::unique_ptr<distributed::GradReducer> reducer_;  ///< several ranks, dist.shard none or optimizer
  /// This rank's share of the parameters when sharded: the optimizer and EMA hold only it.
  std::unique_ptr<distributed::ParameterShards> shards_;
  std::unique_ptr<distributed::ShardedGradReducer> sharded_reducer_;  ///< dist.shard=gradients
  NamedTensors trainable_params_;  ///< every trainable parameter, whatever this rank's share
  int64_t last_grad_bytes_ = 0;
  DataPipeline data_;
  /// Noise and flow-matching time; CPU, saved with checkpoints. Seeded alike on every rank: each rank draws the
  /// values of the whole global batch and keeps its slice, so results do not depend on the world size.
  at::Generator rng_;
  int64_t step_ = 0;
  int64_t nonfinite_skips_ = 0;
  Checkpointer checkpointer_;
  std::optional<std::string> resume_dir_;  ///< checkpoint restored by run()
  /// The log interval under way: its start (wall and training-thread CPU time), summed loss, completed steps and
  /// the reducer's statistics at its start.
  struct Progress {
    int64_t first_step = 0;  ///< the step run() started from
    std::chrono::steady_clock::time_point interval_start;
    double interval_cpu_start = 0;
    double interval_loss = 0;
    int64_t interval_steps = 0;
    distributed::GradReducerStats interval_comm_start;
  };
  Progress progress_;
  std::optional<MetricsWriter> metrics_;  ///< rank 0: run_dir/metrics.jsonl
};

}  // namespace pi0::train
