#include "pi0/data/observation_file.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "pi0/common/check.h"
#include "pi0/common/shape_str.h"
#include "pi0/common/strings.h"
#include "pi0/data/aloha.h"
#include "pi0/data/fast_prompt.h"
#include "pi0/data/tokenizer.h"

namespace pi0::data {
namespace {

std::string camera_list() {
  std::string s;
  for (const auto& c : model::kCameraNames) s += (s.empty() ? "" : ", ") + c;
  return s;
}

}  // namespace

// Every key read here or by pi0-infer (noise; actions and time with --loss; a previous chunk).
const std::vector<std::string>& observation_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k = {"state", "tokenized_prompt", "tokenized_prompt_mask", "noise", "actions", "time"};
    for (const auto& cam : model::kCameraNames) k.push_back("image/" + cam);
    for (const auto& cam : model::kCameraNames) k.push_back("image_mask/" + cam);
    for (const auto& key : previous_chunk_keys()) k.push_back(key);
    return k;
  }();
  return keys;
}

const std::vector<std::string>& previous_chunk_keys() {
  static const std::vector<std::string> keys = {"prev_action_chunk", "inference_delay", "execute_horizon"};
  return keys;
}

void check_finite(const torch::Tensor& t, const std::string& what) {
  if (!t.defined() || !t.is_floating_point() || t.numel() == 0) return;
  const torch::Tensor flat = t.reshape({-1});
  const torch::Tensor bad = torch::logical_not(torch::isfinite(flat)).nonzero();
  if (bad.numel() == 0) return;
  int64_t i = bad[0][0].item<int64_t>();
  const double v = flat[i].item<double>();
  std::vector<int64_t> index(static_cast<size_t>(t.dim()));  // the first offending element, as an index
  for (int64_t d = t.dim() - 1; d >= 0; --d) index[static_cast<size_t>(d)] = i % t.size(d), i /= t.size(d);
  std::string at;
  for (size_t d = 0; d < index.size(); ++d) at += (d ? ", " : "") + std::to_string(index[d]);
  throw UserError(what + " holds " + (std::isnan(v) ? std::string("NaN") : v > 0 ? "+Inf" : "-Inf") + " at [" + at +
                  "], expected finite values");
}

namespace {

// A key this reader does not know is an error, never ignored: a misspelled 'image_mazk/base_0_rgb' would otherwise
// leave the mask at its default (true).
void check_keys(const std::map<std::string, torch::Tensor>& tensors, const std::string& source) {
  for (const auto& [key, value] : tensors) {
    const auto& known = observation_keys();
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    const std::string guess = did_you_mean(key, known);
    throw UserError(source + ": unknown key " + quote_value(key, 80) +
                    (guess.empty() ? "" : " (did you mean '" + guess + "'?)") + ", expected one of state, image/<camera>, "
                    "image_mask/<camera>, tokenized_prompt, tokenized_prompt_mask, noise, actions, time, prev_action_chunk, "
                    "inference_delay, execute_horizon with <camera> one of " +
                    camera_list());
  }
}

// One [H,W,3] image (uint8, or float in [-1,1]) → [3,S,S] float in [-1,1], as the training transform does.
torch::Tensor prepare_image(const torch::Tensor& hwc, int64_t size) {
  torch::Tensor u8;
  if (hwc.scalar_type() == torch::kUInt8) {
    u8 = hwc.contiguous();
  } else if (hwc.size(0) == size && hwc.size(1) == size) {
    return hwc.permute({2, 0, 1}).to(torch::kFloat32).contiguous();
  } else {
    // Resizing works on 8-bit images (like openpi's image_tools): quantize, then take the uint8 path.
    u8 = ((hwc.to(torch::kFloat32).clamp(-1, 1) + 1.0f) * 127.5f).round().to(torch::kUInt8).contiguous();
  }
  return image_to_float(resize_with_pad(u8, size));
}

}  // namespace

