#include "pi0/serve/policy.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <future>

#include <spdlog/spdlog.h>

#include "pi0/common/check.h"
#include "pi0/common/strings.h"
#include "pi0/config/policy_metadata.h"

namespace pi0::serve {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Two requests can share a sample_actions call when their per-row tensors have the same shapes.
bool same_shapes(const infer::InferenceInputs& a, const infer::InferenceInputs& b) {
  return a.observation.tokenized_prompt.size(1) == b.observation.tokenized_prompt.size(1) &&
         a.raw_state.size(1) == b.raw_state.size(1);
}

// "runs/x/bundle/" → "bundle": clients learn which bundle, not the server's paths.
std::string bundle_name(const std::string& dir) {
  auto p = std::filesystem::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

}  // namespace

std::pair<std::string, nlohmann::json> parse_metadata_flag(const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw UserError("--metadata: got " + quote_value(assignment, 80) +
                    ", expected key=<JSON value>, e.g. reset_pose=[0,-1.5,1.5,0,0,0] or task='\"fold\"'");
  const std::string key = assignment.substr(0, eq);
  auto value = nlohmann::json::parse(assignment.substr(eq + 1), nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded())
    throw UserError("--metadata " + key + ": " + quote_value(assignment.substr(eq + 1), 80) +
                    " is not JSON, expected a JSON value (a string in double quotes, a number, a list, ...)");
  return {key, value};
}

struct Policy::Pending {
  infer::InferenceInputs inputs;
  model::RtcRequest rtc;  // mode off unless the request carries a previous chunk
  bool batched = false;
  Callback done;
  Clock::time_point start;
};

Policy::Policy(io::Bundle bundle, PolicyOptions options)
    : bundle_(std::move(bundle)), options_(std::move(options)), device_(infer::model_device(bundle_)) {
  if (options_.num_steps < 1)
    throw UserError("--num-steps: got " + std::to_string(options_.num_steps) + ", expected a positive integer");
  if (options_.max_batch == 0) options_.max_batch = device_.is_cuda() ? 8 : 1;
  if (options_.max_batch < 1)
    throw UserError("--max-batch: got " + std::to_string(options_.max_batch) + ", expected >= 1 (0 = auto)");
  infer::check_rtc_mode_flag(options_.rtc.mode, "--rtc");
  if (options_.rtc.mode == "trained" && infer::trained_max_delay(bundle_) == 0)  // said at start, not per request
    spdlog::warn("pi0-serve: --rtc trained, but the bundle was trained without delays (train.rtc_max_delay 0): "
                 "requests with an inference_delay > 0 will be refused and the metadata offers no RTC mode, so "
                 "clients chunk plainly; serve it with --rtc auto or guided, or train with train.rtc_max_delay");
  const double beta = options_.rtc.guidance.max_weight;
  if (!(std::isfinite(beta) && beta > 0))
    throw UserError("--rtc-max-weight: got " + c10::str(beta) + ", expected a number > 0");
  const auto& mo = bundle_.model->options();
  if (options_.noise.defined() && bundle_.fast_prompt)
    throw UserError("--noise: a pi0-FAST bundle decodes action tokens and draws no noise; leave --noise out");
  if (options_.noise.defined()) {
    auto n = options_.noise.to(torch::kFloat32);
    if (n.dim() == 2) n = n.unsqueeze(0);
    if (n.dim() != 3 || n.size(0) != 1 || n.size(1) != mo.action_horizon || n.size(2) != mo.action_dim)
      throw UserError("--noise: tensor has shape " + c10::str(options_.noise.sizes()) + ", expected [" +
                      std::to_string(mo.action_horizon) + "," + std::to_string(mo.action_dim) + "] or [1,H,A]");
    options_.noise = n.contiguous();
  }
  const int64_t bundle_dims = io::action_dims(bundle_);
  const int64_t want = robot_action_dims(options_.robot);
  if (want > bundle_dims)
    throw UserError("--robot " + robot_name(options_.robot) + ": the bundle's actions have " + std::to_string(bundle_dims) +
                    " dims (its norm stats 'actions'), expected >= " + std::to_string(want) + " for this robot" +
                    io::asset_hint(bundle_, "the robot's " + std::to_string(want) + " action dims", -1, want));
  action_dims_ = want > 0 ? want : bundle_dims;
  bundle_.model->set_cuda_graph(device_.is_cuda());
  tokenizer_ = std::make_unique<data::Tokenizer>(bundle_.tokenizer_path);

  const auto& cfg = bundle_.config;
  metadata_ = {{"server", "pi0-serve"},
               {"model_type", bundle_.transform.model_type},
               {"robot", robot_name(options_.robot)},
               {"action_horizon", mo.action_horizon},
               {"action_dim", action_dims_},
               {"model_action_dim", mo.action_dim},
               {"state_dim", robot_state_dims(options_.robot)},
               {"image_size", bundle_.transform.image_size},
               {"max_token_len", bundle_.transform.max_token_len},
               {"num_steps", options_.num_steps},
               {"max_batch", options_.max_batch},
               {"adapt_to_pi", cfg.data.dataset.adapt_to_pi_enabled()},
               {"config_id", cfg.checkpoint.asset_id},
               {"bundle", bundle_name(bundle_.dir)},
               {"device", device_.str()},
               {"dtype", bundle_.dtype == torch::kBFloat16 ? "bf16" : "f32"},
               {"rtc", infer::rtc_metadata(bundle_, options_.rtc)}};
  // Announced only by a subtask model, so other bundles' metadata stays as it was.
  if (bundle_.subtask_tokenizer)
    metadata_["subtask"] = {{"cue", cfg.train.subtask.cue}, {"max_tokens", cfg.train.subtask.max_tokens}};
  // pi0-FAST's decoding (num_steps takes no part there); replies then carry fast_decodable.
  if (bundle_.fast_prompt)
    metadata_["fast"] = {{"max_decoding_steps", cfg.model.max_decoding_steps},
                         {"temperature", cfg.model.temperature},
                         {"action_dim", bundle_dims}};
  for (auto it = metadata_.begin(); it != metadata_.end(); ++it) {
    const auto& reserved = config::reserved_metadata_keys();
    PI0_CHECK(std::find(reserved.begin(), reserved.end(), it.key()) != reserved.end(), "metadata key '", it.key(),
              "' missing from config::reserved_metadata_keys()");
  }
  nlohmann::json extra = config::policy_metadata(cfg);
  for (auto it = options_.metadata.begin(); it != options_.metadata.end(); ++it)
    config::set_policy_metadata(extra, it.key(), it.value(), "--metadata " + it.key());
  metadata_.update(extra);
  thread_ = std::thread([this] { model_loop(); });
}

Policy::~Policy() { stop(); }

void Policy::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Policy::submit(const Fields& fields, Callback done) {
  auto p = std::make_unique<Pending>();
  p->start = Clock::now();
  ModelRequest req = to_model_request(options_.robot, fields, options_.default_prompt);
  p->inputs = infer::make_inputs(bundle_, req.tensors, "observation", req.prompt, tokenizer_.get());
  if (options_.rtc.mode != "off") {  // off: the keys are ignored, as openpi ignores keys it does not use
    const auto previous = previous_chunk_of(fields, req);
    const auto& rows = previous.robot_rows;
    if (rows.defined() && rows.size(-1) != action_dims_)
      throw UserError("observation: 'prev_action_chunk' has " + std::to_string(rows.size(-1)) +
                      " dims per row, expected " + std::to_string(action_dims_) + " (the rows as pi0-serve returned them)");
    p->rtc = infer::rtc_request(bundle_, options_.rtc, previous, p->inputs.raw_state, "observation");
  }
  p->batched = req.batched;
  p->done = std::move(done);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) throw std::runtime_error("the policy is shutting down");
    queue_.push_back(std::move(p));
  }
  cv_.notify_one();
}

