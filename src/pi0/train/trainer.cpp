#include "pi0/train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "pi0/common/check.h"
#include "pi0/common/files.h"
#include "pi0/common/interrupt.h"
#include "pi0/distributed/consistency.h"
#include "pi0/io/manifest.h"
#include "pi0/io/model_weights.h"
#include "pi0/io/safetensors.h"
#include "pi0/io/sharded_state.h"
#include "pi0/model/model_config.h"
#include "pi0/model/param_layout.h"
#include "pi0/nn/dense.h"
#include "pi0/nn/param_device.h"
#include "pi0/train/checkpoint_dir.h"
#include "pi0/train/lr_schedule.h"
#include "pi0/train/metrics.h"
#include "pi0/train/signals.h"
#include "pi0/train/trainer_state.h"

namespace pi0::train {

namespace {
// CPU time of the calling (training) thread: unlike wall time it ignores other processes on a shared machine,
// and unlike process time it leaves out the loader's worker threads. On CUDA it counts only the host side.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
}  // namespace
namespace fs = std::filesystem;

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

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", static_cast<long>(s / 3600), static_cast<long>((s % 3600) / 60));
  } else {
    std::snprintf(buf, sizeof buf, "%ldm%02lds", static_cast<long>(s / 60), static_cast<long>(s % 60));
  }
  return buf;
}

}  // namespace

ParamBreakdown planned_breakdown(const config::Config& cfg) {
  const auto layout = model::parameter_layout(model::options_from_config(cfg.model));
  const auto mask = trainable_mask(names_of(layout), cfg.train.freeze, cfg.train.trainable_include,
                                   cfg.train.trainable_exclude);
  auto b = breakdown(layout, mask, cfg.train.precision, cfg.train.ema_decay > 0);
  if (!cfg.train.weight_cast_cache) {  // casts are then made per forward and freed with the step's activations
    b.total.cast_bytes = 0;
    for (auto& s : b.components) s.cast_bytes = 0;
  }
  return b;
}

int64_t micro_batch_size(const config::TrainConfig& t, int64_t world_size) {
  const int64_t per_step = world_size * t.grad_accum_steps;
  if (per_step < 1 || t.batch_size % per_step != 0) {
    throw UserError("train.batch_size must be divisible by world size (" + std::to_string(world_size) +
                    ") × train.grad_accum_steps (" + std::to_string(t.grad_accum_steps) + ") (got " +
                    std::to_string(t.batch_size) + ")");
  }
  return t.batch_size / per_step;
}

MemoryPlan plan_memory(const config::Config& cfg, int64_t world_size) {
  MemoryPlan plan;
  plan.params = planned_breakdown(cfg);
  plan.micro_batch = micro_batch_size(cfg.train, world_size);
  // Every camera slot goes through SigLIP, present or not (a missing camera is a masked black image).
  plan.num_cameras = static_cast<int64_t>(model::kCameraNames.size());
  plan.activations = model::activation_memory(model::options_from_config(cfg.model), plan.micro_batch,
                                              plan.num_cameras, cfg.train.precision == "float32" ? 4 : 2,
                                              cfg.train.gradient_checkpointing);
  // The floor was measured with batches of one sample; larger batches add their queued and in-flight images
  // (without workers the loader builds one batch at a time on the trainer's thread).
  const int64_t local_batch = plan.micro_batch;  // what the loader builds per next()
  const int64_t image_bytes = plan.num_cameras * 3 * cfg.model.image_size * cfg.model.image_size * 4;
  const int64_t batches_held = cfg.data.num_workers == 0 ? 1 : cfg.data.prefetch + cfg.data.num_workers;
  plan.runtime_bytes = MemoryPlan::kRuntimeFloorBytes + batches_held * (local_batch - 1) * image_bytes;
  plan.allocator_slack_bytes = plan.activations.peak();
  return plan;
}

Trainer::Trainer(config::Config cfg, RunOptions options)
    : cfg_(std::move(cfg)),
      options_(options),
      pg_(options.process_group),
      rng_(at::detail::createCPUGenerator(static_cast<uint64_t>(cfg_.train.seed))) {
  if (pg_) {
    PI0_CHECK(pg_->rank() == options_.rank && pg_->world_size() == options_.world_size,
              "RunOptions rank/world_size disagree with the process group");
  } else if (options_.world_size != 1) {
    throw UserError("world size " + std::to_string(options_.world_size) + " needs a process group");
  }
  // A stop (SIGINT/SIGTERM) during start-up ends it at the next interruption point with pi0::Interrupted.
  interruption_point();
  device_ = torch::Device(cfg_.train.device);
  if (device_.is_cuda() && !torch::cuda::is_available()) {
    throw UserError("train.device is '" + cfg_.train.device + "' but no CUDA device is usable (LibTorch built " +
                    "without CUDA, or no GPU); use train.device=cpu");
  }
  // Fail fast: the run directory, the referenced files, the freeze preset and the data are checked before any
  // model is built (a full-size build costs GBs and, with random init, a minute): every config error arrives in
  // well under a second.
  resume_dir_ = check_run_dir();
  check_model_settings();
  data_ = make_data_pipeline(cfg_, local_batch(), options_.rank, options_.world_size);
  while (resume_dir_) {  // a checkpoint this run cannot continue (batch size, world size) falls back like a bad one
    try {
      check_resumable(read_trainer_state(*resume_dir_), *resume_dir_, options_.world_size,
                      data_.loader->batches_per_epoch());
      break;
    } catch (const UserError& e) {
      reject_checkpoint(*resume_dir_, e.what());
      resume_dir_ = pick_checkpoint(std::stoll(fs::path(*resume_dir_).filename().string()));
      if (options_.rank == 0) spdlog::warn("--resume: falling back to {}", *resume_dir_);
    }
  }
  interruption_point();
  // Same seed on every rank: every replica starts from identical weights.
  torch::manual_seed(static_cast<uint64_t>(cfg_.train.seed));
  build_model();
  interruption_point();
}

