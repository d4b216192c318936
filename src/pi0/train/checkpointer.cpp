// The Checkpointer (checkpointer.h): save, resume decision, restore.
//
// A checkpoint's files, by group (names: io/checkpoint_files.h; format: docs/formats.md). save() writes the groups
// in this order, one helper each; restore() reads the groups a resume needs in the same order, with the mirror
// helper, while the manifest's checksums are verified on other threads.
//
//   group            files                                            save                    restore
//   model            model.safetensors, base_weights.json (small)     save_model              load_model
//   optimizer        optimizer.safetensors | optimizer.rank<r>-of-<n>  save_optimizer          load_optimizer
//   EMA (optional)   ema.safetensors | ema.rank<r>-of-<n>              save_ema                load_ema
//   LoRA (optional)  lora.safetensors (for pi0-export)                save_lora               -
//   progress         rng.safetensors, trainer_state.json              save_progress           load_progress
//   config, assets   config.yaml, tokenizer.model, assets/<id>/...    save_config_and_assets  -
//   manifest         manifest.json, written last                      io::write_manifest      io::verify_contents
//
// Then io::commit_checkpoint writes COMPLETE and renames the directory into place. Under dist.shard every rank
// writes its own optimizer and EMA pieces (gather_sharded_digests); rank 0 writes everything else.

#include "pi0/train/checkpointer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>

#include <spdlog/spdlog.h>

#include "pi0/common/check.h"
#include "pi0/common/files.h"
#include "pi0/common/fs.h"
#include "pi0/io/checkpoint_dir.h"
#include "pi0/io/manifest.h"
#include "pi0/io/safetensors.h"
#include "pi0/io/sharded_state.h"
#include "pi0/train/offload.h"
#include "pi0/train/trainer_state.h"

namespace pi0::train {

namespace fs = pi0::posix_fs;

namespace {

using Clock = std::chrono::steady_clock;

/// A checkpoint whose contents do not verify (checksums, non-finite values, dtypes): resume falls back past it.
class UnusableCheckpoint : public UserError {
 public:
  using UserError::UserError;
};

std::vector<std::pair<std::string, torch::Tensor>> to_vector(const std::map<std::string, torch::Tensor>& m) {
  return {m.begin(), m.end()};
}

int64_t step_of(const std::string& checkpoint_dir) { return std::stoll(fs::path(checkpoint_dir).filename().string()); }

template <typename Map>
void merge_into(Map& into, Map from) {
  into.insert(std::make_move_iterator(from.begin()), std::make_move_iterator(from.end()));
}

// The optimizer's moments, the EMA's averages: one entry per trainable parameter and suffix.
const std::vector<std::string> kOptimizerSuffixes = {".exp_avg", ".exp_avg_sq"};
const std::vector<std::string> kEmaSuffixes = {""};

void write_file_atomic(const fs::path& path, const std::string& text) { pi0::write_file_atomic(path.string(), text); }

// `dir` is a writable directory, or can be created (its nearest existing ancestor is a writable directory);
// UserError naming `key` otherwise. Checked before the model is built, so a bad run_dir costs no start-up time,
// and without creating anything, so a run that fails its checks leaves nothing behind.
void check_writable_dir(const std::string& dir, const std::string& key) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec)) throw UserError(key + " '" + dir + "' is a file; expected a directory");
    if (::access(dir.c_str(), W_OK | X_OK) != 0)
      throw UserError(key + " '" + dir + "' is not writable (" + std::strerror(errno) + ")");
    return;
  }
  fs::path ancestor = fs::absolute(dir, ec).parent_path();
  while (!ancestor.empty() && !fs::exists(ancestor, ec) && ancestor != ancestor.root_path())
    ancestor = ancestor.parent_path();
  if (!fs::is_directory(ancestor, ec)) {
    throw UserError(key + " '" + dir + "' cannot be created: '" + ancestor.string() + "' is a file, not a directory");
  }
  if (::access(ancestor.c_str(), W_OK | X_OK) != 0) {
    throw UserError(key + " '" + dir + "' cannot be created: '" + ancestor.string() + "' is not writable (" +
                    std::strerror(errno) + ")");
  }
}

// XXH3 digests travel between ranks as int64 tensors: parse and print the manifest's 16-hex-digit form.
int64_t digest_bits(const std::string& hex) { return static_cast<int64_t>(std::stoull(hex, nullptr, 16)); }
std::string digest_hex(int64_t bits) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(static_cast<uint64_t>(bits)));
  return buf;
}

