// The trainer's checkpoints: what goes into run_dir/checkpoints/<step>/ and how it comes back. The Trainer hands
// a view of its state (CheckpointedState) to the Checkpointer, which saves it (every rank's RNG and loader position,
// model, AdamW, EMA, per-rank pieces under dist.shard, manifest last), decides at --resume, in one place, which
// checkpoint to resume from (the newest that verifies and that this run can continue), restores it while its
// contents are verified on other threads, and rejects (never deletes) one that does not verify or fit this run.
// Directories (temporary, COMPLETE marker, atomic rename, pruning): io/checkpoint_dir.h; file names:
// io/checkpoint_files.h. torchtitan's CheckpointManager and llm.c's save/load pair play the same part.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pi0/config/config.h"
#include "pi0/data/loader.h"
#include "pi0/distributed/parameter_shards.h"
#include "pi0/distributed/process_group.h"
#include "pi0/io/model_weights.h"
#include "pi0/model/pi0.h"
#include "pi0/train/ema.h"
#include "pi0/train/optimizer.h"
#include "pi0/train/trainer_state.h"

namespace pi0::train {

class OptimizerOffload;

/// The checkpointed state of a trainer, by reference: save() reads it, restore writes into it. Everything is
/// owned by the Trainer; the pointers may be null where noted.
struct CheckpointedState {
  model::Pi0Impl* model = nullptr;
  AdamW* optimizer = nullptr;
  Ema* ema = nullptr;  ///< null when train.ema_decay is 0
  at::Generator* rng = nullptr;  ///< the noise / flow-matching time generator
  data::DataLoader* loader = nullptr;
  /// This rank's share of the trainable parameters under dist.shard; null otherwise.
  const distributed::ParameterShards* shards = nullptr;
  const NamedTensors* trainable = nullptr;  ///< every trainable parameter, whatever this rank's share
  int64_t* step = nullptr;                  ///< optimizer steps completed
  int64_t* nonfinite_skips = nullptr;       ///< steps skipped so far (train.max_nonfinite_skips)
  /// train.offload=optimizer: the model holds device copies of what trains, the masters are here; the files are the
  /// masters (the same files as without offload).
  OptimizerOffload* offload = nullptr;
  /// The validation loss at this step, when a pass ran at it: recorded in trainer_state.json, ranked by
  /// checkpoint.keep_best.
  std::optional<double> val_loss;
};

/// A complete checkpoint as checkpoint.keep_best ranks it: its step and the val_loss its trainer_state.json records.
struct RankedCheckpoint {
  int64_t step = 0;
  double val_loss = 0.0;
};

class Checkpointer {
 public:
  /// `pg` is null in single-process runs (rank 0 of 1).
  Checkpointer(config::Config cfg, int64_t rank, int64_t world_size, std::shared_ptr<distributed::ProcessGroup> pg);

  /// Start-up checks, before anything is built: checkpoint.run_dir is (or can become) a writable directory; without
  /// `resume` it must hold no checkpoints, and init_weights must exist. Throws pi0::UserError naming the key or file.
  void check_run_dir(bool resume);

  /// --resume's decision, made here and nowhere else: the newest checkpoint that verifies (verify()) and that this
  /// run can continue (resume_position(): world size, epoch length, batch size, for a loader of
  /// `batches_per_epoch`), its files readable and the base weights it builds on present. Each one passed over is
  /// rejected with a warning naming it and why (checkpoint.resume_policy=strict: the first one throws). nullopt, with
  /// a warning, when the run dir holds no complete checkpoint; UserError when none is usable. resume() falls back
  /// with the same checks.
  std::optional<std::string> choose_resume(int64_t batches_per_epoch);

  /// Restores `dir` (from choose_resume) into `state`, falling back to the next older checkpoint that passes
  /// choose_resume's checks while the chosen one turns out unusable at load (checksums, non-finite values, dtypes,
  /// another model); with no `dir`, refuses a run dir that holds checkpoints. Creates the run dir.
  void resume(std::optional<std::string> dir, const CheckpointedState& state);

  /// Writes a checkpoint of `state` at its step (every rank calls it; rank 0 commits) and prunes old ones.
  /// Returns the checkpoint's path on rank 0, "" on the others.
  std::string save(const CheckpointedState& state);

  /// The cheap checks of a complete checkpoint (no tensor data read): its files are present, trainer_state.json,
  /// manifest.json and every safetensors header agree on the directory's step, and the sizes match the manifest.
  /// Throws pi0::UserError saying what is wrong.
  void verify(const std::string& dir, int64_t step) const;