InferenceInputs read_observation(const std::map<std::string, torch::Tensor>& tensors, const ObservationFormat& format,
                                 const std::string& source, const std::optional<std::string>& prompt,
                                 const Tokenizer* tokenizer) {
  const auto& t = format.transform;
  const int64_t S = t.image_size;
  const auto mode = t.norm_mode();
  auto get = [&](const std::string& key) -> torch::Tensor {
    auto it = tensors.find(key);
    return it == tensors.end() ? torch::Tensor() : it->second;
  };
  check_keys(tensors, source);
  for (const auto& [key, value] : tensors) check_finite(value, source + ": '" + key + "'");
  static const NormStats kNoStats;
  PI0_CHECK(mode == NormMode::kNone || format.norm_stats != nullptr, "read_observation: no norm stats");
  const NormStats& norm_stats = format.norm_stats ? *format.norm_stats : kNoStats;

  // State: [B,S] raw robot state.
  torch::Tensor state = get("state");
  if (!state.defined()) throw UserError(source + ": missing tensor 'state', expected the raw robot state [B,S]");
  if (state.dim() != 2 || !state.is_floating_point())
    throw UserError(source + ": 'state' has shape " + shape_str(state.sizes()) + " and dtype " +
                    std::string(c10::toString(state.scalar_type())) + ", expected a float [B,S] tensor");
  const int64_t B = state.size(0);
  if (B < 1) throw UserError(source + ": 'state' has batch size 0, expected >= 1");
  if (state.size(1) > t.action_dim)
    throw UserError(source + ": 'state' has " + std::to_string(state.size(1)) + " dims, expected <= the model's action_dim " +
                    std::to_string(t.action_dim));
  InferenceInputs in;
  in.raw_state = state.to(torch::kFloat32).contiguous();
  if (format.adapt_to_pi)
    in.raw_state = aloha_state_to_pi(in.raw_state, source + ": 'state' (the bundle was trained with adapt_to_pi)");
  const std::string stats_src = norm_stats.source.empty() ? "norm stats" : norm_stats.source;
  torch::Tensor norm_state =
      mode == NormMode::kNone
          ? in.raw_state
          : normalize(in.raw_state, norm_stats.at("state"), mode, stats_src + ": key norm_stats.state");
  auto& obs = in.observation;
  obs.state = pad_last_dim(norm_state, t.action_dim).to(torch::kFloat32).contiguous();
  // Finite input can still end up infinite: float64 beyond float32's range, or stats with a near-zero scale.
  check_finite(obs.state, source + ": 'state' normalized with " + stats_src + " (a value beyond float32's range?)");

  bool any_image = false;
  for (size_t slot = 0; slot < model::kCameraNames.size(); ++slot) {
    const std::string cam = model::kCameraNames[slot];
    torch::Tensor img = get("image/" + cam), mask = get("image_mask/" + cam);
    if (!img.defined()) {
      if (mask.defined()) throw UserError(source + ": 'image_mask/" + cam + "' given without 'image/" + cam + "'");
      obs.images.push_back(torch::full({B, 3, S, S}, -1.0f));
      obs.image_masks.push_back(torch::full({B}, absent_camera_seen(t.model_type), torch::kBool));
      continue;
    }
    any_image = true;
    if (img.dim() != 4 || img.size(0) != B || img.size(3) != 3 || img.size(1) < 1 || img.size(2) < 1)
      throw UserError(source + ": 'image/" + cam + "' has shape " + shape_str(img.sizes()) + ", expected [B,H,W,3] with B = " +
                      std::to_string(B) + " (channels last, RGB)");
    if (img.scalar_type() != torch::kUInt8 && !img.is_floating_point())
      throw UserError(source + ": 'image/" + cam + "' has dtype " + std::string(c10::toString(img.scalar_type())) +
                      ", expected uint8 or float in [-1,1]");
    if (img.is_floating_point()) {
      const double lo = img.min().item<double>(), hi = img.max().item<double>();
      if (lo < -1.0 - 1e-3 || hi > 1.0 + 1e-3)
        throw UserError(source + ": 'image/" + cam + "' has values in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                        "], expected float images in [-1,1] (or pass uint8)");
    }
    std::vector<torch::Tensor> per;
    for (int64_t b = 0; b < B; ++b) per.push_back(prepare_image(img[b], S));
    obs.images.push_back(torch::stack(per));
    if (mask.defined()) {
      if (mask.dim() != 1 || mask.size(0) != B)
        throw UserError(source + ": 'image_mask/" + cam + "' has shape " + shape_str(mask.sizes()) + ", expected [" +
                        std::to_string(B) + "] bool");
      obs.image_masks.push_back(mask.to(torch::kBool));
    } else {
      obs.image_masks.push_back(torch::ones({B}, torch::kBool));
    }
  }
  if (!any_image) throw UserError(source + ": no 'image/<camera>' tensor, expected at least one of " + camera_list());

  // Prompt: given as text (tokenized here like the training transform) or as tokens.
  torch::Tensor tokens = get("tokenized_prompt"), token_mask = get("tokenized_prompt_mask");
  if (prompt) {
    if (tokens.defined())
      throw UserError(source + ": holds 'tokenized_prompt' and --prompt was given; expected one of the two");
    PI0_CHECK(tokenizer != nullptr || format.fast_prompt != nullptr, "read_observation: --prompt needs a tokenizer");
    const bool discrete_state = t.model_type == "pi05" && t.discrete_state_input;
    std::vector<torch::Tensor> tok, msk, ar;
    for (int64_t b = 0; b < B; ++b) {
      if (format.fast_prompt) {
        // pi0-FAST: "Task: ..., State: <bins of the normalized, unpadded state>;\n", as training laid it out, without
        // the postfix (the model generates it).
        auto ft = format.fast_prompt->tokenize(*prompt, norm_state[b], torch::Tensor(), t.max_token_len);
        tok.push_back(ft.tokens);
        msk.push_back(ft.mask);
        ar.push_back(ft.ar_mask);
        continue;
      }
      auto tp = tokenizer->tokenize(*prompt, t.max_token_len, discrete_state ? norm_state[b] : torch::Tensor());
      tok.push_back(tp.tokens);
      msk.push_back(tp.mask);
    }
    obs.tokenized_prompt = torch::stack(tok);
    obs.tokenized_prompt_mask = torch::stack(msk);
    if (format.fast_prompt) in.token_ar_mask = torch::stack(ar);
  } else {
    if (!tokens.defined())
      throw UserError(source + ": missing 'tokenized_prompt' [B,L] and no --prompt given; expected one of the two");
    if (tokens.dim() != 2 || tokens.size(0) != B || tokens.is_floating_point() || tokens.scalar_type() == torch::kBool)
      throw UserError(source + ": 'tokenized_prompt' has shape " + shape_str(tokens.sizes()) + " and dtype " +
                      std::string(c10::toString(tokens.scalar_type())) + ", expected integer [" + std::to_string(B) + ",L]");
    if (!token_mask.defined() || token_mask.sizes() != tokens.sizes())
      throw UserError(source + ": 'tokenized_prompt_mask' is " +
                      (token_mask.defined() ? "of shape " + shape_str(token_mask.sizes()) : std::string("missing")) +
                      ", expected bool of the tokens' shape " + shape_str(tokens.sizes()));
    const int64_t vocab = format.vocab_size;
    if (tokens.numel() > 0 && (tokens.min().item<int64_t>() < 0 || tokens.max().item<int64_t>() >= vocab))
      throw UserError(source + ": 'tokenized_prompt' holds ids outside [0, " + std::to_string(vocab) +
                      "), expected ids of the bundle's tokenizer");
    obs.tokenized_prompt = tokens.to(torch::kLong).contiguous();
    obs.tokenized_prompt_mask = token_mask.to(torch::kBool).contiguous();
    // pi0-FAST given its tokens: they are the prefix openpi's tokenizer makes (state bins included), bidirectional.
    if (format.fast_prompt) in.token_ar_mask = torch::zeros_like(obs.tokenized_prompt_mask);
  }
  return in;
}

}  // namespace pi0::data