// The files a resume reads from checkpoint `dir` (paths): the optimizer state (one file, or every rank's; the
// single file's name when there is none), the model, trainer_state.json and the RNG states. EMA, LoRA, config and
// assets are optional or only copied.
std::vector<std::string> required_files(const fs::path& dir) {
  auto files = io::state_files(dir.string(), io::kOptimizerState);
  if (files.empty()) files.push_back((dir / io::state_file_name(io::kOptimizerState, 0, 1)).string());
  for (const char* f : {io::kModelFile, io::kTrainerStateFile, io::kRngFile}) files.push_back((dir / f).string());
  return files;
}

}  // namespace

Checkpointer::Checkpointer(config::Config cfg, int64_t rank, int64_t world_size,
                           std::shared_ptr<distributed::ProcessGroup> pg)
    : cfg_(std::move(cfg)), rank_(rank), world_size_(world_size), pg_(std::move(pg)) {}

void Checkpointer::set_base(io::BaseWeightsRef ref, std::set<std::string> names) {
  base_ref_ = std::move(ref);
  base_names_ = std::move(names);
}

// ---- Resume: which checkpoint ----

void Checkpointer::check_run_dir(bool resume) {
  const auto& ck = cfg_.checkpoint;
  check_writable_dir(ck.run_dir, "checkpoint.run_dir");
  if (resume) return;  // choose_resume() checks the checkpoint, once the data says how long an epoch is
  if (auto steps = io::complete_checkpoints(ck.run_dir); !steps.empty()) {
    throw UserError("checkpoint.run_dir '" + ck.run_dir + "' already holds checkpoints (newest: step " +
                    std::to_string(steps.back()) + "); pass --resume to continue it, or choose another run_dir");
  }
  check_init_weights();
}

void Checkpointer::check_init_weights() const {
  const auto& ck = cfg_.checkpoint;
  if (!ck.init_weights.empty())
    require_input_file(ck.init_weights, "checkpoint.init_weights", "an openpi/LeRobot model.safetensors");
}

RunGeometry Checkpointer::geometry() const {
  PI0_CHECK(batches_per_epoch_ > 0, "Checkpointer: choose_resume() must come before a resume");
  return {world_size_, batches_per_epoch_, cfg_.train.batch_size, cfg_.train.grad_accum_steps};
}

std::optional<std::string> Checkpointer::choose_resume(int64_t batches_per_epoch) {
  const auto& ck = cfg_.checkpoint;
  batches_per_epoch_ = batches_per_epoch;
  const auto dir = pick(std::nullopt);
  if (!dir) {
    if (rank_ == 0) spdlog::warn("--resume: no complete checkpoint in {}; starting from step 0", ck.run_dir);
    check_init_weights();  // a fresh start after all
    return dir;
  }
  check_validation_set(*dir);
  // What the checkpoint needs from this machine, checked now rather than after the model is built: readable files
  // and the base weights it builds on (wherever they are now).
  for (const auto& path : required_files(*dir))
    if (!std::ifstream(path)) throw UserError(path + ": cannot be read (" + std::strerror(errno) + ")");
  if (auto ref = io::read_base_ref(*dir)) {
    const auto base = ck.init_weights.empty() ? ref->path : ck.init_weights;
    if (!fs::exists(base)) {
      throw UserError((fs::path(*dir) / io::kBaseRefFile).string() + ": the base weights '" + base +
                      "' this checkpoint builds on do not exist; if they moved, point at the new location with " +
                      "--set checkpoint.init_weights=NEW_PATH");
    }
  }
  return dir;
}

void Checkpointer::check_validation_set(const std::string& dir) const {
  const auto recorded = read_trainer_state(dir).validation_set;
  if (!validation_set_ || !recorded) return;  // a checkpoint from before the set was recorded: nothing to compare
  const auto change = validation_set_change(*recorded, *validation_set_, dir);
  if (change.empty()) return;
  if (!accept_new_validation_set_) {
    throw UserError("--resume: " + change + ": episodes trained on would be validated on (or the other way round) "
                    "and checkpoint.keep_best would rank val_loss of other samples; resume with the checkpoint's "
                    "settings, or pass --new-validation-set to start a new held-out set");
  }
  if (rank_ == 0) {
    spdlog::warn("--new-validation-set: {}; val_loss up to step {} is not comparable with later values, and "
                 "checkpoint.keep_best ranks only checkpoints of the new set",
                 change, step_of(dir));
  }
}

