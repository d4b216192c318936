// Inference with a loaded bundle (io/bundle.h): the one path from an observation to a robot's actions that
// pi0-infer and pi0-serve both run, so the server answers what pi0-infer answers.
//
//   observation tensors (openpi key names, raw robot state)
//     → make_inputs: the training transform's steps (data/observation_file.h: resize-with-pad, state
//       normalization, prompt tokenization, padding) with the bundle's norm stats, adapt_to_pi and vocabulary
//     → predict: sample_actions on the model's device, model-space actions back on the CPU in float32,
//     → robot_actions: openpi's output transforms (Unnormalize, AbsoluteActions, AlohaOutputs).
//
// What stays with the programs: reading the observation file or the websocket frame (robot profiles), batching
// requests (serve/policy.h), and writing or sending the result.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pi0/data/observation_file.h"
#include "pi0/io/bundle.h"
#include "pi0/model/pi0.h"
#include "pi0/model/rtc.h"

namespace pi0::data {
class Tokenizer;
}

namespace pi0::infer {

using data::InferenceInputs;

/// data::read_observation with the bundle's transform, norm stats, adapt_to_pi and vocabulary. `source` (the file
/// path, or "observation" for a request) starts every error message; `tokenizer` is needed only with `prompt`.
InferenceInputs make_inputs(const io::Bundle& bundle, const std::map<std::string, torch::Tensor>& tensors,
                            const std::string& source, const std::optional<std::string>& prompt,
                            const data::Tokenizer* tokenizer);

/// Model-space actions [B,H,A] → robot actions [B,H,D] (D = dim of the norm stats' `actions`): unnormalized with
/// the bundle's stats and, if the model was trained on delta actions (data.delta_action_mask), made absolute
/// again w.r.t. `raw_state_BS` [B,S], then converted back to ALOHA's convention when the model was trained with
/// data.dataset.adapt_to_pi (openpi's output transforms: Unnormalize, AbsoluteActions, AlohaOutputs).
torch::Tensor robot_actions(const io::Bundle& bundle, const torch::Tensor& actions_BHA,
                            const torch::Tensor& raw_state_BS);

/// Robot actions [B,R,D] (rows of an earlier answer, as robot_actions() gave them) → model space [B,R,A]: the inverse
/// of robot_actions — ALOHA's convention back to pi0's, delta actions re-anchored to `raw_state_BS` (the state of
/// the observation being answered, so the rows become deltas from where the robot is now), normalized with the
/// bundle's stats, zero-padded to the model's action dim. UserError naming `source` for a wrong width.
torch::Tensor model_actions(const io::Bundle& bundle, const torch::Tensor& robot_BRD, const torch::Tensor& raw_state_BS,
                            const std::string& source);

/// Real-time chunking settings of pi0-infer and pi0-serve (their --rtc* flags; docs/serving.md).
struct RtcSettings {
  std::string mode = "auto";  ///< auto (trained when the bundle was trained for the asked delay d > 0, else guided) |
                              ///< guided | trained | off
  model::RtcGuidance guidance;
};
/// --rtc's value checked: auto, guided, trained or off (UserError naming `flag` otherwise).
void check_rtc_mode_flag(const std::string& value, const std::string& flag);

/// The largest delay the bundle's model was trained to continue (its config's train.rtc_max_delay; 0: none).
int64_t trained_max_delay(const io::Bundle& bundle);

/// A previous chunk as a robot sends it: the rows of the last answer it has not executed when it captured this
/// observation (robot units, row 0 next), how many of them execute before this answer arrives, and the end of
/// guided mode's soft region.
struct PreviousChunk {
  torch::Tensor robot_rows;  ///< [B,R,D] float32
  int64_t delay = 0;
  /// Absent: all rows given. The default is the key's absence, never a value: a client cannot send it by mistake.
  std::optional<int64_t> execute_horizon;
};

/// A PreviousChunk from the tensors of an observation's data::previous_chunk_keys() (undefined: the key is absent):
/// `prev_action_chunk` numbers [R,D] (a batch of 1) or [batch,R,D]; `inference_delay` (absent: 0) and
/// `execute_horizon` (absent: nullopt) whole numbers, 0-d or of one element. UserError starting with `source` and naming the key for a wrong shape or type or a
/// non-finite row; the values against each other, the horizon and the policy are rtc_request's to check.
PreviousChunk previous_chunk(const torch::Tensor& prev_action_chunk, const torch::Tensor& inference_delay,
                             const torch::Tensor& execute_horizon, int64_t batch, const std::string& source);

/// The model's request for `chunk` under `settings`: checked (UserError naming `source`: wrong dims, non-finite
/// rows or rows that overflow once normalized, a delay beyond the rows or the horizon, an execute_horizon outside
/// inference_delay..H, with rows or without, trained mode beyond the bundle's trained delay), mapped to model
/// space with `raw_state_BS`, its mode resolved (auto: trained when trained_max_delay ≥ delay > 0, else guided).
model::RtcRequest rtc_request(const io::Bundle& bundle, const RtcSettings& settings, const PreviousChunk& chunk,
                              const torch::Tensor& raw_state_BS, const std::string& source);

/// What a server announces: {"modes": [...], "default": mode, "trained_max_delay": D, "guided": {"jacobian",
/// "schedule", "max_guidance_weight"}, "keys": [observation keys read]}.
nlohmann::json rtc_metadata(const io::Bundle& bundle, const RtcSettings& settings);

/// One action chunk, as the model gave it and as the robot takes it.
struct Prediction {
  torch::Tensor actions;        ///< [B,H,A] float32, contiguous, on the CPU: sample_actions' output (model space)
  torch::Tensor robot_actions;  ///< [B,H,D] float32, contiguous, on the CPU: robot_actions() of it
  double model_ms = 0;          ///< wall time of sample_actions, the inputs' copy to the device and the result's back
  /// A bundle trained with train.subtask: per example the subtask it decoded first (the text between the cue and
  /// EOS) and the block's ids [B,T] (cue included, 0 after the end); empty / undefined otherwise.
  std::vector<std::string> subtasks;
  torch::Tensor subtask_tokens;
  /// A pi0-FAST bundle: the generated tokens [B,steps] int64 (0 after the all-rows EOS stop) and, per example,
  /// whether they held actions: the "Action: " marker and a FAST sequence of H·D coefficients. A row without them
  /// gets zero actions in model space (openpi's fallback, unnormalized like any other), so a robot can tell.
  torch::Tensor fast_tokens;
  std::vector<bool> fast_decodable;
};

/// A pi0-FAST bundle's generated tokens [B,N] int64 (any device) → model-space actions [B,H,D] float32 on the CPU
/// (D = io::action_dims) by openpi's text round trip (data::FastPromptTokenizer::extract_actions), and per
/// row whether they held actions ("Action: " and H·D coefficients; zeros otherwise, openpi's fallback).
struct FastActions {
  torch::Tensor actions;
  std::vector<bool> decodable;
};
FastActions fast_actions(const io::Bundle& bundle, const torch::Tensor& tokens);

/// The device the bundle's model is on (io::load_bundle's `device`).
torch::Device model_device(const io::Bundle& bundle);

/// `inputs` (of one request, or of several concatenated along the batch) through the bundle's model:
/// sample_actions with `num_steps` Euler steps and the prefix KV cache, from `noise` [B,H,A] (any device; nullopt:
/// drawn by the model), then robot_actions(). `timing`: per-step times of sample_actions (model/pi0.h). The
/// bundle is not const: sampling may capture a CUDA graph in its model (Pi0Impl::set_cuda_graph).
/// `rtc` (rtc_request's, with the same batch as `inputs`): real-time chunking; null or inactive: plain sampling.
/// A bundle trained with train.subtask first decodes the subtask greedily (its config's cue and max_tokens, EOS ends
/// it), then samples after it (Pi0Impl::sample_actions_after_subtask; no timing, no real-time chunking).
/// A pi0-FAST bundle decodes tokens instead (Pi0Impl::sample_fast_tokens: its config's max_decoding_steps and
/// temperature; `noise`, `num_steps`, `timing` and `rtc` take no part) and extracts each row's actions [H,D] by
/// openpi's text round trip (data::FastPromptTokenizer::extract_actions).
Prediction predict(io::Bundle& bundle, const InferenceInputs& inputs, const std::optional<torch::Tensor>& noise,
                   int64_t num_steps, model::SampleTiming* timing = nullptr, const model::RtcRequest* rtc = nullptr);

}  // namespace pi0::infer