void Trainer::check_model_settings() const {
  // The freeze preset and regexes, from the parameter layout (shapes only, nothing allocated).
  const auto mask = trainable_mask(names_of(model::parameter_layout(model::options_from_config(cfg_.model))),
                                   cfg_.train.freeze, cfg_.train.trainable_include, cfg_.train.trainable_exclude);
  if (std::find(mask.begin(), mask.end(), true) == mask.end())
    throw UserError("train.freeze '" + cfg_.train.freeze + "' leaves nothing to train");
  model::parse_attention_impl(cfg_.model.attention, "model.attention");
}

std::optional<std::string> Trainer::check_run_dir() {
  const auto& ck = cfg_.checkpoint;
  check_writable_dir(ck.run_dir, "checkpoint.run_dir");
  std::optional<std::string> dir;
  if (options_.resume) {
    dir = pick_checkpoint(std::nullopt);
    if (!dir && options_.rank == 0)
      spdlog::warn("--resume: no complete checkpoint in {}; starting from step 0", ck.run_dir);
  } else if (auto steps = complete_checkpoints(ck.run_dir); !steps.empty()) {
    throw UserError("checkpoint.run_dir '" + ck.run_dir + "' already holds checkpoints (newest: step " +
                    std::to_string(steps.back()) + "); pass --resume to continue it, or choose another run_dir");
  }
  if (dir) {
    auto files = io::state_files(*dir, "optimizer");
    if (files.empty()) files.push_back((fs::path(*dir) / "optimizer.safetensors").string());
    for (const char* f : {"model.safetensors", kTrainerStateFile, "rng.safetensors"}) files.push_back((fs::path(*dir) / f).string());
    for (const auto& path : files) {
      if (!fs::exists(path)) throw UserError(path + ": missing from the checkpoint");
      if (!std::ifstream(path)) throw UserError(path + ": cannot be read (" + std::strerror(errno) + ")");
    }
    read_trainer_state(*dir);  // every field checked now, not after the model is built
    if (auto ref = io::read_base_ref(*dir)) {
      const auto base = ck.init_weights.empty() ? ref->path : ck.init_weights;
      if (!fs::exists(base)) {
        throw UserError((fs::path(*dir) / io::kBaseRefFile).string() + ": the base weights '" + base +
                        "' this checkpoint builds on do not exist; if they moved, point at the new location with " +
                        "--set checkpoint.init_weights=NEW_PATH");
      }
    }
  } else if (!ck.init_weights.empty()) {
    require_input_file(ck.init_weights, "checkpoint.init_weights", "an openpi/LeRobot model.safetensors");
  }
  return dir;
}

void Trainer::check_checkpoint(const std::string& dir, int64_t step) const {
  const fs::path d(dir);
  if (io::state_files(dir, "optimizer").empty())
    throw UserError((d / "optimizer.safetensors").string() + ": missing from the checkpoint");
  for (const char* f : {"model.safetensors", kTrainerStateFile, "rng.safetensors"}) {
    if (!fs::exists(d / f)) throw UserError((d / f).string() + ": missing from the checkpoint");
  }
  // The step is recorded four ways (directory name, trainer_state.json, manifest.json, each safetensors file's
  // metadata): all must agree, so a file copied in from another checkpoint is caught without reading its data.
  const auto state_path = (d / kTrainerStateFile).string();
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
    if (options_.rank == 0) spdlog::warn("{}; using it unverified", why);
    return;
  }
  if (manifest->step != step) {
    throw UserError((d / io::kManifestFile).string() + ": is for step " +
                    (manifest->step ? std::to_string(*manifest->step) : std::string("<none>")) +
                    ", but the checkpoint directory is step " + std::to_string(step));
  }
  io::check_manifest(dir, *manifest);
}

std::optional<std::string> Trainer::pick_checkpoint(std::optional<int64_t> below) {
  const auto& ck = cfg_.checkpoint;
  const auto steps = complete_checkpoints(ck.run_dir);
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if ((below && *it >= *below) || bad_steps_.count(*it)) continue;
    const auto dir = checkpoint_path(ck.run_dir, *it);
    try {
      check_checkpoint(dir, *it);
      return dir;
    } catch (const UserError& e) {
      if (!newest_rejection_) newest_rejection_ = e.what();
      reject_checkpoint(dir, e.what());
    }
  }
  if (steps.empty()) return std::nullopt;
  throw UserError("checkpoint.run_dir '" + ck.run_dir + "': none of its " + std::to_string(steps.size()) +
                  " complete checkpoints verifies (newest: " + newest_rejection_.value_or("?") +
                  "; any others are named in warnings above); restore one from a backup, or start a new run in "
                  "another run_dir");
}

void Trainer::reject_checkpoint(const std::string& dir, const std::string& why) {
  if (cfg_.checkpoint.resume_policy == "strict") {
    throw UserError("--resume: checkpoint " + dir + " does not verify: " + why +
                    " (checkpoint.resume_policy=strict: not falling back to an older checkpoint)");
  }
  bad_steps_.insert(std::stoll(fs::path(dir).filename().string()));
  if (options_.rank == 0) {
    spdlog::warn("--resume: checkpoint {} does not verify and is skipped (left untouched): {}", dir, why);
  }
}

Trainer::~Trainer() = default;

int64_t Trainer::local_batch() const { return micro_batch_size(cfg_.train, options_.world_size); }