void Checkpointer::verify(const std::string& dir, int64_t step) const {
  const fs::path d(dir);
  for (const auto& path : required_files(d))
    if (!fs::exists(path)) throw UserError(path + ": missing from the checkpoint");
  // The step is recorded four ways (directory name, trainer_state.json, manifest.json, each safetensors file's
  // metadata): all must agree, so a file copied in from another checkpoint is caught without reading its data.
  const auto state_path = (d / io::kTrainerStateFile).string();
  const int64_t state_step = read_trainer_state(dir).step;  // every field checked, errors name the file and field
  if (state_step != step) {
    throw UserError(state_path + ": says step " + std::to_string(state_step) + ", but the checkpoint directory is " +
                    "step " + std::to_string(step));
  }
  const auto manifest = io::read_manifest(dir);
  if (!manifest) {
    const std::string why = (d / io::kManifestFile).string() + ": missing (a checkpoint from before manifests), so "
                            "its contents cannot be verified";
    if (cfg_.checkpoint.resume_policy == "strict") {
      throw UserError(why + "; checkpoint.resume_policy=strict refuses it (set checkpoint.resume_policy="
                      "newest_verified to accept it unverified)");
    }
    if (rank_ == 0) spdlog::warn("{}; using it unverified", why);
    return;
  }
  if (manifest->step != step) {
    throw UserError((d / io::kManifestFile).string() + ": is for step " +
                    (manifest->step ? std::to_string(*manifest->step) : std::string("<none>")) +
                    ", but the checkpoint directory is step " + std::to_string(step));
  }
  io::check_manifest(dir, *manifest);
}

std::optional<std::string> Checkpointer::pick(std::optional<int64_t> below) {
  const auto& ck = cfg_.checkpoint;
  const auto steps = io::complete_checkpoints(ck.run_dir);
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if ((below && *it >= *below) || bad_steps_.count(*it)) continue;
    const auto dir = io::checkpoint_path(ck.run_dir, *it);
    try {
      verify(dir, *it);
      resume_position(read_trainer_state(dir), dir, geometry(), rank_);  // one this run cannot continue is passed over too
      return dir;
    } catch (const UserError& e) {
      reject(dir, e.what());
    }
  }
  if (steps.empty()) return std::nullopt;
  throw UserError("checkpoint.run_dir '" + ck.run_dir + "': none of its " + std::to_string(steps.size()) +
                  " complete checkpoints verifies (newest: " + newest_rejection_.value_or("?") +
                  "; any others are named in warnings above); restore one from a backup, or start a new run in "
                  "another run_dir");
}

void Checkpointer::reject(const std::string& dir, const std::string& why) {
  if (cfg_.checkpoint.resume_policy == "strict") {
    throw UserError("--resume: checkpoint " + dir + " does not verify: " + why +
                    " (checkpoint.resume_policy=strict: not falling back to an older checkpoint)");
  }
  // Rejections come newest first (pick's order, and a restore of the newest pick): the first one says why the
  // newest checkpoint cannot be used, which the error when none verifies repeats.
  if (!newest_rejection_) newest_rejection_ = why;
  bad_steps_.insert(step_of(dir));
  if (rank_ == 0) {
    spdlog::warn("--resume: checkpoint {} does not verify and is skipped (left untouched): {}", dir, why);
  }
}

void Checkpointer::resume(std::optional<std::string> dir, const CheckpointedState& state) {
  const auto& ck = cfg_.checkpoint;
  create_directories_or_throw(ck.run_dir, "checkpoint.run_dir");
  if (!dir) {
    if (auto steps = io::complete_checkpoints(ck.run_dir); !steps.empty()) {
      throw UserError("checkpoint.run_dir '" + ck.run_dir + "' already holds checkpoints (newest: step " +
                      std::to_string(steps.back()) + "); pass --resume to continue it, or choose another run_dir");
    }
    return;
  }
  // A checkpoint that turns out unusable at load falls back to the next older one that passes the same checks as
  // choose_resume's pick (newest_verified policy; strict throws in reject()).
  while (true) {
    try {
      restore(*dir, state);
      break;
    } catch (const UnusableCheckpoint& e) {
      reject(*dir, e.what());
      dir = pick(step_of(*dir));
      if (!dir) throw UserError("--resume: no complete checkpoint left in " + ck.run_dir + " to fall back to");
      if (rank_ == 0) spdlog::warn("--resume: falling back to {}", *dir);
    }
  }
  verified_steps_.insert(*state.step);
}

void Checkpointer::open_run_dir() const {
  const auto& ck = cfg_.checkpoint;
  // A process killed while rotation deleted a checkpoint left it renamed to .deleting_<step>: finish the job.
  if (const auto finished = io::finish_interrupted_deletions(ck.run_dir); !finished.empty()) {
    std::string names;
    for (const auto& n : finished) names += (names.empty() ? "" : ", ") + n;
    spdlog::info("removed {} checkpoint(s) whose deletion an earlier run did not finish: {}", finished.size(), names);
  }
  io::remove_stale_temp_checkpoints(ck.run_dir);
  write_file_atomic(fs::path(ck.run_dir) / io::kConfigYamlFile, YAML::Dump(config::to_yaml(cfg_)) + "\n");
}

