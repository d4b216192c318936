// The training log's bookkeeping, kept out of the Trainer (torchtitan's MetricsProcessor plays the same part): the
// log and metrics intervals, the means over them (over ranks too), metrics.jsonl and the progress line. The
// Trainer hands it each completed step; it decides when to log and what. Validation adds its values here.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pi0/common/threads.h"
#include "pi0/config/config.h"
#include "pi0/distributed/grad_reducer.h"
#include "pi0/distributed/process_group.h"
#include "pi0/train/metrics.h"

namespace pi0::train {

/// One dataset's share of a validation pass: its held-out samples alone, so a starved or overfitted entry of a
/// mixture shows beside the aggregate.
struct DatasetValidation {
  std::string name;         ///< the entry's asset id, e.g. "libero" (metrics: val_loss/libero)
  double loss = 0.0;        ///< as ValidationResult::loss, over this dataset's samples; NaN when it has none
  double action_mse = 0.0;  ///< as ValidationResult::action_mse, over this dataset's samples; NaN when none
  int64_t samples = 0;      ///< its held-out samples evaluated
  /// The (sample, row, dim) positions each mean is over, after the loss mask and the action mask: the pass's loss
  /// is Σ loss·loss_positions / Σ loss_positions over the datasets (a sample-weighted mean when every sample
  /// counts the same positions, as without train.loss_mask), and likewise action_mse.
  double loss_positions = 0.0, action_positions = 0.0;
};

/// One validation pass (Trainer::validate), over every rank's share.
struct ValidationResult {
  /// Flow matching: the loss with each sample's fixed noise and time (train.loss_mask applies). model.type pi0_fast:
  /// its cross-entropy (per-example mean over the postfix, mean over the samples, as training's loss).
  double loss = 0.0;
  /// Squared error of sampled actions against the recorded ones (normalized units, the robot's dims); pi0_fast: of
  /// the actions its greedy decoding yields, zeros where it yields none (as inference answers).
  double action_mse = 0.0;
  int64_t samples = 0;                      ///< held-out samples evaluated
  std::vector<DatasetValidation> datasets;  ///< one per dataset (data source), in data.datasets order
  /// train.subtask: the subtask cross-entropy of the recorded block (per-example mean over its targets, mean over
  /// the samples, as training's ce_subtask) and the share of its targets that are the argmax.
  std::optional<double> subtask_ce, subtask_acc;
  /// model.type pi0_fast: the share of samples whose greedy decoding (free-running, from the prompt alone, as
  /// pi0-infer runs it) holds no actions.
  std::optional<double> fast_undecodable;
};

class MetricsProcessor {
 public:
  /// train.log_interval, metrics_interval, num_steps and batch_size from `train`; `pg` null in single-process runs;
  /// `comm` the gradient reducer's statistics (null when there is no reducer), read at each interval's end.
  MetricsProcessor(const config::TrainConfig& train, int64_t rank, int64_t world_size,
                   std::shared_ptr<distributed::ProcessGroup> pg, const distributed::GradReducerStats* comm);

  /// The run continues after `step` (0, or the step resumed from): the intervals start now. Rank 0 appends to
  /// `metrics_path` (run_dir/metrics.jsonl), dropping the records of steps after `step` (an interrupted run's).
  void start(int64_t step, const std::string& metrics_path);
  /// train.tensorboard, rank 0: openpi's "camera_views" of the first batch (`images`: one [B,3,S,S] tensor per camera
  /// slot, as the model sees them) as images at `step` in the event file; nothing otherwise.
  void log_camera_views(int64_t step, const std::vector<torch::Tensor>& images);

  /// A completed (not skipped) optimizer step: added to the intervals. A metrics.jsonl record every
  /// train.metrics_interval steps and a progress line every train.log_interval steps (and both at the last step),
  /// each the mean over its own interval. Collective when data-parallel: every rank calls it for the same steps.
  void log(int64_t step, double loss, double grad_norm, double lr);
  /// train.offload=optimizer: the host side of the step about to be log()ged (OptimizerOffload::step_times): its
  /// means over the interval go into the record as offload_grad_s, offload_update_s and offload_wait_s, and into the
  /// progress line, so a run shows whether the host or the device bounds it.
  void add_offload_times(double host_grad_s, double host_update_s, double forward_wait_s);