void Trainer::build_model() {
  const auto opts = model::options_from_config(cfg_.model);
  const auto& ck = cfg_.checkpoint;
  const bool rank0 = options_.rank == 0;
  // Weights that come from a file (resume, init_weights) are not drawn first: the model is built uninitialized,
  // each parameter given its storage dtype, then filled from the file.
  const bool from_file = resume_dir_.has_value() || !ck.init_weights.empty();
  const auto t0 = Clock::now();
  if (rank0) {
    spdlog::info("building the model ({}){}", cfg_.model.type,
                 from_file ? std::string(" uninitialized: its weights come from ") +
                                 (resume_dir_ ? *resume_dir_ : ck.init_weights)
                           : std::string(" with random initialization"));
  }
  {
    // Parameters are created directly on the training device.
    nn::ParamDeviceScope on_device(device_);
    nn::SkipInitScope skip(from_file);
    model_ = model::Pi0(opts);
  }
  trainable_ = apply_freeze(*model_, cfg_.train.freeze, cfg_.train.trainable_include, cfg_.train.trainable_exclude);
  const auto& precision = cfg_.train.precision;
  {
    // Storage dtypes before anything is loaded: bf16 throughout ("bf16"), or bf16 for what is frozen
    // ("bf16-mixed": float32 master weights for what trains; frozen weights only feed bf16 matmuls). Uninitialized
    // parameters get new bf16 storage (never touched in float32); drawn ones (LoRA factors, random init) convert.
    torch::NoGradGuard no_grad;
    size_t i = 0;
    for (auto& item : model_->named_parameters()) {
      auto& p = item.value();
      const bool trainable = trainable_[i++];
      if (precision == "bf16" || (precision == "bf16-mixed" && !trainable)) {
        const bool drawn = !from_file || item.key().find(".lora_") != std::string::npos;
        p.set_data(drawn ? p.data().to(torch::kBFloat16) : torch::empty(p.sizes(), p.options().dtype(torch::kBFloat16)));
      }
    }
  }
  if (precision == "bf16") {
    model_->to(torch::kBFloat16);  // buffers
    model_->set_compute_dtype(torch::kBFloat16);
  } else if (precision == "bf16-mixed") {
    model_->set_compute_dtype(torch::kBFloat16);
  }
  if (!resume_dir_ && !ck.init_weights.empty()) {
    io::LoadOptions lo;
    lo.reinit_mismatched_projections = ck.reinit_mismatched_projections;
    const auto report = io::load_model_weights(*model_, ck.init_weights, lo);
    std::set<std::string> reinit_modules;
    for (const auto& name : report.reinitialized) reinit_modules.insert(name.substr(0, name.find('.')));
    for (const auto& m : reinit_modules) {
      if (m == "action_in_proj") model_->action_in_proj->initialize();
      else if (m == "action_out_proj") model_->action_out_proj->initialize();
      else if (m == "state_proj" && !model_->state_proj.is_empty()) model_->state_proj->initialize();
      else PI0_CHECK(false, "no re-initialization for '", m, "'");
    }
    const bool partial = std::find(trainable_.begin(), trainable_.end(), false) != trainable_.end();
    if (partial && !ck.self_contained && rank0) {
      base_ref_ = io::make_base_ref(ck.init_weights);
      if (precision != "float32") base_ref_->frozen_dtype = "BF16";
      base_names_.insert(report.loaded.begin(), report.loaded.end());
      spdlog::info("checkpoints store what trains and refer to the frozen base {} (checksum {}); "
                   "checkpoint.self_contained=true stores everything",
                   base_ref_->path, base_ref_->checksum);
    }
  } else if (!from_file && cfg_.model.vocab_size == model::kPaligemmaVocabSize && rank0) {
    spdlog::warn("checkpoint.init_weights is empty: training a full-size model from random initialization "
                 "(set it to a pi0_base / pi05_base model.safetensors to fine-tune)");
  }
  if (rank0) spdlog::info("model ready in {:.1f} s", std::chrono::duration<double>(Clock::now() - t0).count());
  model_->to(device_);
  model_->set_gradient_checkpointing(cfg_.train.gradient_checkpointing);
  model_->set_attention_impl(model::parse_attention_impl(cfg_.model.attention, "model.attention"));
  nn::set_cast_cache(*model_, cfg_.train.weight_cast_cache);
  model_->train();
  if (pg_) check_and_sync_replicas();

  NamedTensors trainable;
  size_t i = 0;
  for (auto& item : model_->named_parameters()) {
    if (trainable_[i++]) trainable.emplace_back(item.key(), item.value());
  }
  if (trainable.empty()) throw UserError("train.freeze '" + cfg_.train.freeze + "' leaves nothing to train");
  trainable_params_ = trainable;
  AdamWOptions ao;
  ao.beta1 = cfg_.train.adam_b1;
  ao.beta2 = cfg_.train.adam_b2;
  ao.eps = cfg_.train.adam_eps;
  ao.weight_decay = cfg_.train.weight_decay;
  auto shard_mode = distributed::parse_shard_mode(cfg_.dist.shard);
  if (!pg_ && shard_mode != distributed::ShardMode::kNone) {
    spdlog::info("dist.shard={}: nothing to partition in a single-process run", cfg_.dist.shard);
    shard_mode = distributed::ShardMode::kNone;
  }
  // What this rank's AdamW and EMA update: everything, or (sharded) views of the elements it owns.
  NamedTensors updated = trainable;
  if (shard_mode != distributed::ShardMode::kNone) {
    shards_ = std::make_unique<distributed::ParameterShards>(*pg_, trainable);
    updated = shards_->owned_views();
  }
  optimizer_ = std::make_unique<AdamW>(updated, ao);
  if (cfg_.train.ema_decay > 0) ema_ = std::make_unique<Ema>(updated, cfg_.train.ema_decay);
  if (pg_) {
    const int64_t bucket_bytes = cfg_.dist.bucket_size_mb << 20;
    if (shard_mode == distributed::ShardMode::kGradients) {
      sharded_reducer_ = std::make_unique<distributed::ShardedGradReducer>(*pg_, trainable, shards_->layout(),
                                                                           bucket_bytes, 2 * bucket_bytes);
      if (options_.rank == 0) spdlog::info("data parallel: {} ranks, gradients reduced to their owners (at most {} MB "
                                           "in flight), backend {}", options_.world_size, 2 * cfg_.dist.bucket_size_mb,
                                           pg_->backend_name());
    } else {
      reducer_ = std::make_unique<distributed::GradReducer>(*pg_, trainable, bucket_bytes);
      if (options_.rank == 0) spdlog::info("data parallel: {} ranks, {} gradient buckets of <= {} MB, backend {}",
                                           options_.world_size, reducer_->num_buckets(), cfg_.dist.bucket_size_mb,
                                           pg_->backend_name());
    }
    if (shards_ && options_.rank == 0) {
      spdlog::info("dist.shard={}: each rank keeps AdamW state{} for its share of the trainable elements (largest "
                   "share {:.1f} MB)", cfg_.dist.shard, ema_ ? " and EMA" : "",
                   static_cast<double>(shards_->layout().max_bytes()) / 1e6);
    }
  }

  if (options_.rank == 0) {
    const auto b = breakdown(model::parameter_layout(opts), trainable_, precision, ema_ != nullptr);
    spdlog::info("parameters (freeze preset '{}', precision {}):\n{}", cfg_.train.freeze, precision,
                 format_breakdown(b));
  }
}