// ---- Save: the mirror of restore, group by group ----

std::string Checkpointer::save(const CheckpointedState& s) {
  const int64_t step = *s.step;
  const auto& ck = cfg_.checkpoint;
  const bool rank0 = rank_ == 0;
  const auto progress = gather_progress(s);  // collective
  const std::string written_barrier = "checkpoint of step " + std::to_string(step) + " written by rank 0";
  if (!rank0 && !s.shards) {
    pg_->barrier(written_barrier);
    return "";
  }
  fs::path tmp = rank0 ? begin_save(step) : fs::path();
  const auto t0 = Clock::now();
  Digests digests;  // computed while writing: the manifest costs no extra read
  if (s.shards) {
    // Sharded state: every rank writes its own pieces into rank 0's temporary directory (a shared file system,
    // as --resume already needs); a gather to rank 0 would need the whole state there, the memory sharding saves.
    tmp = pg_->broadcast_text(tmp.string(), 0, "checkpoint: temporary directory");
    digests = gather_sharded_digests(tmp, s);  // collective; throws on every rank if one failed
    if (!rank0) {
      pg_->barrier(written_barrier);
      return "";
    }
  }
  std::string final_dir;
  try {
    merge_into(digests, save_model(tmp, s));
    if (!s.shards) {
      merge_into(digests, save_optimizer(tmp, s));
      merge_into(digests, save_ema(tmp, s));
    }
    merge_into(digests, save_lora(tmp, s));
    merge_into(digests, save_progress(tmp, s, progress));
    save_config_and_assets(tmp);
    io::write_manifest(tmp.string(), step, digests);  // last: it lists every other file
    final_dir = io::commit_checkpoint(tmp.string(), ck.run_dir, step);
  } catch (...) {
    // A failed save (disk full, I/O error) leaves nothing behind; the previous checkpoints are untouched.
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  verified_steps_.insert(step);
  io::prune_checkpoints(ck.run_dir, ck.keep_last, ck.keep_period, bad_steps_, verified_steps_, best_steps());
  uint64_t bytes = 0;
  for (const auto& e : fs::recursive_directory_iterator(final_dir))
    if (e.is_regular_file()) bytes += e.file_size();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  spdlog::info("saved checkpoint {} ({:.2f} GB{} in {:.1f} s, {:.2f} GB/s)", final_dir, bytes / 1e9,
               base_ref_ ? ", frozen base by reference" : "", secs, bytes / 1e9 / std::max(secs, 1e-9));
  if (pg_) pg_->barrier(written_barrier);
  return final_dir;
}

Checkpointer::RankProgress Checkpointer::gather_progress(const CheckpointedState& s) const {
  torch::Tensor rng_state;
  {
    std::lock_guard<std::mutex> lock(s.rng->mutex());
    rng_state = s.rng->get_state();
  }
  const auto pos = s.loader->position();
  std::vector<torch::Tensor> rng_states{rng_state};
  std::vector<torch::Tensor> positions{torch::tensor({pos.epoch, pos.batch_index}, torch::kInt64)};
  if (pg_) {
    rng_states = pg_->all_gather(rng_state, "checkpoint: gather of the RNG states");
    positions = pg_->all_gather(positions[0], "checkpoint: gather of the loader positions");
  }
  RankProgress p;
  p.rng_states = std::move(rng_states);
  for (const auto& t : positions) p.loaders.push_back({t[0].item<int64_t>(), t[1].item<int64_t>()});
  return p;
}

fs::path Checkpointer::begin_save(int64_t step) {
  const auto& ck = cfg_.checkpoint;
  // Never overwrite a checkpoint that failed verification, or one that resume could not read (skipped with a
  // warning, and swapping it out would leave a directory this run cannot delete): keep it, under another name.
  const bool failed = bad_steps_.count(step) && fs::exists(io::checkpoint_path(ck.run_dir, step));
  const auto unreadable = failed ? std::string() : io::unreadable_checkpoint(io::checkpoint_path(ck.run_dir, step));
  if (failed || !unreadable.empty()) {
    const auto aside = io::set_aside_checkpoint(ck.run_dir, step);
    spdlog::warn("checkpoint of step {} {} at resume; moved to {} so the new one does not replace it", step,
                 failed ? "failed verification" : "could not be read (" + unreadable + ")", aside);
    bad_steps_.erase(step);
  }
  return io::begin_checkpoint(ck.run_dir, step);
}

namespace {

using Digests = std::map<std::string, io::FileDigest>;

// Every file records the step it belongs to, so one copied in from another checkpoint is caught on resume.
std::map<std::string, std::string> step_metadata(int64_t step) { return {{"step", std::to_string(step)}}; }

}  // namespace

Checkpointer::Digests Checkpointer::save_model(const fs::path& tmp, const CheckpointedState& s) const {
  io::SaveOptions so;
  so.metadata = step_metadata(*s.step);
  so.openpi_layout = false;  // exact parameter names, LoRA included: what resume needs
  so.include_lora = true;
  if (base_ref_) {
    // Small checkpoint: the frozen weights taken unchanged from the base are referenced, not copied.
    std::set<std::string> trainable_names;
    for (const auto& [name, p] : (*s.trainable)) trainable_names.insert(name);
    so.include = [this, trainable_names](const std::string& name) {
      return trainable_names.count(name) || !base_names_.count(name);
    };
    io::write_base_ref(tmp.string(), *base_ref_);
  }
  uint64_t next_report = 2ull << 30;
  so.progress = [&](uint64_t done, uint64_t total) {
    if (done >= next_report && done < total) {
      spdlog::info("saving model.safetensors: {:.1f}/{:.1f} GB", done / 1e9, total / 1e9);
      while (next_report <= done) next_report += 2ull << 30;
    }
  };
  OptimizerOffload::MasterWeightsScope masters(s.offload);
  return {{io::kModelFile, io::save_model_weights(*s.model, (tmp / io::kModelFile).string(), so)}};
}

namespace {

// The optimizer or EMA state `state` (entries <parameter><suffix>, plus `whole` tensors) as this rank writes it:
// one whole file, or under dist.shard this rank's pieces of every parameter it owns.
Digests save_trainable_state(const fs::path& tmp, const CheckpointedState& s,
                                                  const std::string& prefix,
                                                  const std::map<std::string, torch::Tensor>& state,
                                                  const std::vector<std::string>& suffixes,
                                                  const std::vector<std::string>& whole, int64_t rank, int64_t world) {
  const auto meta = step_metadata(*s.step);
  if (!s.shards) {
    const auto name = io::state_file_name(prefix, 0, 1);
    return {{name, io::save_safetensors((tmp / name).string(), to_vector(state), meta)}};
  }
  std::vector<io::StatePiece> pieces;
  for (const auto& piece : s.shards->owned()) {
    const auto& [name, p] = (*s.trainable)[piece.param];
    for (const auto& suffix : suffixes) pieces.push_back({name + suffix, piece.begin, p.numel(), state.at(name + suffix)});
  }
  std::vector<std::pair<std::string, torch::Tensor>> whole_tensors;
  for (const auto& key : whole) whole_tensors.emplace_back(key, state.at(key));
  const auto name = io::state_file_name(prefix, rank, world);
  return {{name, io::save_state_pieces((tmp / name).string(), pieces, whole_tensors, meta)}};
}

}  // namespace

Checkpointer::Digests Checkpointer::save_optimizer(const fs::path& tmp, const CheckpointedState& s) const {
  return save_trainable_state(tmp, s, io::kOptimizerState, s.optimizer->state_dict(), kOptimizerSuffixes,
                              {AdamW::kStepKey}, rank_, world_size_);
}

Checkpointer::Digests Checkpointer::save_ema(const fs::path& tmp, const CheckpointedState& s) const {
  if (!s.ema) return {};
  return save_trainable_state(tmp, s, io::kEmaState, s.ema->state_dict(), kEmaSuffixes, {}, rank_, world_size_);
}

Checkpointer::Digests Checkpointer::gather_sharded_digests(const fs::path& tmp, const CheckpointedState& s) const {
  const int64_t step = *s.step;
  // [ok, optimizer size, optimizer xxh3, ema size, ema xxh3] per rank: every rank learns whether all succeeded.
  auto mine = torch::zeros({5}, torch::kInt64);
  std::string failure;
  try {
    const auto opt = save_optimizer(tmp, s).at(io::state_file_name(io::kOptimizerState, rank_, world_size_));
    mine[1] = static_cast<int64_t>(opt.size);
    mine[2] = digest_bits(opt.xxh3);
    if (s.ema) {
      const auto ema = save_ema(tmp, s).at(io::state_file_name(io::kEmaState, rank_, world_size_));
      mine[3] = static_cast<int64_t>(ema.size);
      mine[4] = digest_bits(ema.xxh3);
    }
    mine[0] = 1;
  } catch (const std::exception& e) {
    failure = e.what();
    spdlog::error("checkpoint of step {}: rank {} could not write its state: {}", step, rank_, failure);
  }
  const auto all = pg_->all_gather(mine, "checkpoint: gather of the state files' checksums");
  Digests digests;
  for (int64_t r = 0; r < world_size_; ++r) {
    const auto& v = all[static_cast<size_t>(r)];
    if (v[0].item<int64_t>() != 1) {
      if (rank_ == 0) {
        std::error_code ec;
        fs::remove_all(tmp, ec);
      }
      throw UserError(r == rank_ ? failure
                                 : "checkpoint of step " + std::to_string(step) + ": rank " + std::to_string(r) +
                                       " could not write its state (its log says why); nothing was saved");
    }
    digests[io::state_file_name(io::kOptimizerState, r, world_size_)] = {static_cast<uint64_t>(v[1].item<int64_t>()),
                                                                        digest_hex(v[2].item<int64_t>())};
    if (s.ema) {
      digests[io::state_file_name(io::kEmaState, r, world_size_)] = {static_cast<uint64_t>(v[3].item<int64_t>()),
                                                                    digest_hex(v[4].item<int64_t>())};
    }
  }
  return digests;
}

Checkpointer::Digests Checkpointer::save_lora(const fs::path& tmp, const CheckpointedState& s) const {
  std::vector<std::pair<std::string, torch::Tensor>> lora;
  OptimizerOffload::MasterWeightsScope masters(s.offload);
  for (const auto& item : s.model->named_parameters())
    if (item.key().find(".lora_") != std::string::npos) lora.emplace_back(item.key(), item.value());
  if (lora.empty()) return {};
  return {{io::kLoraFile, io::save_safetensors((tmp / io::kLoraFile).string(), lora, step_metadata(*s.step))}};
}

Checkpointer::Digests Checkpointer::save_progress(const fs::path& tmp, const CheckpointedState& s,
                                                  const RankProgress& p) const {
  TrainerStateFile state;
  state.step = *s.step;
  state.world_size = world_size_;
  state.nonfinite_skips = *s.nonfinite_skips;
  state.val_loss = s.val_loss;
  state.rank_loaders = p.loaders;
  state.global_batch_size = cfg_.train.batch_size;
  state.grad_accum_steps = cfg_.train.grad_accum_steps;
  state.validation_set = validation_set_;
  std::vector<std::pair<std::string, torch::Tensor>> rngs;
  for (size_t r = 0; r < p.rng_states.size(); ++r) rngs.emplace_back("rank" + std::to_string(r) + ".noise_time", p.rng_states[r]);
  Digests digests = {{io::kRngFile, io::save_safetensors((tmp / io::kRngFile).string(), rngs, step_metadata(state.step))}};
  write_file_atomic(tmp / io::kTrainerStateFile, to_json(state).dump(2) + "\n");
  return digests;
}

void Checkpointer::verify_trainer_state(const std::string& dir, int64_t step) const {
  verify(dir, step);
  const auto manifest = io::read_manifest(dir);
  if (!manifest) return;  // verify() has said so (or refused it)
  const auto file = (fs::path(dir) / io::kTrainerStateFile).string();
  const auto listed = manifest->files.find(io::kTrainerStateFile);
  if (listed == manifest->files.end())
    throw UserError((fs::path(dir) / io::kManifestFile).string() + ": does not list " + io::kTrainerStateFile);
  const auto digest = io::digest_file(file);
  if (digest.xxh3 != listed->second.xxh3) {
    throw UserError(file + ": checksum " + digest.xxh3 + " but manifest.json lists " + listed->second.xxh3 +
                    " (the file changed after it was saved)");
  }
}

std::vector<RankedCheckpoint> Checkpointer::rank_by_val_loss() {
  std::vector<RankedCheckpoint> ranked;
  for (const int64_t step : io::complete_checkpoints(cfg_.checkpoint.run_dir)) {
    if (bad_steps_.count(step)) continue;
    const auto dir = io::checkpoint_path(cfg_.checkpoint.run_dir, step);
    try {
      // The ranking decides what rotation deletes: a val_loss edited after the save (or a damaged checkpoint) must
      // never keep its checkpoint at the cost of one that verifies. Those this process wrote or resumed from are
      // known good.
      if (!verified_steps_.count(step)) verify_trainer_state(dir, step);
      const auto state = read_trainer_state(dir);
      // Another held-out set (accepted with --new-validation-set): its values do not compare with this set's.
      const bool same_set = !validation_set_ || !state.validation_set ||
                            state.validation_set->digest == validation_set_->digest;
      if (same_set && state.val_loss && std::isfinite(*state.val_loss)) ranked.push_back({step, *state.val_loss});
    } catch (const UserError& e) {
      bad_steps_.insert(step);
      spdlog::warn("checkpoint.keep_best: checkpoint {} does not verify, so its val_loss is not ranked and it is left "
                   "untouched: {}",
                   dir, e.what());
    }
  }
  // Ties keep the older checkpoint (steps ascend, and the sort is stable).
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const RankedCheckpoint& a, const RankedCheckpoint& b) { return a.val_loss < b.val_loss; });
  return ranked;
}

