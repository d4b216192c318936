// The observation reader: a map of named tensors with openpi's key names (pi0-infer's --obs safetensors file,
// pi0-serve's requests after the robot profile) → the model's Observation, with the training transform's steps
// (resize-with-pad, state normalization, prompt tokenization, padding). Key table: docs/formats.md, "Observation
// files for pi0-infer". Every input is untrusted: each problem is a UserError naming the key (fuzzed by
// fuzz/observation.cpp).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pi0/data/norm_stats.h"
#include "pi0/data/transforms.h"
#include "pi0/model/observation.h"

namespace pi0::data {

class FastPromptTokenizer;
class Tokenizer;

/// What the model expects of an observation (from an inference bundle: infer::make_inputs).
struct ObservationFormat {
  TransformOptions transform;             ///< resolved: image_size, action_dim, max_token_len, norm, model_type
  const NormStats* norm_stats = nullptr;  ///< must hold "state" unless transform.norm_mode() is kNone
  bool adapt_to_pi = false;               ///< state arrives in ALOHA's convention (data.dataset.adapt_to_pi)
  int64_t vocab_size = 0;                 ///< token ids must lie in [0, vocab_size)
  /// pi0-FAST (model_type pi0_fast): a prompt is laid out by it (prompt and state bins, the prefix only) instead of
  /// the plain tokenizer.
  const FastPromptTokenizer* fast_prompt = nullptr;
};

/// Model inputs built from an observation's tensors, plus the raw state kept for unnormalizing.
struct InferenceInputs {
  model::Observation observation;  ///< on CPU
  torch::Tensor raw_state;         ///< [B,S] float32, as given (in pi0's convention when the bundle uses adapt_to_pi)
  /// pi0-FAST only: the ar mask of observation.tokenized_prompt [B,L] bool (all false: the prefix is bidirectional);
  /// undefined otherwise.
  torch::Tensor token_ar_mask;
};

/// Every key an observation may hold: state, image/<camera>, image_mask/<camera>, tokenized_prompt,
/// tokenized_prompt_mask, pi0-infer's noise, actions, time, and previous_chunk_keys() (read by the app, not here).
const std::vector<std::string>& observation_keys();

/// The safetensors metadata key of an observation file's prompt text (pi0-make-example-data --observation-out writes
/// the frame's; pi0-infer tokenizes it when neither --prompt nor tokenized_prompt is given).
inline constexpr const char* kObservationPromptKey = "prompt";

/// Real-time chunking's keys: prev_action_chunk, inference_delay, execute_horizon (infer::previous_chunk reads
/// them, for pi0-infer's observation file and pi0-serve's requests in every robot profile).
const std::vector<std::string>& previous_chunk_keys();

/// Builds the model's observation from `tensors`: images resized with padding to the model's size, absent cameras
/// zero and masked out, state normalized with the stats (and shown to the tokenizer in pi0.5's discrete-state
/// format) then zero-padded to action_dim. `prompt`, when given, is tokenized with `tokenizer` instead of reading
/// tokenized_prompt. UserError, starting with `source` and naming the key, for a key not in observation_keys()
/// (with a did-you-mean: a misspelled image_mask must not silently default the mask to true), a NaN or infinite
/// value in any float tensor, or a missing key, wrong shape, dtype or range.
InferenceInputs read_observation(const std::map<std::string, torch::Tensor>& tensors, const ObservationFormat& format,
                                 const std::string& source, const std::optional<std::string>& prompt,
                                 const Tokenizer* tokenizer);

/// UserError "<what> holds NaN at [i, j], expected finite values" when a float tensor has a NaN or ±Inf.
void check_finite(const torch::Tensor& t, const std::string& what);

}  // namespace pi0::data
