// The trainer's checkpoints: what goes into run_dir/checkpoints/<step>/ and how it comes back. The Trainer hands
// a view of its state (CheckpointedState) to the Checkpointer, which saves it (every rank's RNG and loader position,
// model, AdamW, EMA, per-rank pieces under dist.shard, manifest last), picks the newest checkpoint that verifies at
// --resume, restores it while its contents are verified on other threads, and rejects (never deletes) one that
// does not verify. Directories (temporary, COMPLETE marker, atomic rename, pruning): io/checkpoint_dir.h; file
// names: io/checkpoint_files.h. torchtitan's CheckpointManager and llm.c's save/load pair play the same part.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include <torch/torch.h>

#include "pi0/config/config.h"
#include "pi0/data/loader.h"
#include "pi0/distributed/parameter_shards.h"
#include "pi0/distributed/process_group.h"
#include "pi0/io/model_weights.h"
#include "pi0/model/pi0.h"
#include "pi0/train/ema.h"
#include "pi0/train/optimizer.h"

namespace pi0::train {

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
};

class Checkpointer {
 public:
  /// `pg` is null in single-process runs (rank 0 of 1).
  Checkpointer(config::Config cfg, int64_t rank, int64_t world_size, std::shared_ptr<distributed::ProcessGroup> pg);

  /// Start-up checks, before anything is built: checkpoint.run_dir is (or can become) a writable directory, and
  /// with `resume` the checkpoint to resume from (the newest that passes verify(); nullopt when there is none) has
  /// its files and base weights; without `resume` the run dir must hold no checkpoints, and init_weights must
  /// exist. Throws pi0::UserError naming the key or file.
  std::optional<std::string> check_run_dir(bool resume);

  /// Restores `dir` (from check_run_dir) into `state`, falling back to older checkpoints while the chosen one
  /// turns out not to verify (checkpoint.resume_policy=newest_verified); with no `dir`, refuses a run dir that
  /// holds checkpoints. Creates the run dir.
  void resume(std::optional<std::string> dir, const CheckpointedState& state);

  /// Writes a checkpoint of `state` at its step (every rank calls it; rank 0 commits) and prunes old ones.
  /// Returns the checkpoint's path on rank 0, "" on the others.
  std::string save(const CheckpointedState& state);

  /// The cheap checks of a complete checkpoint (no tensor data read): its files are present, trainer_state.json,
  /// manifest.json and every safetensors header agree on the directory's step, and the sizes match the manifest.
  /// Throws pi0::UserError saying what is wrong.
  void verify(const std::string& dir, int64_t step) const;
  /// The newest complete checkpoint older than `below` (all when nullopt) that passes verify(); the ones that fail
  /// go through reject(). nullopt if the run dir holds no complete checkpoint at all.
  std::optional<std::string> pick(std::optional<int64_t> below);
  /// Strict resume: throws. Otherwise warns, naming the checkpoint and `why`, and remembers it as bad.
  void reject(const std::string& dir, const std::string& why);

  /// The config written to the run dir and into every checkpoint: the run's, with the settings its data resolved
  /// at open. Called before resume().
  void set_config(config::Config cfg) { cfg_ = std::move(cfg); }
  /// Small checkpoints: the frozen base the run builds on (from checkpoint.init_weights) and the parameters taken
  /// unchanged from it, which save() references instead of copying.
  void set_base(io::BaseWeightsRef ref, std::set<std::string> names);
  /// Rank 0, once the run is resumed: removes .tmp_* directories left by crashed writers and writes the resolved
  /// config to run_dir/config.yaml.
  void open_run_dir() const;

 private:
  /// Loads the checkpoint while its contents are verified on other threads; throws UnusableCheckpoint if they do
  /// not verify (checksums, non-finite values, dtypes), any other UserError for a checkpoint this run cannot use.
  void restore(const std::string& dir, const CheckpointedState& state);

  config::Config cfg_;
  int64_t rank_ = 0;
  int64_t world_size_ = 1;
  std::shared_ptr<distributed::ProcessGroup> pg_;  ///< null in single-process runs
  /// Checkpoints found unusable at resume: never deleted or overwritten (left for inspection), not counted by
  /// checkpoint.keep_last.
  std::set<int64_t> bad_steps_;
  std::optional<std::string> newest_rejection_;  ///< why the newest rejected checkpoint failed (for the final error)
  /// Checkpoints known good: the one resumed from (verified) and those this process wrote (hashed as written).
  std::set<int64_t> verified_steps_;
  std::optional<io::BaseWeightsRef> base_ref_;
  std::set<std::string> base_names_;
};

}  // namespace pi0::train