std::set<int64_t> Checkpointer::best_steps() {
  const int64_t k = cfg_.checkpoint.keep_best;
  if (k <= 0) return {};
  const auto ranked = rank_by_val_loss();
  std::set<int64_t> best;
  for (size_t i = 0; i < ranked.size() && static_cast<int64_t>(i) < k; ++i) best.insert(ranked[i].step);
  return best;
}

void Checkpointer::save_config_and_assets(const fs::path& tmp) const {
  write_file_atomic(tmp / io::kConfigYamlFile, YAML::Dump(config::to_yaml(cfg_)) + "\n");
  // Every dataset's norm stats under its asset id (one for a single dataset: checkpoint.asset_id).
  for (const auto& entry : config::dataset_entries(cfg_)) {
    const auto assets = tmp / io::kAssetsDir / entry.asset_id;
    create_directories_or_throw(assets.string(), "checkpoint assets");
    fs::copy_file(entry.norm_stats, assets / io::kNormStatsFile, fs::copy_options::overwrite_existing);
  }
  fs::copy_file(cfg_.data.tokenizer, tmp / io::kTokenizerFile, fs::copy_options::overwrite_existing);
  // pi0-FAST samples through its FAST tokenizer: the checkpoint carries it, as it carries the SentencePiece model,
  // so pi0-export needs nothing outside it.
  if (cfg_.model.type == "pi0_fast")
    io::copy_fast_tokenizer(cfg_.model.fast_tokenizer, (tmp / io::kFastTokenizerDir).string(), "model.fast_tokenizer");
}