// Data parallel start-up: every rank must run the same config and model, and starts from rank 0's weights (so a
// random init or init_weights read on each node cannot diverge).
void Trainer::check_and_sync_replicas() {
  auto same_everywhere = cfg_;
  same_everywhere.train.device = device_.is_cuda() ? "cuda" : device_.str();  // cuda:LOCAL_RANK differs per rank
  distributed::check_same_on_all_ranks(*pg_, YAML::Dump(config::to_yaml(same_everywhere)),
                                distributed::parameter_layout_text(model_->named_parameters()));
  std::vector<torch::Tensor> state;
  for (auto& p : model_->parameters()) state.push_back(p.data());
  for (auto& b : model_->buffers()) state.push_back(b);
  pg_->broadcast(state, 0, "broadcast of the initial weights from rank 0");
}

int64_t Trainer::run() {
  const auto& t = cfg_.train;
  const auto& ck = cfg_.checkpoint;
  const bool rank0 = options_.rank == 0;
  install_stop_signal_handlers();
  create_directories_or_throw(ck.run_dir, "checkpoint.run_dir");
  if (resume_dir_) {
    // Falls back to older checkpoints while the chosen one turns out not to verify (newest_verified policy).
    while (true) {
      try {
        restore(*resume_dir_);
        break;
      } catch (const UnusableCheckpoint& e) {
        reject_checkpoint(*resume_dir_, e.what());
        resume_dir_ = pick_checkpoint(std::stoll(fs::path(*resume_dir_).filename().string()));
        if (rank0) spdlog::warn("--resume: falling back to {}", *resume_dir_);
      }
    }
    verified_steps_.insert(step_);
    resume_dir_.reset();
  } else if (auto steps = complete_checkpoints(ck.run_dir); !steps.empty()) {
    throw UserError("checkpoint.run_dir '" + ck.run_dir + "' already holds checkpoints (newest: step " +
                    std::to_string(steps.back()) + "); pass --resume to continue it, or choose another run_dir");
  }
  interruption_point();  // nothing has been written yet: a stop requested during start-up ends here
  std::optional<MetricsWriter> metrics;
  if (rank0) {
    remove_stale_temp_checkpoints(ck.run_dir);
    write_file_atomic(fs::path(ck.run_dir) / "config.yaml", YAML::Dump(config::to_yaml(cfg_)) + "\n");
    metrics.emplace((fs::path(ck.run_dir) / "metrics.jsonl").string(), step_ + 1);
    spdlog::info("training {} steps from step {}: global batch {} = {} per rank × {} ranks × {} accumulation steps, "
                 "{} samples in the dataset, device {}",
                 t.num_steps, step_, t.batch_size, local_batch(), options_.world_size, t.grad_accum_steps,
                 data_.dataset->size(), device_.str());
  }

  auto interval_start = Clock::now();
  double interval_cpu_start = thread_cpu_seconds();
  const int64_t first_step = step_;
  double interval_loss = 0;
  int64_t interval_steps = 0;
  distributed::GradReducerStats interval_comm_start;  // reducer statistics at the start of the log interval

  while (step_ < t.num_steps) {
    const double lr = warmup_cosine_lr(step_, t.lr_warmup_steps, t.lr_peak, t.lr_decay_steps, t.lr_end);
    std::vector<model::Batch> micro_batches;
    for (int64_t micro = 0; micro < t.grad_accum_steps; ++micro) micro_batches.push_back(data_.loader->next());
    const StepResult result = train_step(micro_batches, lr);
    const double loss_value = result.loss, grad_norm = result.grad_norm;
    const bool stop = result.stop;
    if (result.skipped) {
      ++step_;
      continue;
    }
    ++step_;
    interval_loss += loss_value;
    ++interval_steps;
    if (step_ == first_step + 1) {
      // What each rank holds, measured from its tensors (what dist.shard and --print-params --world-size plan).
      const auto held = rank_state_bytes();
      std::vector<torch::Tensor> all{torch::tensor({held.optimizer, held.ema, held.grads}, torch::kInt64)};
      if (pg_) all = pg_->all_gather(all[0], "gather of the per-rank state sizes");
      for (size_t r = 0; rank0 && r < all.size(); ++r) {
        spdlog::info("rank {} of {} holds {} bytes of AdamW state, {} of EMA and {} of gradients (dist.shard={})", r,
                     options_.world_size, all[r][0].item<int64_t>(), all[r][1].item<int64_t>(),
                     all[r][2].item<int64_t>(), cfg_.dist.shard);
      }
    }

    if (step_ % t.log_interval == 0 || step_ == t.num_steps) {
      double mean_loss = interval_loss / static_cast<double>(interval_steps);
      if (pg_) {  // the logged loss is the mean over ranks
        auto l = torch::tensor({mean_loss}, torch::kFloat64);
        pg_->all_reduce_sum(l, "loss logging");
        mean_loss = l.item<double>() / static_cast<double>(options_.world_size);
      }
      const double elapsed = std::chrono::duration<double>(Clock::now() - interval_start).count();
      const double step_time = elapsed / static_cast<double>(interval_steps);
      const double step_cpu = (thread_cpu_seconds() - interval_cpu_start) / static_cast<double>(interval_steps);
      const double samples_per_s = static_cast<double>(t.batch_size) / step_time;
      const double eta = step_time * static_cast<double>(t.num_steps - step_);
      std::map<std::string, double> record = {{"loss", mean_loss},
                                              {"grad_norm", grad_norm},
                                              {"lr", lr},
                                              {"samples_per_s", samples_per_s},
                                              {"step_time_s", step_time},
                                              {"step_cpu_s", step_cpu}};
      if (const auto* stats = reducer_stats()) {
        // Per step: the gradient all-reduce span (first bucket launched → last done) and the part of it backward
        // did not hide (time in wait()).
        const auto& c = *stats;
        const double n = static_cast<double>(std::max<int64_t>(c.steps - interval_comm_start.steps, 1));
        record["comm_s"] = (c.comm_seconds - interval_comm_start.comm_seconds) / n;
        record["comm_exposed_s"] = (c.wait_seconds - interval_comm_start.wait_seconds) / n;
        interval_comm_start = c;
      }
      if (rank0) {
        // Slow runs (a full-size model on a CPU) read better in seconds per step than in "0.0 samples/s".
        char speed[48];
        if (samples_per_s < 0.1) std::snprintf(speed, sizeof speed, "%.1f s/step", step_time);
        else std::snprintf(speed, sizeof speed, "%.1f samples/s", samples_per_s);
        spdlog::info("step {}/{} | loss {:.4f} | grad_norm {:.3f} | lr {:.2e} | {} | ETA {}", step_, t.num_steps,
                     mean_loss, grad_norm, lr, speed, format_duration(eta));
        metrics->write(step_, record);
      }
      interval_start = Clock::now();
      interval_cpu_start = thread_cpu_seconds();
      interval_loss = 0;
      interval_steps = 0;
    }
    if (step_ % ck.save_interval == 0 || step_ == t.num_steps || stop) save_checkpoint();
    if (stop) {
      const std::string why = stop_signal() ? "stop signal " + std::to_string(stop_signal()) + " received"
                                            : std::string("another rank received a stop signal");
      spdlog::warn("{}: saved step {} and stopping (resume with --resume)", why, step_);
      break;
    }
  }
  if (rank0 && step_ == first_step) spdlog::info("nothing to do: already at step {}", step_);
  return step_;
}

