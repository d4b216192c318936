#include "pi0/train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "pi0/common/check.h"
#include "pi0/common/files.h"
#include "pi0/common/fs.h"
#include "pi0/common/interrupt.h"
#include "pi0/common/profiler.h"
#include "pi0/common/strings.h"
#include "pi0/data/tokenizer.h"
#include "pi0/distributed/consistency.h"
#include "pi0/io/checkpoint_dir.h"
#include "pi0/io/model_weights.h"
#include "pi0/model/flow_matching.h"
#include "pi0/model/model_config.h"
#include "pi0/model/param_layout.h"
#include "pi0/nn/dense.h"
#include "pi0/nn/param_device.h"
#include "pi0/train/fast_decoding.h"
#include "pi0/train/lr_schedule.h"
#include "pi0/train/memory_plan.h"
#include "pi0/train/metrics_processor.h"
#include "pi0/train/host_update.h"
#include "pi0/train/offload.h"
#include "pi0/train/signals.h"
#include "pi0/train/trainer_state.h"

namespace pi0::train {

namespace fs = pi0::posix_fs;

using Clock = std::chrono::steady_clock;

namespace {

// pi0-FAST's actions for a validation batch, as pi0-infer gets them: greedy decoding from the prompt alone (the rows
// cut to their prefix), then openpi's text round trip; [B,H,A] float32 in normalized units, zeros past each example's
// robot dims and for rows that hold no actions, flagged in `undecodable` [B,1] (1.0). Greedy whatever
// model.temperature says: the same values every pass.
struct FastValidationActions {
  torch::Tensor actions, undecodable;
};
FastValidationActions decode_fast_actions(model::Pi0& model, const model::Observation& obs, const model::Batch& batch,
                                          const data::FastPromptTokenizer& reader, int64_t max_decoding_steps) {
  const auto device = obs.state.device();
  const int64_t n = obs.batch_size(), h = batch.actions.size(1), a = batch.actions.size(2);
  const auto cut = data::FastPromptTokenizer::prefix_only(batch.observation.tokenized_prompt,
                                                          batch.observation.tokenized_prompt_mask, batch.token_loss_mask);
  auto prefix = obs;
  prefix.tokenized_prompt = cut.tokens.to(device);
  prefix.tokenized_prompt_mask = cut.mask.to(device);
  const auto tokens =
      model->sample_fast_tokens(prefix, cut.ar_mask.to(device), max_decoding_steps, /*temperature=*/0.0).tokens;
  const auto dims = batch.action_dims.to(torch::kCPU, torch::kLong).contiguous();
  auto rows = reader.extract_generated_rows(
      tokens, h, std::vector<int64_t>(dims.data_ptr<int64_t>(), dims.data_ptr<int64_t>() + n), a);
  FastValidationActions out{std::move(rows.actions), torch::zeros({n, 1})};
  for (int64_t b = 0; b < n; ++b)
    if (!rows.decodable[static_cast<size_t>(b)]) out.undecodable[b][0] = 1.0f;
  return out;
}

// The profiler of this rank (--profile-steps): as many of the steps as are left; rank r > 0 writes into <dir>/rank<r>.
ProfilerOptions rank_profiler_options(ProfilerOptions o, int64_t rank, int64_t steps_left) {
  if (rank > 0) o.dir = (fs::path(o.dir) / ("rank" + std::to_string(rank))).string();
  return o.fit(steps_left);
}

void log_profile(const Profiler& profiler, int64_t rank) {
  if (rank != 0 || !profiler.report()) return;
  spdlog::info("profile written to {} (trace.json, profile.txt, profile.json; docs/profiling.md says how to read "
               "them):\n{}", profiler.options().dir, profiler.report()->format(10));
}

}  // namespace

Trainer::Trainer(config::Config cfg, RunOptions options)
    : cfg_(std::move(cfg)),
      options_(options),
      pg_(options.process_group),
      rng_(at::detail::createCPUGenerator(static_cast<uint64_t>(cfg_.train.seed))),
      checkpointer_(cfg_, options.rank, options.world_size, options.process_group) {
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
  checkpointer_.check_run_dir(options_.resume);
  plan_model();
  data_ = make_data_pipeline(cfg_, local_batch(), options_.rank, options_.world_size);
  if (cfg_.train.subtask.enabled && !data_.validation.empty()) {
    const data::Tokenizer tokenizer(cfg_.data.tokenizer);
    for (const int id : tokenizer.encode(cfg_.train.subtask.cue)) subtask_cue_.push_back(id);
    subtask_eos_ = tokenizer.eos_id();
  }
  // LeRobot data resolves adapt_to_pi "auto" from its features (on for ALOHA-like ones). The run dir, its
  // checkpoints and the bundles exported from them record the value the data was trained with, so that inference
  // converts state and actions exactly as training did (and serves ALOHA's metadata).
  if (cfg_.data.datasets.empty()) {
    cfg_.data.dataset.adapt_to_pi = data_.sources[0].dataset->options().adapt_to_pi;
  } else {
    for (size_t i = 0; i < cfg_.data.datasets.size(); ++i)
      cfg_.data.datasets[i].adapt_to_pi = data_.sources[i].dataset->options().adapt_to_pi;
  }
  checkpointer_.set_config(cfg_);
  checkpointer_.set_validation_set(data_.validation_set, options_.new_validation_set);
  // --resume: the newest checkpoint that verifies and that this run (world size, batch size, epoch length) can
  // continue, chosen by the Checkpointer before the model is built.
  if (options_.resume) resume_dir_ = checkpointer_.choose_resume(data_.loader->batches_per_epoch());
  interruption_point();
  // The host stages (gradient norms on the CPU, the host AdamW/EMA pass) run on a pool of their own, of the same size.
  set_host_pool_threads(static_cast<int>(cfg_.train.num_threads));
  // Same seed on every rank: every replica starts from identical weights.
  torch::manual_seed(static_cast<uint64_t>(cfg_.train.seed));
  build_model();
  interruption_point();
}

void Trainer::plan_model() {
  // The freeze preset and regexes, the precision: the placement table from the parameter layout (shapes only,
  // nothing allocated), which build_model applies.
  std::string why;
  const bool offload = choose_offload(cfg_, options_.world_size, device_memory_bytes(device_), &why);
  if (offload) {
    const auto refused = offload_refusal(cfg_, options_.world_size, device_.is_cuda());
    if (!refused.empty()) throw UserError(refused);
    // Refused before anything is allocated, rather than swapping or killed by the kernel minutes later.
    const auto host = offload_host_memory_refusal(plan_rank_memory(cfg_, options_.world_size, true).host_bytes,
                                                  host_available_bytes());
    if (!host.empty()) throw UserError(host);
  }
  if (options_.rank == 0 && cfg_.train.offload != "none") spdlog::info("{}", why);
  placement_ = make_placement(cfg_, offload);
  const auto mask = placement_.trainable_mask();
  if (std::find(mask.begin(), mask.end(), true) == mask.end())
    throw UserError("train.freeze '" + cfg_.train.freeze + "' leaves nothing to train");
  model::parse_attention_impl(cfg_.model.attention, "model.attention");
}

Trainer::~Trainer() {
  if (!offload_) return;
  // The host update of the last step uses the optimizer and the EMA, destroyed before offload_ is.
  model_->set_layer_gate({});
  try {
    offload_->finish_update();
  } catch (const std::exception& e) {
    spdlog::error("train.offload: the last host update failed: {}", e.what());
  }
}

model::Pi0& Trainer::model() {
  if (offload_) offload_->finish_update();
  return model_;
}

const NamedTensors& Trainer::trainable_weights() const {
  if (offload_) offload_->finish_update();
  return trainable_params_;
}

const Ema* Trainer::ema() const {
  if (offload_) offload_->finish_update();
  return ema_.get();
}

int64_t Trainer::local_batch() const { return config::micro_batch_size(cfg_.train, options_.world_size); }

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
    // Parameters are created directly on the training device; with the optimizer offloaded, on the host, where
    // what trains stays (its device copies are made below).
    nn::ParamDeviceScope on_device(placement_.offload ? torch::Device(torch::kCPU) : device_);
    nn::SkipInitScope skip(from_file);
    model_ = model::Pi0(opts);
  }
  // Freezing, storage and compute dtypes: the placement the memory plan counts (placement.h), before anything is
  // loaded, so weights read from a file land directly in their storage dtype.
  apply_placement(*model_, placement_, from_file);
  const auto& precision = cfg_.train.precision;
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
    // A partial fine-tune (something frozen): the base is read in the frozen parameters' storage dtype.
    const auto frozen = std::find_if(placement_.params.begin(), placement_.params.end(),
                                     [](const ParamPlacement& p) { return !p.trainable; });
    if (frozen != placement_.params.end() && !ck.self_contained && rank0) {
      auto base_ref = io::make_base_ref(ck.init_weights);
      if (frozen->storage == torch::kBFloat16) base_ref.frozen_dtype = "BF16";
      spdlog::info("checkpoints store what trains and refer to the frozen base {} (checksum {}); "
                   "checkpoint.self_contained=true stores everything",
                   base_ref.path, base_ref.checksum);
      checkpointer_.set_base(std::move(base_ref), {report.loaded.begin(), report.loaded.end()});
    }
  } else if (!from_file && cfg_.model.vocab_size == model::kPaligemmaVocabSize && rank0) {
    spdlog::warn("checkpoint.init_weights is empty: training a full-size model from random initialization "
                 "(set it to a pi0_base / pi05_base model.safetensors to fine-tune)");
  }
  if (rank0) spdlog::info("model ready in {:.1f} s", std::chrono::duration<double>(Clock::now() - t0).count());
  if (placement_.offload) {
    // Every replica starts from rank 0's weights, synchronized where they are (Gloo: offload with NCCL is refused),
    // before the device copies are made from them.
    if (pg_) check_and_sync_replicas();
    // One process: the norm is summed from per-tensor sums made as the gradients arrive; with several the all-reduce
    // changes the gradients afterwards, so it is summed after it, as without offload.
    offload_ = std::make_unique<OptimizerOffload>(*model_, placement_, device_, /*norms_as_they_arrive=*/!pg_);
    // The next forward starts while the host still updates: each layer waits for its own weights.
    model_->set_layer_gate([offload = offload_.get()](model::LayerStack stack, int64_t layer) {
      ProfileScope wait(phase::kOffloadWait);
      offload->wait_for_layer(stack, layer);
    });
  }
  model_->to(device_);
  // train.gradient_checkpointing=auto plans against the device with the offload decided (it frees device memory).
  std::string checkpointing_why;
  const auto checkpointed = choose_checkpointed_layers(cfg_, options_.world_size, placement_.offload,
                                                       device_memory_bytes(device_), &checkpointing_why);
  if (rank0 && cfg_.train.gradient_checkpointing == "auto") spdlog::info("{}", checkpointing_why);
  model_->set_checkpointed_layers(checkpointed.vision, checkpointed.language);
  model_->set_attention_impl(model::parse_attention_impl(cfg_.model.attention, "model.attention"));
  nn::set_cast_cache(*model_, cfg_.train.weight_cast_cache);
  model_->train();
  if (pg_ && !offload_) check_and_sync_replicas();

  NamedTensors trainable;
  if (offload_) {
    trainable = offload_->masters();
  } else {
    for (auto& [place, p] : placed_parameters(*model_, placement_, "Trainer"))
      if (place->trainable) trainable.emplace_back(place->name, p);
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
  grad_sync_ = distributed::make_grad_sync(shard_mode, pg_, trainable, cfg_.dist.bucket_size_mb << 20);
  // What this rank's AdamW and EMA update: everything, or (sharded) views of the elements it owns.
  optimizer_ = std::make_unique<AdamW>(grad_sync_->updated(), ao);
  if (cfg_.train.ema_decay > 0) ema_ = std::make_unique<Ema>(grad_sync_->updated(), cfg_.train.ema_decay);
  // The host update addresses AdamW's and the EMA's parameters by the masters' indices.
  PI0_CHECK(!offload_ || optimizer_->params().size() == offload_->masters().size(),
            "train.offload: the optimizer's parameters are not the masters");
  if (pg_ && options_.rank == 0) {
    spdlog::info("{}", grad_sync_->describe());
    if (const auto* shards = grad_sync_->shards()) {
      spdlog::info("dist.shard={}: each rank keeps AdamW state{} for its share of the trainable elements (largest "
                   "share {:.1f} MB)", cfg_.dist.shard, ema_ ? " and EMA" : "",
                   static_cast<double>(shards->layout().max_bytes()) / 1e6);
    }
  }

  if (options_.rank == 0) {
    const auto b = breakdown(placement_);
    spdlog::info("parameters (freeze preset '{}', precision {}):\n{}", cfg_.train.freeze, precision,
                 format_breakdown(b));
    if (offload_) {
      spdlog::info("train.offload=optimizer: {:.2f} GiB of master weights, gradients, AdamW and EMA on the host, "
                   "{:.2f} GiB of weight copies on {}; {}; {} loader worker{}, one ATen thread each",
                   static_cast<double>(b.total.host_bytes) / (1ull << 30),
                   static_cast<double>(b.total.device_copy_bytes) / (1ull << 30), device_.str(),
                   offload_->describe_threads(), cfg_.data.num_workers, cfg_.data.num_workers == 1 ? "" : "s");
    }
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
  install_stop_signal_handlers();
  checkpointer_.resume(resume_dir_, state());  // the newest checkpoint that verifies, or a fresh run dir
  resume_dir_.reset();
  interruption_point();  // nothing has been written yet: a stop requested during start-up ends here
  const int64_t first_step = step_;
  open_run_dir();
  // --profile-steps (common/profiler.h): the coming steps recorded; the loop only marks where each step begins and
  // ends, the phases are ranges where their work happens.
  std::optional<Profiler> profiler;
  if (options_.profile) profiler.emplace(rank_profiler_options(*options_.profile, options_.rank, t.num_steps - step_));
  while (step_ < t.num_steps) {
    if (profiler) profiler->begin_step();
    const double lr = scheduled_lr(t, step_);
    ProfileScope data_wait(phase::kDataWait);
    auto micro_batches = next_micro_batches();
    data_wait.end();
    // openpi logs the first batch's camera views at step 0 (train.tensorboard); a resumed run logged them before.
    if (step_ == 0) metrics_->log_camera_views(0, micro_batches.front().observation.images);
    const StepResult result = train_step(micro_batches, lr);
    // A skipped step (non-finite loss, within train.max_nonfinite_skips) counts: its data and noise are consumed,
    // and it is saved and stopped at like any other.
    ++step_;
    if (!result.skipped) {
      if (pg_ && step_ == first_step + 1) log_held_state();
      if (offload_) {
        const auto host = offload_->step_times();
        metrics_->add_offload_times(host.host_grad, host.host_update, host.forward_wait);
      }
      ProfileScope metrics(phase::kMetrics);
      if (result.ki) metrics_->add_ki(result.ki->ce, result.ki->flow, result.ki->correct, result.ki->targets);
      if (result.subtask) metrics_->add_subtask(result.subtask->ce, result.subtask->correct, result.subtask->targets);
      if (result.fast) metrics_->add_fast_accuracy(result.fast->correct, result.fast->targets);
      if (result.fast_decoding)
        metrics_->add_fast_decoding(result.fast_decoding->undecodable, result.fast_decoding->sequences);
      metrics_->log(step_, result.loss, result.grad_norm, lr);
    }
    const bool save = step_ % ck.save_interval == 0 || (step_ == t.num_steps && options_.final_checkpoint) || result.stop;
    // Validation every val_interval steps and at the end; before each save when keep_best ranks checkpoints by it.
    // Not at a stop signal: the run should end promptly.
    if (!data_.validation.empty() && !result.stop &&
        (step_ % config::val_interval(cfg_) == 0 || step_ == t.num_steps || (save && ck.keep_best > 0))) {
      ProfileScope validating(phase::kValidate);
      const auto t0 = Clock::now();
      const auto v = validate();
      last_val_.emplace(step_, v->loss);
      metrics_->log_validation(step_, *v, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    if (save) {
      ProfileScope saving(phase::kCheckpoint);
      save_checkpoint();
    }
    if (last_val_ && last_val_->first == step_) log_best_so_far(first_step);  // after the save: it may be the best
    if (profiler && profiler->end_step()) log_profile(*profiler, options_.rank);
    if (result.stop) {
      const std::string why = stop_signal() ? "stop signal " + std::to_string(stop_signal()) + " received"
                                            : std::string("another rank received a stop signal");
      spdlog::warn("{}: saved step {} and stopping (resume with --resume)", why, step_);
      break;
    }
  }
  if (profiler && profiler->recording()) {  // stopped before the last recorded step: what was recorded
    profiler->finish();
    log_profile(*profiler, options_.rank);
  }
  if (options_.rank == 0 && step_ == first_step) spdlog::info("nothing to do: already at step {}", step_);
  if (offload_) offload_->finish_update();  // run() returns with the last step's update done
  return step_;
}

CheckpointedState Trainer::state() {
  CheckpointedState s;
  s.model = model_.get();
  s.optimizer = optimizer_.get();
  s.ema = ema_.get();
  s.rng = &rng_;
  s.loader = data_.loader.get();
  s.shards = grad_sync_->shards();
  s.trainable = &trainable_params_;
  s.step = &step_;
  s.nonfinite_skips = &nonfinite_skips_;
  s.offload = offload_.get();
  if (last_val_ && last_val_->first == step_) s.val_loss = last_val_->second;
  return s;
}

std::string Trainer::save_checkpoint() {
  if (offload_) offload_->finish_update();  // the masters, moments and EMA as of the last step
  return checkpointer_.save(state());
}

std::vector<model::Batch> Trainer::next_micro_batches() {
  std::vector<model::Batch> micro_batches;
  for (int64_t micro = 0; micro < cfg_.train.grad_accum_steps; ++micro) micro_batches.push_back(data_.loader->next());
  return micro_batches;
}

void Trainer::open_run_dir() {
  const auto& t = cfg_.train;
  metrics_.emplace(t, options_.rank, options_.world_size, pg_, reducer_stats());
  if (options_.rank == 0) checkpointer_.open_run_dir();
  metrics_->start(step_, options_.rank == 0 ? (fs::path(cfg_.checkpoint.run_dir) / "metrics.jsonl").string() : "");
  if (options_.rank == 0 && step_ < t.num_steps) {
    spdlog::info("training steps {}–{}: global batch {} = {} per rank × {} ranks × {} accumulation steps, "
                 "{} samples in the dataset{}, device {}",
                 step_ + 1, t.num_steps, t.batch_size, local_batch(), options_.world_size, t.grad_accum_steps,
                 data_.loader->epoch_size(), data_.sources.size() > 1 ? "s" : "", device_.str());
    for (const auto& s : data_.sources) {
      if (data_.sources.size() == 1 && s.frames.empty()) break;
      const int64_t held = s.dataset->size() - s.size();
      spdlog::info("dataset '{}': weight {}, {} of {} frames for training{}", s.name, s.weight, s.size(),
                   s.dataset->size(), held > 0 ? ", " + std::to_string(held) + " held out for validation" : "");
    }
    if (!data_.validation.empty()) {
      spdlog::info("validation: {} held-out samples every {} steps (train.val_interval) and at the end",
                   data_.validation.size(), config::val_interval(cfg_));
    }
    if (t.rtc_max_delay > 0) {  // nothing else in the log says this run trains differently from openpi's
      spdlog::info("real-time chunking training is on: each example's first d actions enter clean and leave the "
                   "loss, d in 0..{} (train.rtc_max_delay, {} distribution{}); the bundle serves pi0-serve --rtc "
                   "trained up to that delay",
                   t.rtc_max_delay, t.rtc_delay_distribution,
                   t.rtc_delay_distribution == "exp" ? ", rate " + shortest_double(t.rtc_delay_exp_rate) : std::string());
    }
  }
}

void Trainer::log_best_so_far(int64_t first_step) {
  if (options_.rank != 0 || !last_val_) return;
  const auto [step, val] = *last_val_;
  if (!best_val_ || val < best_val_->second) best_val_ = last_val_;
  if (cfg_.checkpoint.keep_best > 0) {
    // keep_best's own ranking, this step's checkpoint included when it was just saved: the line names the checkpoint
    // pi0-export --best exports.
    const auto ranked = checkpointer_.rank_by_val_loss();
    if (!ranked.empty()) {
      const auto& best = ranked.front();
      spdlog::info("best so far: step {} (val_loss {:.4f}), checkpoint {}{}", best.step, best.val_loss,
                   io::checkpoint_path(cfg_.checkpoint.run_dir, best.step),
                   val < best.val_loss ? fmt::format("; this pass's val_loss {:.4f} is lower, but step {} is not a "
                                                     "checkpoint (checkpoint.save_interval {})",
                                                     val, step, cfg_.checkpoint.save_interval)
                                       : std::string());
      return;
    }
    spdlog::info("best so far: step {} (val_loss {:.4f}), not a checkpoint (none records a val_loss yet)",
                 best_val_->first, best_val_->second);
    return;
  }
  // Without keep_best nothing ranks the checkpoints: the lowest pass this process saw.
  spdlog::info("best so far: step {} (val_loss {:.4f}) among {}; checkpoint.keep_best: 1 would keep its checkpoint",
               best_val_->first, best_val_->second, first_step > 0 ? "the passes since this resume" : "this run's passes");
}

void Trainer::log_held_state() {
  // What each rank holds, measured from its tensors (what dist.shard and --print-params --world-size plan); a
  // single process holds what --print-params says. Collective.
  const auto held = rank_state_bytes();
  const auto all = pg_->all_gather(torch::tensor({held.optimizer, held.ema, held.grads}, torch::kInt64),
                                   "gather of the per-rank state sizes");
  for (size_t r = 0; options_.rank == 0 && r < all.size(); ++r) {
    spdlog::info("{}", format_held_state(static_cast<int64_t>(r), options_.world_size, all[r][0].item<int64_t>(),
                                         all[r][1].item<int64_t>(), all[r][2].item<int64_t>(), cfg_.dist.shard));
  }
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
  // The micro-batches' losses are summed on the device, in float64 (what the host sum of their float32 values was),
  // and read once after the loop: reading each one would stall the GPU stream once per micro-batch.
  torch::Tensor loss_sum;
  // train.ki: [ce, flow, correct, targets] summed over the micro-batches, read with the loss.
  torch::Tensor ki_sum;
  // pi0_fast: [correct, targets] summed over the micro-batches, read with the loss.
  torch::Tensor fast_sum;
  // train.subtask: [ce, correct, targets] summed over the micro-batches, read with the loss.
  torch::Tensor subtask_sum;
  // pi0_fast and train.ki: each micro-batch's teacher-forced FAST predictions, read after the step's one wait.
  std::vector<torch::Tensor> fast_predicted;
  for (int64_t micro = 0; micro < n_micro; ++micro) {
    if (offload_) {
      ProfileScope offload(phase::kOffload);
      offload_->before_forward(micro, n_micro);
    }
    grad_sync_->before_backward(micro, n_micro);
    ProfileScope forward(phase::kForward);
    const auto& batch = micro_batches[static_cast<size_t>(micro)];
    // Batches come pinned on CUDA (LoaderOptions::pin_memory): the copies overlap with queued GPU work.
    const bool async = device_.is_cuda();
    const auto obs = batch.observation.to(device_, async);
    const auto actions = batch.actions.to(device_, async);
    const int64_t b = actions.size(0);
    torch::Tensor noise, time;
    torch::Tensor loss;
    if (model_->is_fast()) {
      // pi0-FAST: openpi's cross-entropy over the FAST layout; no noise, time or action positions.
      PI0_CHECK(batch.token_ar_mask.defined(), "model.type pi0_fast but the batch has no token masks");
      const auto fl = model_->compute_fast_loss(obs, batch.token_ar_mask.to(device_, async),
                                                batch.token_loss_mask.to(device_, async));
      loss = fl.loss.mean();
      const auto parts = torch::stack({fl.correct.sum(), fl.targets.sum()}).to(torch::kFloat64);
      fast_sum = micro == 0 ? parts : fast_sum + parts;
      fast_predicted.push_back(fl.predicted);
    } else if (noise_time) {
      noise = noise_time->noise[static_cast<size_t>(micro)].to(device_, torch::kFloat32);
      time = noise_time->time[static_cast<size_t>(micro)].to(device_, torch::kFloat32);
    } else {
      // Noise and time come from the trainer's own generator so a resumed run draws the same values. Every rank
      // draws them for the global micro-batch and keeps its own slice, like its slice of the data.
      auto noise_shape = actions.sizes().vec();
      noise_shape[0] = b * options_.world_size;
      noise = torch::randn(noise_shape, rng_, f32).narrow(0, options_.rank * b, b).to(device_);
      time = model::sample_flow_time(b * options_.world_size, f32, rng_, options_.rank * b, b).to(device_);
    }
    // The positions that count in the loss: all (openpi), or those train.loss_mask and real-time chunking keep,
    // a pooled mean over them.
    torch::Tensor kept, elementwise;
    if (!loss.defined() && t.rtc_max_delay > 0) {
      // Training-time real-time chunking: each example's first d actions enter clean (t = 0) and leave the loss.
      // Drawn like the times (global micro-batch, own slice).
      const int64_t h = actions.size(1);
      const auto delays = model::sample_rtc_delays(b * options_.world_size, t.rtc_max_delay, t.rtc_delay_distribution,
                                                   t.rtc_delay_exp_rate, torch::TensorOptions(), rng_,
                                                   options_.rank * b, b)
                              .to(device_);
      time = model::rtc_token_time(time, delays, h);
      kept = model::rtc_loss_mask(delays, h, f32.device(device_)).unsqueeze(-1);
    }
    std::optional<model::Pi0Impl::KiLoss> ki;
    if (loss.defined()) {
      // pi0-FAST: the loss is made above.
    } else if (t.ki.enabled || t.subtask.enabled) {
      // [images; prompt; subtask; FAST]: the expert reads the subtask block (teacher-forced) but never the FAST one,
      // through a stop-gradient of the backbone's keys/values under insulation (docs/ki.md, docs/subtask.md).
      model::Pi0Impl::PrefixBlocks blocks;
      if (t.ki.enabled) {
        PI0_CHECK(batch.fast_tokens.defined(), "train.ki is on but the batch has no FAST block");
        blocks.fast_tokens = batch.fast_tokens.to(device_, async);
        blocks.fast_mask = batch.fast_mask.to(device_, async);
      }
      if (t.subtask.enabled) {
        PI0_CHECK(batch.subtask_tokens.defined(), "train.subtask is on but the batch has no subtask block");
        blocks.subtask_tokens = batch.subtask_tokens.to(device_, async);
        blocks.subtask_mask = batch.subtask_mask.to(device_, async);
        blocks.subtask_targets = batch.subtask_targets.to(device_, async);
      }
      ki = model_->compute_prefix_loss(obs, actions, blocks, /*stop_gradient=*/t.ki.enabled, noise, time);
      elementwise = ki->flow;
    } else {
      elementwise = model_->compute_loss(obs, actions, noise, time);
    }
    if (const auto lm = config::loss_mask(t); lm.any() && !model_->is_fast()) {
      const auto m = model::action_loss_mask(batch.action_rows, batch.action_dims, actions.size(1), actions.size(2),
                                             lm.episode_end, lm.action_padding, f32.device(device_));
      kept = kept.defined() ? kept * m : m;
    }
    if (!loss.defined()) loss = kept.defined() ? model::masked_mean(elementwise, kept) : elementwise.mean();
    if (ki) {
      // loss = ce_weight·CE_F + weight·CE_T + flow_weight·FM (flow_weight 1 and no CE_F without insulation).
      torch::Tensor total = t.ki.enabled ? t.ki.flow_weight * loss : loss;
      if (t.ki.enabled) {
        const auto ce = ki->ce.mean();
        const auto parts = torch::stack({ce.detach(), loss.detach(), ki->correct.sum(), ki->targets.sum()})
                               .to(torch::kFloat64);
        ki_sum = micro == 0 ? parts : ki_sum + parts;
        fast_predicted.push_back(ki->predicted);
        total = total + t.ki.ce_weight * ce;
      }
      if (t.subtask.enabled) {
        const auto ce = ki->subtask_ce.mean();
        const auto parts =
            torch::stack({ce.detach(), ki->subtask_correct.sum(), ki->subtask_targets.sum()}).to(torch::kFloat64);
        subtask_sum = micro == 0 ? parts : subtask_sum + parts;
        total = total + t.subtask.weight * ce;
      }
      loss = total;
    }
    forward.end();
    ProfileScope backward(phase::kBackward);
    (loss / static_cast<double>(n_micro)).backward();
    backward.end();
    const auto loss_f64 = loss.detach().to(torch::kFloat64);
    loss_sum = micro == 0 ? loss_f64 : loss_sum + loss_f64;
    if (offload_) {
      ProfileScope offload(phase::kOffload);
      offload_->after_backward(micro, n_micro);  // the gradients are in the masters' .grad (last one)
    }
    ProfileScope sync(phase::kGradSync);
    grad_sync_->after_backward(micro, n_micro);
  }
  ProfileScope norm_clip(phase::kGradNormClip);
  nn::clear_cast_cache(*model_);  // the step's bf16 weight copies: the optimizer is about to change the weights
  const double max_norm = t.clip_grad_norm > 0 ? t.clip_grad_norm : std::numeric_limits<double>::infinity();
  // The gradients this rank's optimizer applies (mean over ranks): all of them, or the owned elements' (sharded).
  // Offloaded in one process: where the host holds them, in the dtype they arrived in.
  const bool offload_grads = offload_ && offload_->norms_as_they_arrive();
  std::vector<torch::Tensor> grads = offload_grads ? offload_->gradients() : grad_sync_->gradients();
  last_grad_bytes_ = grad_sync_->held_grad_bytes();
  {
    // The step's one wait for the GPU: the loss and the gradients' sum of squares, read together.
    // Offloaded (one process): the per-tensor sums were made on the host as the gradients arrived.
    const auto sum_sq = offload_grads ? offload_->gradient_sum_of_squares() : gradient_sum_of_squares(grads);
    auto read = torch::stack({loss_sum, sum_sq.defined() ? sum_sq.to(loss_sum.device()) : torch::zeros_like(loss_sum)});
    if (ki_sum.defined()) read = torch::cat({read, ki_sum});
    const int64_t subtask_at = read.size(0);
    if (subtask_sum.defined()) read = torch::cat({read, subtask_sum});
    if (fast_sum.defined()) read = torch::cat({read, fast_sum});
    const auto host = read.cpu();
    if (subtask_sum.defined()) {
      result.subtask = StepResult::Subtask{host[subtask_at].item<double>() / static_cast<double>(n_micro),
                                           host[subtask_at + 1].item<double>(), host[subtask_at + 2].item<double>()};
    }
    if (fast_sum.defined()) {
      const int64_t at = host.size(0) - 2;
      result.fast = StepResult::FastAccuracy{host[at].item<double>(), host[at + 1].item<double>()};
    }
    result.loss = host[0].item<double>() / static_cast<double>(n_micro);
    if (ki_sum.defined()) {
      result.ki = StepResult::Ki{host[2].item<double>() / static_cast<double>(n_micro),
                                 host[3].item<double>() / static_cast<double>(n_micro), host[4].item<double>(),
                                 host[5].item<double>()};
    }
    double total = host[1].item<double>();
    if (const auto sum_over_ranks = grad_sync_->norm_sum_over_ranks()) total = sum_over_ranks(total);
    result.grad_norm = std::sqrt(total);
  }
  if (!fast_predicted.empty()) {
    // Read after the wait above (the predictions are ready): host work of about a millisecond per example.
    PI0_CHECK(data_.fast_reader != nullptr, "FAST predictions but no FAST reader in the data pipeline");
    StepResult::FastDecoding d;
    for (size_t i = 0; i < fast_predicted.size(); ++i) {
      const auto c = model_->is_fast() ? count_undecodable_fast(*data_.fast_reader, fast_predicted[i], micro_batches[i])
                                       : count_undecodable_ki(*data_.fast_reader, fast_predicted[i], micro_batches[i]);
      d.undecodable += static_cast<double>(c.undecodable), d.sequences += static_cast<double>(c.sequences);
    }
    result.fast_decoding = d;
  }
  // Clipping: a factor the update applies as it reads each gradient (no pass of its own; 1 when not finite).
  const double grad_scale = clip_scale(result.grad_norm, max_norm);
  norm_clip.end();
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
      grad_sync_->clear();
      result.skipped = true;
      return result;
    }
    throw TrainingError("non-finite " + std::string(loss_finite ? "gradient norm" : "loss") + " at step " +
                        std::to_string(step_ + 1) + " on rank " + std::to_string(options_.rank) + " (loss " +
                        std::to_string(result.loss) + ", grad norm " + std::to_string(result.grad_norm) +
                        "); stopped before the optimizer step. Look for near-constant dimensions in " +
                        "data.norm_stats, lower train.lr_peak, or allow skips with train.max_nonfinite_skips");
  }
  ProfileScope optimizer(phase::kOptimizer);
  if (offload_) {
    // On the host thread, layer group by layer group in the forward's order, while this returns and the next step
    // starts (its forward waits at each layer for that layer's weights). offload_refusal() leaves no sharding here,
    // so no after_update broadcast is due. The gradients are held by value: clear() below only drops the masters'
    // references to them.
    optimizer_->begin_step();
    offload_->update_in_forward_order({optimizer_.get(), ema_.get(), lr, grad_scale, std::move(grads)});
    grad_sync_->clear();
    return result;
  }
  optimizer_->step(lr, grads, grad_scale);
  grads.clear();
  grad_sync_->clear();
  // Every rank's updated elements reach all ranks before the EMA (which reads only owned ones) and the next forward.
  grad_sync_->after_update();
  optimizer.end();
  if (ema_) {
    ProfileScope ema(phase::kEma);
    ema_->update();
  }
  return result;
}

std::optional<ValidationResult> Trainer::validate() {
  const auto& samples = data_.validation;
  if (samples.empty()) return std::nullopt;
  if (offload_) {
    offload_->finish_update();
    offload_->wait_for_weights();
  }
  torch::NoGradGuard no_grad;
  // Sampling from weights that change every step: the simplified inference copy would be remade (and its memory
  // held) at every pass.
  const bool fused = model_->fused_inference();
  model_->set_fused_inference(false);
  const auto lm = config::loss_mask(cfg_.train);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  const int64_t h = cfg_.model.action_horizon, d = cfg_.model.action_dim;
  // Per dataset (source): loss numerator and count, action error numerator and count, with train.subtask the
  // subtask cross-entropy summed over samples, its correct targets and its targets, and for pi0-FAST the samples
  // whose decoding held no actions (float64, all-reduced once); the pass's values are the column sums' ratios, each
  // dataset's its own row's.
  const auto num_sources = static_cast<int64_t>(data_.sources.size());
  auto sums = torch::zeros({num_sources, 8}, torch::kFloat64);
  // A subtask model acts after its subtask block, as trained (teacher-forced: the flow loss and the block's
  // cross-entropy) and as pi0-infer runs it (its own greedy decoding first: the sampled actions' error).
  const auto& st = cfg_.train.subtask;
  auto counts = torch::zeros({num_sources}, torch::kFloat64);
  std::vector<int64_t> mine;  // this rank's share: every world_size-th sample
  for (int64_t i = options_.rank; i < static_cast<int64_t>(samples.size()); i += options_.world_size) mine.push_back(i);
  const int64_t chunk = local_batch();
  for (size_t first = 0; first < mine.size(); first += static_cast<size_t>(chunk)) {
    const size_t last = std::min(mine.size(), first + static_cast<size_t>(chunk));
    std::vector<data::SampleRef> refs;
    std::vector<int64_t> source_of;
    std::vector<torch::Tensor> noise, time;
    for (size_t j = first; j < last; ++j) {
      refs.push_back(samples[static_cast<size_t>(mine[j])]);
      source_of.push_back(refs.back().source);
      // Fixed per sample: its own generator from the seed and its place in the validation set.
      auto gen = at::detail::createCPUGenerator(data::sample_seed(static_cast<uint64_t>(cfg_.train.seed), -6, mine[j]));
      noise.push_back(torch::randn({h, d}, gen, f32));
      time.push_back(model::sample_flow_time(1, f32, gen));
    }
    const auto batch = data::make_batch(data_.sources, refs);
    const auto obs = batch.observation.to(device_);
    const auto actions = batch.actions.to(device_);
    const auto noise_b = torch::stack(noise).to(device_);
    torch::Tensor elementwise, sampled, subtask_parts;
    torch::Tensor loss_sum, loss_count;  // per sample [B]
    auto undecodable = torch::zeros({obs.batch_size(), 1}, f32);
    if (model_->is_fast()) {
      // pi0-FAST: val_loss is its cross-entropy, teacher-forced as in training; the actions come from greedy
      // decoding of the prompt alone, read as pi0-infer reads them (zeros where they hold none).
      const auto fl = model_->compute_fast_loss(obs, batch.token_ar_mask.to(device_), batch.token_loss_mask.to(device_));
      loss_sum = fl.loss, loss_count = torch::ones_like(fl.loss);
      const auto decoded = decode_fast_actions(model_, obs, batch, *data_.fast_reader, cfg_.model.max_decoding_steps);
      sampled = decoded.actions.to(device_);
      undecodable = decoded.undecodable;
      subtask_parts = torch::zeros({obs.batch_size(), 3}, f32.device(device_));
    } else if (st.enabled) {
      model::Pi0Impl::PrefixBlocks blocks;
      blocks.subtask_tokens = batch.subtask_tokens.to(device_);
      blocks.subtask_mask = batch.subtask_mask.to(device_);
      blocks.subtask_targets = batch.subtask_targets.to(device_);
      const auto l = model_->compute_prefix_loss(obs, actions, blocks, /*stop_gradient=*/true, noise_b,
                                                 torch::cat(time).to(device_));
      elementwise = l.flow;
      subtask_parts = torch::stack({l.subtask_ce, l.subtask_correct, l.subtask_targets}, 1).to(torch::kFloat32);
      sampled = model_->sample_actions_after_subtask(obs, subtask_cue_, st.max_tokens, subtask_eos_, nullptr, noise_b);
    } else {
      elementwise = model_->compute_loss(obs, actions, noise_b, torch::cat(time).to(device_));
      sampled = model_->sample_actions(obs, noise_b);
      subtask_parts = torch::zeros({obs.batch_size(), 3}, f32.device(device_));
    }
    const auto loss_mask = model::action_loss_mask(batch.action_rows, batch.action_dims, h, d, lm.episode_end,
                                                   lm.action_padding, f32.device(device_));
    // The robot's own dims always (the padding is zero by construction and would dilute the error); the recorded
    // rows only with episode_end, as the loss.
    const auto action_mask = model::action_loss_mask(batch.action_rows, batch.action_dims, h, d, lm.episode_end,
                                                     /*action_padding=*/true, f32.device(device_));
    const auto sq = (sampled.to(torch::kFloat32) - actions).pow(2);
    if (!loss_sum.defined()) loss_sum = (elementwise * loss_mask).sum({1, 2}), loss_count = loss_mask.sum({1, 2});
    // Per sample [B, 8], summed into its dataset's row.
    const auto per_sample =
        torch::cat({torch::stack({loss_sum, loss_count, (sq * action_mask).sum({1, 2}), action_mask.sum({1, 2})}, 1),
                    subtask_parts, undecodable.to(device_)},
                   1)
            .to(torch::kCPU, torch::kFloat64);
    const auto index = torch::tensor(source_of, torch::kInt64);
    sums.index_add_(0, index, per_sample);
    counts.index_add_(0, index, torch::ones({index.numel()}, torch::kFloat64));
  }
  model_->set_fused_inference(fused);
  nn::clear_cast_cache(*model_);  // the pass's weight copies: not held into the next step
  auto reduced = torch::cat({sums, counts.unsqueeze(1)}, 1);  // one collective: [sources, 9]
  if (pg_) pg_->all_reduce_sum(reduced, "validation sums");
  const auto total = reduced.sum(0);
  ValidationResult r;
  r.loss = total[0].item<double>() / std::max(total[1].item<double>(), 1.0);
  r.action_mse = total[2].item<double>() / std::max(total[3].item<double>(), 1.0);
  r.samples = static_cast<int64_t>(samples.size());
  if (st.enabled) {
    r.subtask_ce = total[4].item<double>() / std::max(total[8].item<double>(), 1.0);
    r.subtask_acc = total[5].item<double>() / std::max(total[6].item<double>(), 1.0);
  }
  if (model_->is_fast()) r.fast_undecodable = total[7].item<double>() / std::max(total[8].item<double>(), 1.0);
  for (int64_t i = 0; i < num_sources; ++i) {
    const auto row = reduced[i];
    DatasetValidation d;
    d.name = data_.sources[static_cast<size_t>(i)].name;
    d.loss_positions = row[1].item<double>();
    d.action_positions = row[3].item<double>();
    d.loss = d.loss_positions > 0 ? row[0].item<double>() / d.loss_positions : std::nan("");
    d.action_mse = d.action_positions > 0 ? row[2].item<double>() / d.action_positions : std::nan("");
    d.samples = static_cast<int64_t>(row[8].item<double>());
    r.datasets.push_back(std::move(d));
  }
  return r;
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

}  // namespace pi0::train