// ---- Restore: the mirror of save ----

void Checkpointer::restore(const std::string& dir, const CheckpointedState& s) {
  const auto t0 = Clock::now();
  // Every byte is verified (checksums, finiteness) on other threads while the files load: the verification reads
  // the same pages the load does, so on a machine with a spare core it adds little to the resume time.
  auto verification = std::async(std::launch::async, [dir] { io::verify_contents(dir, io::read_manifest(dir)); });
  auto unusable_if_unverified = [&](const std::string& load_error) {
    try {
      verification.get();
    } catch (const UserError& e) {
      // The contents are damaged: the load's own error, if any, names the tensor more precisely.
      throw UnusableCheckpoint(load_error.empty() ? e.what() : load_error);
    }
  };
  try {
    load_model(dir, s);
    load_optimizer(dir, s);
    load_ema(dir, s);
  } catch (const UserError& e) {
    unusable_if_unverified(e.what());
    // The contents verify, but this run cannot use them (another model, relabelled dtypes): fall back as well.
    throw UnusableCheckpoint(e.what());
  }
  unusable_if_unverified("");
  spdlog::info("loaded checkpoint state in {:.1f} s", std::chrono::duration<double>(Clock::now() - t0).count());
  load_progress(dir, s);
}

void Checkpointer::load_model(const std::string& dir, const CheckpointedState& s) {
  base_ref_.reset();
  base_names_.clear();
  OptimizerOffload::MasterWeightsScope masters(s.offload);  // loads into the masters; the copies follow
  const auto base = io::load_checkpoint_weights(*s.model, dir, cfg_.checkpoint.init_weights,
                                                "--set checkpoint.init_weights=NEW_PATH",
                                                cfg_.checkpoint.reinit_mismatched_projections,
                                                /*exact_dtypes=*/true);
  if (base.empty()) return;
  // Later checkpoints keep referring to the same (verified) base, at the path it was found.
  base_ref_ = *io::read_base_ref(dir);
  base_ref_->path = fs::absolute(base).lexically_normal().string();
  io::SafetensorsFile own((fs::path(dir) / io::kModelFile).string());
  for (const auto& item : s.model->named_parameters())
    if (!own.contains(item.key())) base_names_.insert(item.key());
}