PolicyResult Policy::infer(const Fields& fields) {
  std::promise<PolicyResult> promise;
  auto future = promise.get_future();
  submit(fields, [&promise](PolicyResult r, std::exception_ptr e) {
    if (e) promise.set_exception(e);
    else promise.set_value(std::move(r));
  });
  return future.get();
}

void Policy::model_loop() {
  torch::NoGradGuard no_grad;
  for (;;) {
    std::vector<std::unique_ptr<Pending>> batch;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued is answered
      int64_t rows = 0;
      while (!queue_.empty()) {
        auto& next = queue_.front();
        const int64_t b = next->inputs.observation.batch_size();
        // A request that continues a previous chunk runs alone: its rows, delay and mode are its own, and
        // sample_actions takes one RtcRequest per call (guided mode also runs eager, without the CUDA graph).
        const bool alone = next->rtc.active();
        if (!batch.empty() &&
            (alone || rows + b > options_.max_batch || !same_shapes(batch.front()->inputs, next->inputs)))
          break;
        rows += b;
        batch.push_back(std::move(next));
        queue_.pop_front();
        if (alone) break;
      }
    }
    run_batch(batch);
  }
}

void Policy::run_batch(std::vector<std::unique_ptr<Pending>>& batch) {
  std::vector<PolicyResult> results;
  std::exception_ptr error;
  try {
    // The requests' rows as one batch (same_shapes: their tensors concatenate).
    infer::InferenceInputs inputs;
    auto& obs = inputs.observation;
    const auto& first = batch.front()->inputs.observation;
    for (size_t slot = 0; slot < first.images.size(); ++slot) {
      std::vector<torch::Tensor> imgs, masks;
      for (auto& p : batch) {
        imgs.push_back(p->inputs.observation.images[slot]);
        masks.push_back(p->inputs.observation.image_masks[slot]);
      }
      obs.images.push_back(torch::cat(imgs));
      obs.image_masks.push_back(torch::cat(masks));
    }
    std::vector<torch::Tensor> state, tokens, token_mask, raw_state, ar_mask;
    for (auto& p : batch) {
      if (p->inputs.token_ar_mask.defined()) ar_mask.push_back(p->inputs.token_ar_mask);
      state.push_back(p->inputs.observation.state);
      tokens.push_back(p->inputs.observation.tokenized_prompt);
      token_mask.push_back(p->inputs.observation.tokenized_prompt_mask);
      raw_state.push_back(p->inputs.raw_state);
    }
    obs.state = torch::cat(state);
    obs.tokenized_prompt = torch::cat(tokens);
    obs.tokenized_prompt_mask = torch::cat(token_mask);
    inputs.raw_state = torch::cat(raw_state);
    if (!ar_mask.empty()) inputs.token_ar_mask = torch::cat(ar_mask);
    const int64_t rows = obs.batch_size();
    if (rows > largest_batch_) largest_batch_ = rows;
    std::optional<torch::Tensor> noise;
    if (options_.noise.defined()) noise = options_.noise.expand({rows, -1, -1}).contiguous();

    const auto& rtc = batch.front()->rtc;  // active only in a batch of one (model_loop)
    const auto predicted =
        infer::predict(bundle_, inputs, noise, options_.num_steps, nullptr, rtc.active() ? &rtc : nullptr);
    const auto robot = predicted.robot_actions.narrow(-1, 0, action_dims_);

    int64_t row = 0;
    for (auto& p : batch) {
      const int64_t b = p->inputs.observation.batch_size();
      PolicyResult r;
      r.actions = p->batched ? robot.narrow(0, row, b).contiguous() : robot[row].contiguous();
      r.model_ms = predicted.model_ms;
      r.total_ms = ms_since(p->start);
      // Trained mode with d = 0 samples as plain sampling does; the client still learns which mode it got.
      if (p->rtc.mode != model::RtcMode::kOff)
        r.rtc = {{"mode", model::to_string(p->rtc.mode)}, {"delay", p->rtc.delay}};
      if (!predicted.subtasks.empty()) {
        const auto first = predicted.subtasks.begin() + row;
        r.subtask = p->batched ? nlohmann::json(std::vector<std::string>(first, first + b)) : nlohmann::json(*first);
      }
      if (!predicted.fast_decodable.empty()) {
        const auto first = predicted.fast_decodable.begin() + row;
        r.fast_decodable = p->batched ? nlohmann::json(std::vector<bool>(first, first + b)) : nlohmann::json(*first);
      }
      row += b;
      results.push_back(std::move(r));
    }
  } catch (...) {
    error = std::current_exception();
    spdlog::error("pi0-serve: model call failed for {} request(s)", batch.size());
  }
  // The callbacks run outside the try: one that throws must not be answered twice.
  for (size_t i = 0; i < batch.size(); ++i) batch[i]->done(error ? PolicyResult{} : std::move(results[i]), error);
}

}  // namespace pi0::serve