  /// The config written to the run dir and into every checkpoint: the run's, with the settings its data resolved
  /// at open. Called before choose_resume().
  void set_config(config::Config cfg) { cfg_ = std::move(cfg); }
  /// The held-out validation set of this run: recorded in every checkpoint; at --resume a checkpoint written with
  /// another set is refused (choose_resume) unless `accept_change` (pi0-train --new-validation-set), and
  /// checkpoint.keep_best ranks only checkpoints of this set. Called before choose_resume().
  void set_validation_set(ValidationSetId id, bool accept_change) {
    validation_set_ = std::move(id);
    accept_new_validation_set_ = accept_change;
  }
  /// checkpoint.keep_best's ranking of the run dir's complete checkpoints, lowest val_loss first (ties: the older
  /// first): those that verify (verify() and trainer_state.json's checksum against the manifest) and record a finite
  /// val_loss measured on this run's validation set. One that does not verify is warned about, left untouched and
  /// from then on neither ranked nor counted by rotation. Rank 0. The "best so far" of the log and pi0-export --best
  /// are its first entry, so they name the checkpoint keep_best keeps.
  std::vector<RankedCheckpoint> rank_by_val_loss();

  /// Small checkpoints: the frozen base the run builds on (from checkpoint.init_weights) and the parameters taken
  /// unchanged from it, which save() references instead of copying.
  void set_base(io::BaseWeightsRef ref, std::set<std::string> names);
  /// Rank 0, once the run is resumed: finishes deletions a crash interrupted (.deleting_* directories), removes
  /// .tmp_* directories left by crashed writers, and writes the resolved config to run_dir/config.yaml.
  void open_run_dir() const;

 private:
  using Digests = std::map<std::string, io::FileDigest>;  ///< file name in the checkpoint → size and checksum
  /// Every rank's noise generator state and loader position, gathered to rank 0 for save().
  struct RankProgress {
    std::vector<torch::Tensor> rng_states;
    std::vector<data::LoaderPosition> loaders;
  };

  /// The newest complete checkpoint older than `below` (all when nullopt) that verifies and this run can continue;
  /// the others go through reject(). nullopt if the run dir holds no complete checkpoint at all; UserError if none
  /// of them is usable.
  std::optional<std::string> pick(std::optional<int64_t> below);
  /// Strict resume: throws. Otherwise warns, naming the checkpoint and `why`, and remembers it as bad.
  void reject(const std::string& dir, const std::string& why);
  /// checkpoint.init_weights, when set, is a readable file (a fresh start builds on it).
  void check_init_weights() const;
  /// checkpoint.keep_best: the steps of the first K checkpoints of rank_by_val_loss().
  std::set<int64_t> best_steps();
  /// verify() and trainer_state.json's checksum against the manifest (the file keep_best ranks by is small).
  void verify_trainer_state(const std::string& dir, int64_t step) const;
  /// The held-out set `dir` was written with against this run's: UserError unless the same or accepted.
  void check_validation_set(const std::string& dir) const;
  /// What this run is, for resume_position(): world size, train.batch_size, grad_accum_steps, the loader's epoch.
  RunGeometry geometry() const;

  // save() and restore() below are mirror images, one pair per group of files (the list: checkpointer.cpp's top).
  // Each save_* writes its files into the temporary directory and returns their digests for the manifest.
  RankProgress gather_progress(const CheckpointedState& s) const;
  std::filesystem::path begin_save(int64_t step);
  Digests save_model(const std::filesystem::path& tmp, const CheckpointedState& s) const;
  Digests save_optimizer(const std::filesystem::path& tmp, const CheckpointedState& s) const;
  Digests save_ema(const std::filesystem::path& tmp, const CheckpointedState& s) const;
  Digests gather_sharded_digests(const std::filesystem::path& tmp, const CheckpointedState& s) const;
  Digests save_lora(const std::filesystem::path& tmp, const CheckpointedState& s) const;
  Digests save_progress(const std::filesystem::path& tmp, const CheckpointedState& s, const RankProgress& p) const;
  void save_config_and_assets(const std::filesystem::path& tmp) const;

  /// Loads the checkpoint while its contents are verified on other threads; throws UnusableCheckpoint if they do
  /// not verify (checksums, non-finite values, dtypes) or do not fit this model, any other UserError for a
  /// checkpoint this run cannot use.
  void restore(const std::string& dir, const CheckpointedState& state);
  void load_model(const std::string& dir, const CheckpointedState& s);
  void load_optimizer(const std::string& dir, const CheckpointedState& s) const;
  void load_ema(const std::string& dir, const CheckpointedState& s) const;
  void load_progress(const std::string& dir, const CheckpointedState& s) const;

  config::Config cfg_;
  int64_t rank_ = 0;
  int64_t world_size_ = 1;
  std::shared_ptr<distributed::ProcessGroup> pg_;  ///< null in single-process runs
  int64_t batches_per_epoch_ = 0;                  ///< this run's loader's (choose_resume)
  /// Checkpoints found unusable at resume: never deleted or overwritten (left for inspection), not counted by
  /// checkpoint.keep_last.
  std::set<int64_t> bad_steps_;
  std::optional<std::string> newest_rejection_;  ///< why the newest rejected checkpoint failed (for the final error)
  /// Checkpoints known good: the one resumed from (verified) and those this process wrote (hashed as written).
  std::set<int64_t> verified_steps_;
  std::optional<ValidationSetId> validation_set_;  ///< null until set_validation_set(): nothing recorded or compared
  bool accept_new_validation_set_ = false;
  std::optional<io::BaseWeightsRef> base_ref_;
  std::set<std::string> base_names_;
};

}  // namespace pi0::train