// Optimizer and EMA state stream from the files straight into the existing tensors: no whole-file copy. The files
// are whole tensors or per-rank pieces of any world size; this rank reads the elements it updates (all of them, or
// its share under dist.shard), checked first against every file's header: exactly the tensors and dtypes this
// trainer writes. The mirror of save_trainable_state.
namespace {
void load_trainable_state(const std::string& dir, const CheckpointedState& s, const std::string& prefix,
                                 const std::map<std::string, torch::Tensor>& targets,
                                 const std::vector<std::string>& suffixes, std::map<std::string, int64_t> expected,
                                 std::vector<io::StateReader::Request> extra_requests = {}) {
  const auto files = io::state_files(dir, prefix);
  if (files.empty()) throw UserError((fs::path(dir) / (prefix + ".safetensors")).string() + ": missing from the checkpoint");
  io::StateReader reader(files);
  for (const auto& [name, p] : (*s.trainable))
    for (const auto& suffix : suffixes) expected[name + suffix] = p.numel();
  for (const auto& [key, n] : expected) {
    const auto it = reader.numels().find(key);
    if (it == reader.numels().end())
      throw UserError(reader.describe() + ": missing key '" + key + "' (the checkpoint was saved with other "
                      "trainable parameters; use the same freeze settings to resume)");
    if (it->second != n)
      throw UserError(reader.describe() + ": key '" + key + "' has " + std::to_string(it->second) +
                      " elements, expected " + std::to_string(n));
  }
  for (const auto& [key, n] : reader.numels())
    if (!expected.count(key))
      throw UserError(reader.describe() + ": unexpected key '" + key + "' (not a trainable parameter of this "
                      "model; use the same freeze settings to resume)");
  // Per tensor this rank updates, its first element in the parameter: 0, or where its share begins.
  std::vector<int64_t> begins;
  if (s.shards) {
    for (const auto& piece : s.shards->owned()) begins.push_back(piece.begin);
  } else {
    begins.assign(s.trainable->size(), 0);
  }
  std::vector<io::StateReader::Request> requests = std::move(extra_requests);
  size_t i = 0;
  for (const auto& [name, view] : s.optimizer->params()) {  // same order as the EMA's: both got the same list
    for (const auto& suffix : suffixes) requests.push_back({name + suffix, begins[i], targets.at(name + suffix)});
    ++i;
  }
  reader.read(requests, /*exact_dtype=*/true);
}
}  // namespace

