#include "pi0/infer/inference.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "pi0/common/check.h"
#include "pi0/common/shape_str.h"
#include "pi0/data/aloha.h"
#include "pi0/data/fast_prompt.h"
#include "pi0/data/tokenizer.h"
#include "pi0/data/transforms.h"

namespace pi0::infer {

InferenceInputs make_inputs(const io::Bundle& bundle, const std::map<std::string, torch::Tensor>& tensors,
                            const std::string& source, const std::optional<std::string>& prompt,
                            const data::Tokenizer* tokenizer) {
  data::ObservationFormat format;
  format.transform = bundle.transform;
  format.norm_stats = &bundle.norm_stats;
  format.adapt_to_pi = bundle.config.data.dataset.adapt_to_pi_enabled();
  format.vocab_size = bundle.config.model.vocab_size;
  format.fast_prompt = bundle.fast_prompt.get();
  try {
    return data::read_observation(tensors, format, source, prompt, tokenizer);
  } catch (const UserError& e) {
    // A mixture's bundle used without --asset: the dims that do not fit the first asset's stats usually fit another.
    const auto it = tensors.find("state");
    if (it == tensors.end() || it->second.dim() != 2) throw;
    const int64_t dims = it->second.size(1);
    const std::string hint =
        io::asset_hint(bundle, "the observation's " + std::to_string(dims) + " state dims", dims);
    if (hint.empty()) throw;
    throw UserError(std::string(e.what()) + hint);
  }
}

torch::Tensor robot_actions(const io::Bundle& bundle, const torch::Tensor& actions_BHA,
                            const torch::Tensor& raw_state_BS) {
  const auto& t = bundle.transform;
  const auto mode = t.norm_mode();
  torch::Tensor a = actions_BHA.to(torch::kCPU, torch::kFloat32);
  if (mode != data::NormMode::kNone) {
    const auto& stats = bundle.norm_stats.at("actions");
    const int64_t d = std::min<int64_t>(a.size(-1), static_cast<int64_t>(stats.mean.size()));
    a = data::unnormalize(a.narrow(-1, 0, d), stats, mode);
  }
  if (!t.delta_action_mask.empty()) {
    std::vector<torch::Tensor> per;
    for (int64_t b = 0; b < a.size(0); ++b)
      per.push_back(data::absolute_actions(a[b], raw_state_BS[b].to(torch::kFloat32), t.delta_action_mask));
    a = torch::stack(per);
  }
  if (bundle.config.data.dataset.adapt_to_pi_enabled()) a = data::aloha_actions_from_pi(a, "the model's actions");
  return a.contiguous();
}

torch::Tensor model_actions(const io::Bundle& bundle, const torch::Tensor& robot_BRD, const torch::Tensor& raw_state_BS,
                            const std::string& source) {
  const auto& t = bundle.transform;
  const auto mode = t.norm_mode();
  const int64_t model_dim = bundle.config.model.action_dim;
  torch::Tensor a = robot_BRD.to(torch::kCPU, torch::kFloat32);
  if (a.dim() != 3) throw UserError(source + ": prev_action_chunk must be [rows, dims] (or [batch, rows, dims])");
  if (mode != data::NormMode::kNone) {
    const int64_t dims = static_cast<int64_t>(bundle.norm_stats.at("actions").mean.size());
    // A robot may be served fewer dims than the policy predicts (its profile's): the others stay 0 in model space.
    if (a.size(-1) > dims)
      throw UserError(source + ": prev_action_chunk has " + std::to_string(a.size(-1)) + " dims per row; this policy's actions have " +
                      std::to_string(dims) + " (send the rows as it returned them)");
  }
  if (bundle.config.data.dataset.adapt_to_pi_enabled()) a = data::aloha_actions_to_pi(a, source + ": prev_action_chunk");
  if (!t.delta_action_mask.empty()) {
    std::vector<torch::Tensor> per;
    for (int64_t b = 0; b < a.size(0); ++b)
      per.push_back(data::delta_actions(a[b], raw_state_BS[b].to(torch::kFloat32), t.delta_action_mask,
                                        source + ": prev_action_chunk"));
    a = torch::stack(per);
  }
  if (mode != data::NormMode::kNone) {
    a = data::normalize(a, bundle.norm_stats.at("actions"), mode, source + ": prev_action_chunk");
    // Finite rows (checked as sent) can still leave float32's range here: values far beyond the policy's
    // action range, or stats with a near-zero scale. Said as such, not as a non-finite value the robot never sent.
    if (const auto bad = torch::logical_not(torch::isfinite(a)).nonzero(); bad.size(0) > 0) {
      const int64_t b = bad[0][0].item<int64_t>(), row = bad[0][1].item<int64_t>(), dim = bad[0][2].item<int64_t>();
      throw UserError(source + ": prev_action_chunk overflows after normalisation: row " + std::to_string(row) +
                      ", dim " + std::to_string(dim) + " is " + c10::str(robot_BRD[b][row][dim].item<double>()) +
                      ", beyond float32's range once normalized with this policy's norm stats; expected actions in "
                      "the robot's range, as this policy returned them");
    }
  }
  if (a.size(-1) > model_dim)
    throw UserError(source + ": prev_action_chunk has " + std::to_string(a.size(-1)) + " dims per row; the model takes at most " +
                    std::to_string(model_dim));
  return data::pad_last_dim(a, model_dim).contiguous();
}

void check_rtc_mode_flag(const std::string& value, const std::string& flag) {
  if (value != "auto" && value != "guided" && value != "trained" && value != "off")
    throw UserError(flag + ": got '" + value + "', expected auto, guided, trained or off");
}

int64_t trained_max_delay(const io::Bundle& bundle) { return bundle.config.train.rtc_max_delay; }

namespace {

std::string dtype_str(const torch::Tensor& t) { return c10::toString(t.scalar_type()); }

// A count sent as an int, 0-d or of one element; a float with no fraction is taken too (a client's np.round() of
// latency × rate gives one).
int64_t whole_number(const torch::Tensor& t, const std::string& key, const std::string& source) {
  const std::string expected = "expected a whole number (an int, 0-d or of one element)";
  if (t.numel() != 1 || t.dim() > 1 || t.scalar_type() == torch::kBool || t.is_complex())
    throw UserError(source + ": '" + key + "' has shape " + shape_str(t.sizes()) + " and dtype " + dtype_str(t) + ", " +
                    expected);
  if (!t.is_floating_point()) return t.reshape({}).item<int64_t>();
  const double v = t.reshape({}).item<double>();
  // Beyond 2^53 a double holds no fractions; such counts are far beyond any horizon anyway.
  if (!(std::isfinite(v) && v == std::round(v) && std::abs(v) < 9.0e15))
    throw UserError(source + ": '" + key + "' is " + c10::str(v) + ", " + expected);
  return static_cast<int64_t>(v);
}

}  // namespace

PreviousChunk previous_chunk(const torch::Tensor& prev_action_chunk, const torch::Tensor& inference_delay,
                             const torch::Tensor& execute_horizon, int64_t batch, const std::string& source) {
  PreviousChunk chunk;
  if (inference_delay.defined()) chunk.delay = whole_number(inference_delay, "inference_delay", source);
  if (execute_horizon.defined()) chunk.execute_horizon = whole_number(execute_horizon, "execute_horizon", source);
  if (!prev_action_chunk.defined()) return chunk;
  const auto& t = prev_action_chunk;
  const bool numbers = t.scalar_type() != torch::kBool && !t.is_complex();
  const bool shaped = (t.dim() == 2 && batch == 1) || (t.dim() == 3 && t.size(0) == batch);
  if (!numbers || !shaped || t.size(-1) < 1)
    throw UserError(source + ": 'prev_action_chunk' has shape " + shape_str(t.sizes()) + " and dtype " + dtype_str(t) +
                    ", expected numbers " +
                    (batch == 1 ? std::string("[R,D] (or [1,R,D])") : "[B,R,D] with B = " + std::to_string(batch)) +
                    ": the rows of the last answer not yet executed, as they were returned");
  data::check_finite(t, source + ": 'prev_action_chunk'");
  chunk.robot_rows = (t.dim() == 2 ? t.unsqueeze(0) : t).to(torch::kFloat32).contiguous();
  return chunk;
}

model::RtcRequest rtc_request(const io::Bundle& bundle, const RtcSettings& settings, const PreviousChunk& chunk,
                              const torch::Tensor& raw_state_BS, const std::string& source) {
  model::RtcRequest r;
  r.guidance = settings.guidance;
  r.delay = chunk.delay;
  r.execute_horizon = chunk.execute_horizon.value_or(-1);  // the model's "all rows"
  if (settings.mode == "off") return r;  // mode stays off: plain sampling
  const int64_t h = bundle.config.model.action_horizon;
  // Checked once the delay is known to be valid; without rows the delay is 0, so the range is 0..H.
  auto check_execute_horizon = [&] {
    if (chunk.execute_horizon && (*chunk.execute_horizon < chunk.delay || *chunk.execute_horizon > h))
      throw UserError(source + ": execute_horizon is " + std::to_string(*chunk.execute_horizon) + "; expected " +
                      std::to_string(chunk.delay) + ".." + std::to_string(h) +
                      " (from inference_delay to the action horizon)");
  };
  if (!chunk.robot_rows.defined()) {
    if (chunk.delay != 0)
      throw UserError(source + ": inference_delay is " + std::to_string(chunk.delay) +
                      " but no prev_action_chunk was given; expected the rows it counts (or no inference_delay)");
    check_execute_horizon();
    return r;
  }
  const auto& rows = chunk.robot_rows;
  if (rows.dim() != 3 || rows.size(1) == 0)
    throw UserError(source + ": prev_action_chunk must hold at least one row of actions");
  // The rows in model space, checked as any request the model takes (finite, the delay within the rows, the rows
  // within the horizon: model::check_rtc_request), before the mode is resolved from the delay.
  r.prev = model_actions(bundle, rows, raw_state_BS, source);
  r.mode = model::RtcMode::kGuided;
  model::check_rtc_request(r, h, bundle.config.model.action_dim, source);
  check_execute_horizon();
  const int64_t trained = trained_max_delay(bundle);
  if (settings.mode == "trained") {
    if (chunk.delay > trained)
      throw UserError(source + ": inference_delay " + std::to_string(chunk.delay) + " is beyond what this policy was trained for (train.rtc_max_delay " +
                      std::to_string(trained) + "); serve with --rtc auto or guided");
    r.mode = model::RtcMode::kTrained;
  } else if (settings.mode == "guided") {
    r.mode = model::RtcMode::kGuided;
  } else {
    // At d = 0 trained mode commits nothing (it is plain sampling); guidance still pulls the soft region towards
    // the previous rows, so the seam stays smooth.
    r.mode = chunk.delay > 0 && chunk.delay <= trained ? model::RtcMode::kTrained : model::RtcMode::kGuided;
  }
  return r;
}

nlohmann::json rtc_metadata(const io::Bundle& bundle, const RtcSettings& settings) {
  const int64_t trained = trained_max_delay(bundle);
  nlohmann::json modes = nlohmann::json::array();
  // pi0-FAST and subtask models refuse a previous chunk (predict): nothing to offer, so clients chunk plainly.
  const bool chunks = !bundle.fast_prompt && !bundle.subtask_tokenizer;
  if (settings.mode != "off" && chunks) {
    if (settings.mode != "trained") modes.push_back("guided");
    if (trained > 0 && settings.mode != "guided") modes.push_back("trained");
  }
  return {{"modes", modes},
          {"default", settings.mode},
          {"trained_max_delay", trained},
          {"guided",
           {{"jacobian", model::to_string(settings.guidance.jacobian)},
            {"schedule", model::to_string(settings.guidance.schedule)},
            {"max_guidance_weight", settings.guidance.max_weight}}},
          {"keys", data::previous_chunk_keys()}};
}

FastActions fast_actions(const io::Bundle& bundle, const torch::Tensor& tokens) {
  PI0_CHECK(bundle.fast_prompt != nullptr, "fast_actions needs a pi0-FAST bundle");
  PI0_CHECK(tokens.dim() == 2 && tokens.scalar_type() == torch::kInt64, "fast_actions: tokens must be [B,N] int64");
  const int64_t D = io::action_dims(bundle);
  auto rows = bundle.fast_prompt->extract_generated_rows(tokens, bundle.config.model.action_horizon,
                                                         std::vector<int64_t>(static_cast<size_t>(tokens.size(0)), D), D);
  return FastActions{std::move(rows.actions), std::move(rows.decodable)};
}

torch::Device model_device(const io::Bundle& bundle) {
  for (const auto& p : bundle.model->parameters()) return p.device();
  return torch::kCPU;
}

Prediction predict(io::Bundle& bundle, const InferenceInputs& inputs, const std::optional<torch::Tensor>& noise,
                   int64_t num_steps, model::SampleTiming* timing, const model::RtcRequest* rtc) {
  const torch::Device device = model_device(bundle);
  std::optional<torch::Tensor> noise_on_device;
  if (noise) noise_on_device = noise->to(device);
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  Prediction out;
  std::optional<model::RtcRequest> rtc_on_device;
  if (rtc && rtc->active()) {
    rtc_on_device = *rtc;
    rtc_on_device->prev = rtc->prev.to(device);
  }
  if (bundle.fast_prompt) {
    // openpi's pi0-FAST: the action tokens as text after the prompt, then the actions decoded from them.
    if (rtc_on_device)
      throw UserError("real-time chunking: not available for a pi0-FAST model (it decodes action tokens); send no "
                      "prev_action_chunk, or use --rtc off");
    PI0_CHECK(inputs.token_ar_mask.defined(), "a pi0-FAST bundle's inputs need token_ar_mask (infer::make_inputs)");
    const auto& mc = bundle.config.model;
    const auto decoded = bundle.model->sample_fast_tokens(inputs.observation.to(device),
                                                          inputs.token_ar_mask.to(device), mc.max_decoding_steps,
                                                          mc.temperature);
    out.fast_tokens = decoded.tokens.to(torch::kCPU).contiguous();
    auto extracted = fast_actions(bundle, out.fast_tokens);
    out.actions = std::move(extracted.actions);
    out.fast_decodable = std::move(extracted.decodable);
  } else if (bundle.subtask_tokenizer) {
    // The pi0.5 paper's inference: the subtask as text first, then the actions conditioned on it.
    if (rtc_on_device)
      throw UserError("real-time chunking: not available for a model trained with train.subtask (it decodes its "
                      "subtask first); send no prev_action_chunk, or use --rtc off");
    const auto& tok = *bundle.subtask_tokenizer;
    const auto& st = bundle.config.train.subtask;
    std::vector<int64_t> cue;
    for (const int id : tok.encode(st.cue)) cue.push_back(id);
    if (cue.empty())
      throw UserError("train.subtask.cue: '" + st.cue + "' has no tokens, expected text the decoding starts after");
    model::Pi0Impl::SubtaskDecoded decoded;
    out.actions = bundle.model->sample_actions_after_subtask(inputs.observation.to(device), cue, st.max_tokens,
                                                             tok.eos_id(), &decoded, noise_on_device, num_steps);
    out.subtask_tokens = decoded.tokens.to(torch::kCPU);
    const auto mask = decoded.mask.to(torch::kCPU);
    for (int64_t b = 0; b < out.subtask_tokens.size(0); ++b) {
      std::vector<int> ids;
      for (int64_t i = static_cast<int64_t>(cue.size()); i < out.subtask_tokens.size(1); ++i) {
        const auto id = out.subtask_tokens[b][i].item<int64_t>();
        if (!mask[b][i].item<bool>() || id == tok.eos_id()) break;
        ids.push_back(static_cast<int>(id));
      }
      out.subtasks.push_back(tok.decode(ids));
    }
  } else {
    out.actions = bundle.model->sample_actions(inputs.observation.to(device), noise_on_device, num_steps,
                                               /*use_kv_cache=*/true, timing, rtc_on_device ? &*rtc_on_device : nullptr);
  }
  out.actions = out.actions.to(torch::kCPU, torch::kFloat32).contiguous();
  out.model_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  out.robot_actions = robot_actions(bundle, out.actions, inputs.raw_state);
  return out;
}

}  // namespace pi0::infer
