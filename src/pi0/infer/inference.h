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

#include <torch/torch.h>

#include "pi0/data/observation_file.h"
#include "pi0/io/bundle.h"
#include "pi0/model/pi0.h"

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

/// One action chunk, as the model gave it and as the robot takes it.
struct Prediction {
  torch::Tensor actions;        ///< [B,H,A] float32, contiguous, on the CPU: sample_actions' output (model space)
  torch::Tensor robot_actions;  ///< [B,H,D] float32, contiguous, on the CPU: robot_actions() of it
  double model_ms = 0;          ///< wall time of sample_actions, the inputs' copy to the device and the result's back
};

/// The device the bundle's model is on (io::load_bundle's `device`).
torch::Device model_device(const io::Bundle& bundle);

/// `inputs` (of one request, or of several concatenated along the batch) through the bundle's model:
/// sample_actions with `num_steps` Euler steps and the prefix KV cache, from `noise` [B,H,A] (any device; nullopt:
/// drawn by the model), then robot_actions(). `timing`: per-step times of sample_actions (model/pi0.h). The
/// bundle is not const: sampling may capture a CUDA graph in its model (Pi0Impl::set_cuda_graph).
Prediction predict(io::Bundle& bundle, const InferenceInputs& inputs, const std::optional<torch::Tensor>& noise,
                   int64_t num_steps, model::SampleTiming* timing = nullptr);

}  // namespace pi0::infer