void Checkpointer::load_optimizer(const std::string& dir, const CheckpointedState& s) const {
  auto step_count = torch::zeros({1}, torch::kInt64);
  load_trainable_state(dir, s, io::kOptimizerState, s.optimizer->state_dict(), kOptimizerSuffixes,
                       {{AdamW::kStepKey, 1}}, {{AdamW::kStepKey, 0, step_count}});
  s.optimizer->restore_step_count(step_count.item<int64_t>());
}

void Checkpointer::load_ema(const std::string& dir, const CheckpointedState& s) const {
  if (!s.ema) return;
  if (io::state_files(dir, io::kEmaState).empty()) {
    throw UserError("checkpoint '" + dir + "' has no EMA weights but train.ema_decay is " +
                    std::to_string(cfg_.train.ema_decay) + " (resume with train.ema_decay=0, or from a run with EMA)");
  }
  load_trainable_state(dir, s, io::kEmaState, s.ema->state_dict(), kEmaSuffixes, {});
}

void Checkpointer::load_progress(const std::string& dir, const CheckpointedState& s) const {
  const TrainerStateFile state = read_trainer_state(dir);
  // Checked by pick() already; here it also says where this rank's loader continues.
  const ResumePosition pos = resume_position(state, dir, geometry(), rank_);
  // At the checkpoint's world size each rank continues its own RNG; at another one (the global batch unchanged)
  // every rank takes rank 0's: all ranks draw the whole global batch's noise, so their states are equal (checked).
  const bool same_world = state.world_size == world_size_;
  {
    io::SafetensorsFile rng((fs::path(dir) / io::kRngFile).string());
    const auto mine = rng.get_copy("rank" + std::to_string(same_world ? rank_ : 0) + ".noise_time");
    for (int64_t r = 1; !same_world && r < state.world_size; ++r) {
      if (!torch::equal(rng.get_copy("rank" + std::to_string(r) + ".noise_time"), mine))
        throw UserError(rng.path() + ": the ranks' noise generators differ, so this checkpoint resumes only at its "
                        "own world size (" + std::to_string(state.world_size) + ")");
    }
    std::lock_guard<std::mutex> lock(s.rng->mutex());
    s.rng->set_state(mine);
  }
  *s.step = state.step;
  *s.nonfinite_skips = state.nonfinite_skips;
  s.loader->seek(pos.loader);
  if (rank_ == 0 && !pos.moved.empty()) spdlog::info("{}", pos.moved);
  spdlog::info("resumed from {} at step {} (loader epoch {}, batch {})", dir, *s.step, pos.loader.epoch,
               pos.loader.batch_index);
}

}  // namespace pi0::train