StepResult Trainer::train_step(const std::vector<model::Batch>& micro_batches, double lr,
                               const std::optional<StepNoise>& noise_time) {
  const auto& t = cfg_.train;
  const int64_t n_micro = static_cast<int64_t>(micro_batches.size());
  PI0_CHECK(n_micro == t.grad_accum_steps, "train_step: expected ", t.grad_accum_steps, " micro-batches, got ", n_micro);
  PI0_CHECK(!noise_time || (static_cast<int64_t>(noise_time->noise.size()) == n_micro &&
                            static_cast<int64_t>(noise_time->time.size()) == n_micro),
            "train_step: one noise and one time tensor per micro-batch expected");
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  StepResult result;
  double loss_sum = 0;
  for (int64_t micro = 0; micro < n_micro; ++micro) {
    if (reducer_) reducer_->enable_sync(micro + 1 == n_micro);  // all-reduce on the last only
    const auto& batch = micro_batches[static_cast<size_t>(micro)];
    // Batches come pinned on CUDA (LoaderOptions::pin_memory): the copies overlap with queued GPU work.
    const bool async = device_.is_cuda();
    const auto obs = batch.observation.to(device_, async);
    const auto actions = batch.actions.to(device_, async);
    const int64_t b = actions.size(0);
    torch::Tensor noise, time;
    if (noise_time) {
      noise = noise_time->noise[static_cast<size_t>(micro)].to(device_, torch::kFloat32);
      time = noise_time->time[static_cast<size_t>(micro)].to(device_, torch::kFloat32);
    } else {
      // Noise and time come from the trainer's own generator so a resumed run draws the same values. Every rank
      // draws them for the global micro-batch and keeps its own slice, like its slice of the data.
      auto noise_shape = actions.sizes().vec();
      noise_shape[0] = b * options_.world_size;
      noise = torch::randn(noise_shape, rng_, f32).narrow(0, options_.rank * b, b).to(device_);
      time = (torch::rand({b * options_.world_size}, rng_, f32).narrow(0, options_.rank * b, b).pow(1.0 / 1.5) *
                  0.999 + 0.001).to(device_);
    }
    auto loss = model_->compute_loss(obs, actions, noise, time).mean();
    (loss / static_cast<double>(n_micro)).backward();
    loss_sum += loss.item<double>();
    if (sharded_reducer_) sharded_reducer_->wait();  // every micro-step: owners accumulate, the rest is freed
  }
  if (reducer_) reducer_->wait();  // gradients are now the mean over ranks, identical everywhere
  nn::clear_cast_cache(*model_);   // the step's bf16 weight copies: the optimizer is about to change the weights
  result.loss = loss_sum / static_cast<double>(n_micro);
  const double max_norm = t.clip_grad_norm > 0 ? t.clip_grad_norm : std::numeric_limits<double>::infinity();
  // The gradients this rank's optimizer applies: all of them, or the owned elements' (sharded).
  std::vector<torch::Tensor> grads;
  if (sharded_reducer_) {
    grads = sharded_reducer_->finish_step();
  } else if (shards_) {
    grads = shards_->owned_grad_views();
  } else {
    for (const auto& [name, p] : trainable_params_) grads.push_back(p.grad());
  }
  last_grad_bytes_ = 0;
  if (sharded_reducer_) {
    last_grad_bytes_ = sharded_reducer_->held_bytes();
  } else {
    for (const auto& [name, p] : trainable_params_)
      if (p.grad().defined()) last_grad_bytes_ += p.grad().numel() * static_cast<int64_t>(p.grad().element_size());
  }
  std::function<double(double)> sum_over_ranks;
  if (shards_) {
    // Each rank holds a disjoint part of the gradient: the squared norms add up across ranks.
    sum_over_ranks = [this](double local) {
      auto x = torch::tensor({local}, torch::kFloat64);
      pg_->all_reduce_sum(x, "gradient norm");
      return x.item<double>();
    };
  }
  result.grad_norm = clip_gradients(grads, max_norm, sum_over_ranks);
  // Decisions every rank must take alike: a non-finite loss on any rank, a stop signal on any rank.
  bool loss_finite = std::isfinite(result.loss);
  result.stop = stop_requested();
  if (pg_) {
    auto flags = torch::tensor({loss_finite ? 0.0 : 1.0, result.stop ? 1.0 : 0.0}, f32);
    pg_->all_reduce_sum(flags, "step flags (non-finite loss, stop signal)");
    loss_finite = flags[0].item<double>() == 0;
    result.stop = flags[1].item<double>() > 0;
  }
  if (!loss_finite || !std::isfinite(result.grad_norm)) {
    if (nonfinite_skips_ < t.max_nonfinite_skips) {
      ++nonfinite_skips_;
      spdlog::warn("step {} on rank {}: non-finite loss ({}) or gradient norm ({}); update skipped ({} of {} "
                   "allowed by train.max_nonfinite_skips)",
                   step_ + 1, options_.rank, result.loss, result.grad_norm, nonfinite_skips_, t.max_nonfinite_skips);
      zero_grads();
      result.skipped = true;
      return result;
    }
    throw TrainingError("non-finite " + std::string(loss_finite ? "gradient norm" : "loss") + " at step " +
                        std::to_string(step_ + 1) + " on rank " + std::to_string(options_.rank) + " (loss " +
                        std::to_string(result.loss) + ", grad norm " + std::to_string(result.grad_norm) +
                        "); stopped before the optimizer step. Look for near-constant dimensions in " +
                        "data.norm_stats, lower train.lr_peak, or allow skips with train.max_nonfinite_skips");
  }
  optimizer_->step(lr, grads);
  grads.clear();
  zero_grads();
  // Every rank's updated elements reach all ranks before the EMA (which reads only owned ones) and the next forward.
  if (shards_) shards_->broadcast_updates(cfg_.dist.bucket_size_mb << 20, 2 * (cfg_.dist.bucket_size_mb << 20));
  if (ema_) ema_->update();
  return result;
}