  /// train.ki: the parts of the step about to be log()ged (StepResult::Ki). The record gets their interval means over
  /// the ranks: ce_fast, flow_loss, and fast_acc (FAST targets predicted by the argmax / all FAST targets); the
  /// progress line shows them too.
  void add_ki(double ce, double flow, double correct, double targets);
  /// train.subtask: the subtask cross-entropy and accuracy parts of the step about to be log()ged
  /// (StepResult::Subtask): the record gets ce_subtask and subtask_acc, interval means over the ranks.
  void add_subtask(double ce, double correct, double targets);
  /// model.type pi0_fast: the step's FAST targets predicted by the argmax and all its FAST targets (summed over the
  /// micro-batches); the record and the progress line get fast_acc over the interval and the ranks.
  void add_fast_accuracy(double correct, double targets);
  /// model.type pi0_fast and train.ki: examples whose teacher-forced FAST prediction holds no actions and examples
  /// with FAST targets (StepResult::FastDecoding); the record and the progress line get fast_undecodable, their ratio
  /// over the interval and the ranks.
  void add_fast_decoding(double undecodable, double sequences);

  /// A validation pass at `step` (values already reduced over ranks): rank 0 writes {"step", "val_loss",
  /// "val_action_mse"} to metrics.jsonl and a line to the log; later progress lines show the latest val_loss. With
  /// more than one dataset, each one's values too: "val_loss/<asset id>" and "val_action_mse/<asset id>" in the same
  /// record (left out for a dataset with no held-out samples) and one log line per dataset.
  /// train.subtask: also val_ce_subtask and val_subtask_acc; model.type pi0_fast: val_fast_undecodable.
  void log_validation(int64_t step, const ValidationResult& v, double seconds);

  /// The metrics.jsonl key of dataset `name`'s value of `metric`: "val_loss/libero". TensorBoard groups keys by the
  /// part before the '/', so the datasets' curves sit together under val_loss.
  static std::string dataset_key(const std::string& metric, const std::string& name) { return metric + "/" + name; }

  /// "1h02m" / "3m05s"; "?" for a negative or non-finite time.
  static std::string format_duration(double seconds);

 private:
  /// A log or metrics interval under way: its start (wall and training-thread CPU time), summed loss, completed
  /// steps and the reducer's statistics at its start.
  struct Interval {
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    double cpu_start = thread_cpu_seconds();
    double loss = 0;
    int64_t steps = 0;
    double offload_grad = 0, offload_update = 0, offload_wait = 0;  // summed over offload_steps
    int64_t offload_steps = 0;
    double ki_ce = 0, ki_flow = 0, ki_correct = 0, ki_targets = 0;  // summed over ki_steps
    int64_t ki_steps = 0;
    double sub_ce = 0, sub_correct = 0, sub_targets = 0;  // summed over sub_steps
    int64_t sub_steps = 0;
    double fast_correct = 0, fast_targets = 0;  // pi0_fast, summed over fast_steps
    int64_t fast_steps = 0;
    double fast_undecodable = 0, fast_sequences = 0;  // pi0_fast and train.ki, summed over fast_decoding_steps
    int64_t fast_decoding_steps = 0;
    distributed::GradReducerStats comm_start;
  };
  /// The interval's record (mean loss over ranks, speed, communication); starts the next interval. Collective.
  std::map<std::string, double> close(Interval& iv, double lr, double grad_norm);
  Interval fresh_interval() const;

  int64_t log_interval_, record_interval_, num_steps_, global_batch_;
  int64_t rank_, world_size_;
  std::shared_ptr<distributed::ProcessGroup> pg_;
  const distributed::GradReducerStats* comm_;
  Interval log_;     ///< progress lines, every train.log_interval steps
  Interval record_;  ///< metrics.jsonl records, every train.metrics_interval steps
  std::optional<MetricsWriter> writer_;  ///< rank 0: run_dir/metrics.jsonl
  bool tensorboard_;                     ///< train.tensorboard: writer_ mirrors every record to an event file
  std::optional<double> last_val_loss_;  ///< the latest validation pass's, shown in progress lines
};

}  // namespace pi0::train