void Trainer::zero_grads() {
  for (auto& [name, p] : trainable_params_)
    if (p.grad().defined()) p.mutable_grad() = torch::Tensor();
  if (sharded_reducer_) sharded_reducer_->clear();
}

Trainer::RankStateBytes Trainer::rank_state_bytes() const {
  auto bytes = [](const std::map<std::string, torch::Tensor>& state) {
    int64_t n = 0;
    for (const auto& [key, t] : state)
      if (t.dim() > 0) n += t.numel() * static_cast<int64_t>(t.element_size());  // not the step count
    return n;
  };
  RankStateBytes b;
  b.optimizer = bytes(optimizer_->state_dict());
  if (ema_) b.ema = bytes(ema_->state_dict());
  b.grads = last_grad_bytes_;
  return b;
}

namespace {
// XXH3 digests travel between ranks as int64 tensors: parse and print the manifest's 16-hex-digit form.
int64_t digest_bits(const std::string& hex) { return static_cast<int64_t>(std::stoull(hex, nullptr, 16)); }
std::string digest_hex(int64_t bits) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(static_cast<uint64_t>(bits)));
  return buf;
}
}  // namespace

std::string Trainer::save_checkpoint() {
  const auto& ck = cfg_.checkpoint;
  const bool rank0 = options_.rank == 0;
  // Per-rank state: the noise RNG and the loader position of every rank, gathered to rank 0 which writes them.
  torch::Tensor rng_state;
  {
    std::lock_guard<std::mutex> lock(rng_.mutex());
    rng_state = rng_.get_state();
  }
  const auto pos = data_.loader->position();
  std::vector<torch::Tensor> rng_states{rng_state};
  std::vector<torch::Tensor> positions{torch::tensor({pos.epoch, pos.batch_index}, torch::kInt64)};
  if (pg_) {
    rng_states = pg_->all_gather(rng_state, "checkpoint: gather of the RNG states");
    positions = pg_->all_gather(positions[0], "checkpoint: gather of the loader positions");
  }
  const std::string written_barrier = "checkpoint of step " + std::to_string(step_) + " written by rank 0";
  if (!rank0 && !shards_) {
    pg_->barrier(written_barrier);
    return "";
  }
  fs::path tmp;
  if (rank0) {
    if (bad_steps_.count(step_) && fs::exists(checkpoint_path(ck.run_dir, step_))) {
      // Never overwrite a checkpoint that failed verification: keep it, under another name, for inspection.
      const auto aside = set_aside_checkpoint(ck.run_dir, step_);
      spdlog::warn("checkpoint of step {} failed verification at resume; moved to {} so the new one does not "
                   "replace it", step_, aside);
      bad_steps_.erase(step_);
    }
    tmp = begin_checkpoint(ck.run_dir, step_);
  }
  const auto t0 = Clock::now();
  // Every file records the step it belongs to, so one copied in from another checkpoint is caught on resume.
  const std::map<std::string, std::string> meta = {{"step", std::to_string(step_)}};
  std::map<std::string, io::FileDigest> digests;  // computed while writing: the manifest costs no extra read
  if (shards_) {
    // Sharded state: every rank writes its own pieces into rank 0's temporary directory (a shared file system,
    // as --resume already needs); a gather to rank 0 would need the whole state there, the memory sharding saves.
    tmp = pg_->broadcast_text(tmp.string(), 0, "checkpoint: temporary directory");
    const int64_t world = options_.world_size, rank = options_.rank;
    const auto& params = trainable_params_;
    auto pieces_of = [&](const std::map<std::string, torch::Tensor>& state, const std::vector<std::string>& suffixes) {
      std::vector<io::StatePiece> out;
      for (const auto& piece : shards_->owned()) {
        const auto& [name, p] = params[piece.param];
        for (const auto& suffix : suffixes) out.push_back({name + suffix, piece.begin, p.numel(), state.at(name + suffix)});
      }
      return out;
    };
    // [ok, optimizer size, optimizer xxh3, ema size, ema xxh3] per rank.
    auto mine = torch::zeros({5}, torch::kInt64);
    std::string failure;
    try {
      const auto opt_state = optimizer_->state_dict();
      const auto opt_file = io::state_file_name("optimizer", rank, world);
      const auto d = io::save_state_pieces((tmp / opt_file).string(), pieces_of(opt_state, {".exp_avg", ".exp_avg_sq"}),
                                           {{AdamW::kStepKey, opt_state.at(AdamW::kStepKey)}}, meta);
      mine[1] = static_cast<int64_t>(d.size);
      mine[2] = digest_bits(d.xxh3);
      if (ema_) {
        const auto e = io::save_state_pieces((tmp / io::state_file_name("ema", rank, world)).string(),
                                             pieces_of(ema_->state_dict(), {""}), {}, meta);
        mine[3] = static_cast<int64_t>(e.size);
        mine[4] = digest_bits(e.xxh3);
      }
      mine[0] = 1;
    } catch (const std::exception& e) {
      failure = e.what();
      spdlog::error("checkpoint of step {}: rank {} could not write its state: {}", step_, rank, failure);
    }
    const auto all = pg_->all_gather(mine, "checkpoint: gather of the state files' checksums");
    for (int64_t r = 0; r < world; ++r) {
      const auto& v = all[static_cast<size_t>(r)];
      if (v[0].item<int64_t>() != 1) {
        if (rank0) {
          std::error_code ec;
          fs::remove_all(tmp, ec);
        }
        throw UserError(r == rank ? failure
                                  : "checkpoint of step " + std::to_string(step_) + ": rank " + std::to_string(r) +
                                        " could not write its state (its log says why); nothing was saved");
      }
      digests[io::state_file_name("optimizer", r, world)] = {static_cast<uint64_t>(v[1].item<int64_t>()),
                                                             digest_hex(v[2].item<int64_t>())};
      if (ema_) {
        digests[io::state_file_name("ema", r, world)] = {static_cast<uint64_t>(v[3].item<int64_t>()),
                                                         digest_hex(v[4].item<int64_t>())};
      }
    }
    if (!rank0) {
      pg_->barrier(written_barrier);
      return "";
    }
  }
  std::string final_dir;
  try {
    io::SaveOptions so;
    so.metadata = meta;
    so.openpi_layout = false;  // exact parameter names, LoRA included: what resume needs
    so.include_lora = true;
    if (base_ref_) {
      // Small checkpoint: the frozen weights taken unchanged from the base are referenced, not copied.
      std::set<std::string> trainable_names;
      for (const auto& [name, p] : trainable_params_) trainable_names.insert(name);
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
    digests["model.safetensors"] = io::save_model_weights(*model_, (tmp / "model.safetensors").string(), so);
    if (!shards_) {
      if (ema_) {
        digests["ema.safetensors"] =
            io::save_safetensors((tmp / "ema.safetensors").string(), to_vector(ema_->state_dict()), meta);
      }
      digests["optimizer.safetensors"] =
          io::save_safetensors((tmp / "optimizer.safetensors").string(), to_vector(optimizer_->state_dict()), meta);
    }
    std::vector<std::pair<std::string, torch::Tensor>> lora;
    for (const auto& item : model_->named_parameters())
      if (item.key().find(".lora_") != std::string::npos) lora.emplace_back(item.key(), item.value());
    if (!lora.empty()) digests["lora.safetensors"] = io::save_safetensors((tmp / "lora.safetensors").string(), lora, meta);
    std::vector<std::pair<std::string, torch::Tensor>> rngs;
    TrainerState state;
    state.step = step_;
    state.world_size = options_.world_size;
    state.nonfinite_skips = nonfinite_skips_;
    for (size_t r = 0; r < rng_states.size(); ++r) {
      rngs.emplace_back("rank" + std::to_string(r) + ".noise_time", rng_states[r]);
      state.rank_loaders.push_back({positions[r][0].item<int64_t>(), positions[r][1].item<int64_t>()});
    }
    digests["rng.safetensors"] = io::save_safetensors((tmp / "rng.safetensors").string(), rngs, meta);
    write_file_atomic(tmp / kTrainerStateFile, to_json(state).dump(2) + "\n");
    write_file_atomic(tmp / "config.yaml", YAML::Dump(config::to_yaml(cfg_)) + "\n");
    const auto assets = tmp / "assets" / ck.asset_id;
    create_directories_or_throw(assets.string(), "checkpoint assets");
    fs::copy_file(cfg_.data.norm_stats, assets / "norm_stats.json", fs::copy_options::overwrite_existing);
    fs::copy_file(cfg_.data.tokenizer, tmp / "tokenizer.model", fs::copy_options::overwrite_existing);
    io::write_manifest(tmp.string(), step_, digests);  // last: it lists every other file
    final_dir = commit_checkpoint(tmp.string(), ck.run_dir, step_);
  } catch (...) {
    // A failed save (disk full, I/O error) leaves nothing behind; the previous checkpoints are untouched.
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  verified_steps_.insert(step_);
  prune_checkpoints(ck.run_dir, ck.keep_last, ck.keep_period, bad_steps_, verified_steps_);
  uint64_t bytes = 0;
  for (const auto& e : fs::recursive_directory_iterator(final_dir))
    if (e.is_regular_file()) bytes += e.file_size();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  spdlog::info("saved checkpoint {} ({:.2f} GB{} in {:.1f} s, {:.2f} GB/s)", final_dir, bytes / 1e9,
               base_ref_ ? ", frozen base by reference" : "", secs, bytes / 1e9 / std::max(secs, 1e-9));
  if (pg_) pg_->barrier(written_barrier);
  return final_dir;
}

void Trainer::restore(const std::string& dir) {
  const fs::path d(dir);
  const TrainerState state = read_trainer_state(dir);  // checked with check_resumable() by the constructor
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
    base_ref_.reset();
    base_names_.clear();
    const auto base = io::load_checkpoint_weights(*model_, dir, cfg_.checkpoint.init_weights,
                                                  "--set checkpoint.init_weights=NEW_PATH",
                                                  cfg_.checkpoint.reinit_mismatched_projections,
                                                  /*exact_dtypes=*/true);
    if (!base.empty()) {
      // Later checkpoints keep referring to the same (verified) base, at the path it was found.
      base_ref_ = *io::read_base_ref(dir);
      base_ref_->path = fs::absolute(base).lexically_normal().string();
      io::SafetensorsFile own((d / "model.safetensors").string());
      for (const auto& item : model_->named_parameters())
        if (!own.contains(item.key())) base_names_.insert(item.key());
    }
    // Optimizer and EMA state stream from the files straight into the existing tensors: no whole-file copy. The
    // files are whole tensors or per-rank pieces of any world size; this rank reads the elements it updates (all of
    // them, or its share under dist.shard), checked first against every file's header: exactly the tensors and
    // dtypes this trainer writes.
    std::vector<int64_t> begins;          // per tensor this rank updates: its first element in the parameter
    std::map<std::string, int64_t> numels;  // trainable parameter → element count
    for (const auto& [name, p] : trainable_params_) numels[name] = p.numel();
    if (shards_) {
      for (const auto& piece : shards_->owned()) begins.push_back(piece.begin);
    } else {
      begins.assign(trainable_params_.size(), 0);
    }
    auto read_state = [&](const std::string& prefix, const std::map<std::string, torch::Tensor>& targets,
                          const std::vector<std::string>& suffixes, const std::map<std::string, int64_t>& extra) {
      const auto files = io::state_files(dir, prefix);
      if (files.empty()) throw UserError((d / (prefix + ".safetensors")).string() + ": missing from the checkpoint");
      io::StateReader reader(files);
      std::map<std::string, int64_t> expected = extra;
      for (const auto& [name, n] : numels)
        for (const auto& suffix : suffixes) expected[name + suffix] = n;
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
      std::vector<io::StateReader::Request> requests;
      size_t i = 0;
      const auto& named = optimizer_->params();  // same order as the EMA's: both got the same list
      for (const auto& [name, view] : named) {
        for (const auto& suffix : suffixes) requests.push_back({name + suffix, begins[i], targets.at(name + suffix)});
        ++i;
      }
      return std::make_pair(std::move(reader), std::move(requests));
    };
    {
      auto state = optimizer_->state_dict();
      auto step_count = torch::zeros({1}, torch::kInt64);
      auto [reader, requests] = read_state("optimizer", state, {".exp_avg", ".exp_avg_sq"}, {{AdamW::kStepKey, 1}});
      requests.push_back({AdamW::kStepKey, 0, step_count});
      reader.read(requests, /*exact_dtype=*/true);
      optimizer_->restore_step_count(step_count.item<int64_t>());
    }
    if (ema_) {
      if (io::state_files(dir, "ema").empty()) {
        throw UserError("checkpoint '" + dir + "' has no EMA weights but train.ema_decay is " +
                        std::to_string(cfg_.train.ema_decay) + " (resume with train.ema_decay=0, or from a run with EMA)");
      }
      auto [reader, requests] = read_state("ema", ema_->state_dict(), {""}, {});
      reader.read(requests, /*exact_dtype=*/true);
    }
  } catch (const UserError& e) {
    unusable_if_unverified(e.what());
    // The contents verify, but this run cannot use them (another model, relabelled dtypes): fall back as well.
    throw UnusableCheckpoint(e.what());
  }
  unusable_if_unverified("");
  spdlog::info("loaded checkpoint state in {:.1f} s", std::chrono::duration<double>(Clock::now() - t0).count());
  // At the checkpoint's world size each rank continues its own RNG and loader; at another one (the global batch
  // unchanged) every rank takes rank 0's: all ranks draw the whole global batch's noise and walk the same global
  // batch order, so their states are equal (checked).
  const bool same_world = state.world_size == options_.world_size;
  {
    io::SafetensorsFile rng((d / "rng.safetensors").string());
    const auto mine = rng.get_copy("rank" + std::to_string(same_world ? options_.rank : 0) + ".noise_time");
    for (int64_t r = 1; !same_world && r < state.world_size; ++r) {
      if (!torch::equal(rng.get_copy("rank" + std::to_string(r) + ".noise_time"), mine))
        throw UserError(rng.path() + ": the ranks' noise generators differ, so this checkpoint resumes only at its "
                        "own world size (" + std::to_string(state.world_size) + ")");
    }
    std::lock_guard<std::mutex> lock(rng_.mutex());
    rng_.set_state(mine);
  }
  step_ = state.step;
  nonfinite_skips_ = state.nonfinite_skips;
  const data::LoaderPosition pos = state.rank_loaders.at(same_world ? static_cast<size_t>(options_.rank) : 0);
  data_.loader->seek(pos);
  spdlog::info("resumed from {} at step {} (loader epoch {}, batch {})", dir, step_, pos.epoch, pos.batch_index);
}

}  // namespace pi0::train
