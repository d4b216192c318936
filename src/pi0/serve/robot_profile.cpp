#include "pi0/serve/robot_profile.h"

#include <algorithm>
#include <sstream>

#include "pi0/common/check.h"
#include "pi0/common/shape_str.h"
#include "pi0/common/strings.h"
#include "pi0/data/observation_file.h"

namespace pi0::serve {
namespace {

constexpr int64_t kMaxImageSide = 4096;  // larger images are a client bug, not a camera

std::string dtype_str(const torch::Tensor& t) { return c10::toString(t.scalar_type()); }

const Field* find(const Fields& fields, const std::string& key) {
  auto it = fields.find(key);
  return it == fields.end() ? nullptr : &it->second;
}

const torch::Tensor& require_tensor(const Fields& fields, const std::string& key, const std::string& expected) {
  const Field* f = find(fields, key);
  if (!f) throw UserError("missing key '" + key + "', expected " + expected);
  if (!f->tensor.defined()) throw UserError("'" + key + "' is text, expected " + expected);
  return f->tensor;
}

// A robot state vector: float, 1-D with `dims` entries (0 = any). Returned as float32 [1,S].
torch::Tensor state_vector(const Fields& fields, const std::string& key, int64_t dims) {
  const std::string expected = "float array [" + (dims > 0 ? std::to_string(dims) : std::string("S")) + "]";
  const auto& t = require_tensor(fields, key, expected);
  if (!t.is_floating_point())
    throw UserError("'" + key + "' has dtype " + dtype_str(t) + ", expected " + expected + " (float32 or float64)");
  if (t.dim() != 1 || (dims > 0 && t.size(0) != dims))
    throw UserError("'" + key + "' has shape " + shape_str(t.sizes()) + ", expected " + expected);
  data::check_finite(t, "'" + key + "'");
  return t.to(torch::kFloat32).unsqueeze(0);
}

// openpi's _parse_image: float → (255·x).astype(uint8); [3,H,W] → [H,W,3]. `chw_only`: ALOHA's always-CHW layout.
// Returned as uint8 [1,H,W,3].
torch::Tensor robot_image(const Fields& fields, const std::string& key, bool chw_only) {
  const std::string expected = chw_only ? "uint8 [3,H,W] (or float in [0,1])" : "uint8 [H,W,3] or [3,H,W] (or float in [0,1])";
  torch::Tensor t = require_tensor(fields, key, "image " + expected);
  if (t.dim() != 3) throw UserError("'" + key + "' has shape " + shape_str(t.sizes()) + ", expected " + expected);
  if (t.scalar_type() != torch::kUInt8 && !t.is_floating_point())
    throw UserError("'" + key + "' has dtype " + dtype_str(t) + ", expected " + expected);
  if (t.is_floating_point()) {
    data::check_finite(t, "'" + key + "'");
    if (t.numel() > 0) {
      const double lo = t.min().item<double>(), hi = t.max().item<double>();
      if (!(lo >= 0.0 && hi <= 1.0))
        throw UserError("'" + key + "' has float values in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                        "], expected [0,1] (or uint8)");
    }
    t = (t.to(torch::kFloat32) * 255.0f).to(torch::kUInt8);  // truncation, as numpy's astype(uint8)
  }
  if (chw_only) {
    if (t.size(0) != 3) throw UserError("'" + key + "' has shape " + shape_str(t.sizes()) + ", expected " + expected);
    t = t.permute({1, 2, 0});
  } else if (t.size(0) == 3) {
    t = t.permute({1, 2, 0});
  }
  if (t.size(2) != 3 || t.size(0) < 1 || t.size(1) < 1 || t.size(0) > kMaxImageSide || t.size(1) > kMaxImageSide)
    throw UserError("'" + key + "' has shape " + shape_str(t.sizes()) + ", expected " + expected + " with sides in [1, " +
                    std::to_string(kMaxImageSide) + "]");
  return t.contiguous().unsqueeze(0);
}

// Offset of the first byte that is not well-formed UTF-8 (overlong forms, surrogates and code points above
// U+10FFFF included), or npos. A prompt sent as bytes is decoded as UTF-8 by openpi (strictly: it raises).
size_t invalid_utf8_at(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    // Continuation bytes after the lead byte, the lead byte's payload, and the smallest code point of that length.
    const size_t n = (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : 0;
    if (n == 0) return i;
    uint32_t cp = c & (0x3F >> n);
    const uint32_t min = n == 1 ? 0x80 : n == 2 ? 0x800 : 0x10000;
    for (size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return i;
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += n + 1;
  }
  return std::string::npos;
}

std::optional<std::string> prompt_of(const Fields& fields, const std::optional<std::string>& default_prompt,
                                     bool required) {
  const Field* f = find(fields, "prompt");
  if (f) {
    if (!f->text)
      throw UserError("'prompt' is an array or number, expected a str (the task instruction), bytes (UTF-8) or a "
                      "numpy text array of one element");
    if (const size_t at = invalid_utf8_at(*f->text); at != std::string::npos)
      throw UserError("'prompt' is not UTF-8 text (byte " + std::to_string(at) + " of " + std::to_string(f->text->size()) +
                      "), expected the task instruction in UTF-8");
    return f->text;
  }
  if (default_prompt) return default_prompt;
  if (required) throw UserError("missing key 'prompt', expected a str (the task instruction); or start the server with --default-prompt");
  return std::nullopt;
}

ModelRequest libero(const Fields& fields, const std::optional<std::string>& default_prompt) {
  ModelRequest r;
  r.tensors["state"] = state_vector(fields, "observation/state", 8);
  r.tensors["image/base_0_rgb"] = robot_image(fields, "observation/image", false);
  r.tensors["image/left_wrist_0_rgb"] = robot_image(fields, "observation/wrist_image", false);
  r.prompt = prompt_of(fields, default_prompt, true);
  return r;
}

ModelRequest aloha(const Fields& fields, const std::optional<std::string>& default_prompt) {
  static const std::vector<std::string> kCameras = {"cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist"};
  for (const auto& [key, f] : fields) {
    if (key.rfind("images/", 0) != 0) continue;
    const std::string cam = key.substr(7);
    if (std::find(kCameras.begin(), kCameras.end(), cam) == kCameras.end())
      throw UserError("'" + key + "': unknown ALOHA camera '" + cam + "', expected cam_high, cam_low, cam_left_wrist or cam_right_wrist");
  }
  ModelRequest r;
  r.tensors["state"] = state_vector(fields, "state", 14);
  r.tensors["image/base_0_rgb"] = robot_image(fields, "images/cam_high", true);
  if (find(fields, "images/cam_left_wrist")) r.tensors["image/left_wrist_0_rgb"] = robot_image(fields, "images/cam_left_wrist", true);
  if (find(fields, "images/cam_right_wrist")) r.tensors["image/right_wrist_0_rgb"] = robot_image(fields, "images/cam_right_wrist", true);
  if (find(fields, "images/cam_low")) robot_image(fields, "images/cam_low", true);  // checked, not used by pi0
  r.prompt = prompt_of(fields, default_prompt, true);
  return r;
}

ModelRequest droid(const Fields& fields, const std::optional<std::string>& default_prompt) {
  ModelRequest r;
  r.tensors["state"] = torch::cat({state_vector(fields, "observation/joint_position", 7),
                                   state_vector(fields, "observation/gripper_position", 1)}, 1);
  r.tensors["image/base_0_rgb"] = robot_image(fields, "observation/exterior_image_1_left", false);
  r.tensors["image/left_wrist_0_rgb"] = robot_image(fields, "observation/wrist_image_left", false);
  r.prompt = prompt_of(fields, default_prompt, true);
  return r;
}

ModelRequest raw(const Fields& fields, const std::optional<std::string>& default_prompt) {
  ModelRequest r;
  const auto& state = require_tensor(fields, "state", "float array [S] (or [B,S])");
  if (state.dim() != 1 && state.dim() != 2)
    throw UserError("'state' has shape " + shape_str(state.sizes()) + ", expected float array [S] (or [B,S])");
  r.batched = state.dim() == 2;
  for (const auto& [key, f] : fields) {
    if (key == "prompt") continue;
    const bool known = key == "state" || key == "tokenized_prompt" || key == "tokenized_prompt_mask" ||
                       key.rfind("image/", 0) == 0 || key.rfind("image_mask/", 0) == 0;
    if (!known) continue;  // extra keys are ignored, as openpi's transforms do
    if (!f.tensor.defined()) throw UserError("'" + key + "' is text, expected an array");
    data::check_finite(f.tensor, "'" + key + "'");
    const bool is_image = key.rfind("image/", 0) == 0;
    if (is_image) {
      const int64_t hw = r.batched ? 1 : 0;
      if (f.tensor.dim() == (r.batched ? 4 : 3) &&
          (f.tensor.size(hw) > kMaxImageSide || f.tensor.size(hw + 1) > kMaxImageSide))
        throw UserError("'" + key + "' has shape " + shape_str(f.tensor.sizes()) + ", expected sides <= " +
                        std::to_string(kMaxImageSide));
    }
    r.tensors[key] = r.batched ? f.tensor : f.tensor.unsqueeze(0);
  }
  r.prompt = find(fields, "tokenized_prompt") ? prompt_of(fields, std::nullopt, false)
                                              : prompt_of(fields, default_prompt, true);
  return r;
}

// Keys a profile does not use are ignored (openpi's clients send extras), but one within a typo of a key it does use
// is an error: a misspelled optional key ('image_mazk/base_0_rgb', 'images/cam_left_wirst') would silently drop it.
void check_near_misses(Robot robot, const Fields& fields) {
  std::vector<std::string> used = {"prompt"};
  switch (robot) {
    case Robot::kLibero:
      used.insert(used.end(), {"observation/state", "observation/image", "observation/wrist_image"});
      break;
    case Robot::kAloha:
      used.insert(used.end(), {"state", "images/cam_high", "images/cam_low", "images/cam_left_wrist", "images/cam_right_wrist"});
      break;
    case Robot::kDroid:
      used.insert(used.end(), {"observation/joint_position", "observation/gripper_position",
                               "observation/exterior_image_1_left", "observation/wrist_image_left"});
      break;
    case Robot::kRaw:
      used = data::observation_keys();
      used.push_back("prompt");
      break;
  }
  used.insert(used.end(), data::previous_chunk_keys().begin(), data::previous_chunk_keys().end());
  for (const auto& [key, f] : fields) {
    if (std::find(used.begin(), used.end(), key) != used.end()) continue;
    if (robot == Robot::kAloha && key.rfind("images/", 0) == 0) continue;  // aloha() names the unknown camera
    const std::string guess = did_you_mean(key, used);
    if (!guess.empty())
      throw UserError("unknown key " + quote_value(key, 80) + " (did you mean '" + guess + "'?) for --robot " +
                      robot_name(robot) + ", expected its keys (docs/serving.md, Robot profiles)");
  }
}

}  // namespace

Robot parse_robot(const std::string& name) {
  if (name == "libero") return Robot::kLibero;
  if (name == "aloha") return Robot::kAloha;
  if (name == "droid") return Robot::kDroid;
  if (name == "raw") return Robot::kRaw;
  throw UserError("--robot: got '" + name + "', expected libero, aloha, droid or raw");
}

std::string robot_name(Robot robot) {
  switch (robot) {
    case Robot::kLibero: return "libero";
    case Robot::kAloha: return "aloha";
    case Robot::kDroid: return "droid";
    case Robot::kRaw: return "raw";
  }
  return "?";
}

int64_t robot_action_dims(Robot robot) {
  switch (robot) {
    case Robot::kLibero: return 7;
    case Robot::kAloha: return 14;
    case Robot::kDroid: return 8;
    case Robot::kRaw: return 0;
  }
  return 0;
}

int64_t robot_state_dims(Robot robot) {
  switch (robot) {
    case Robot::kLibero: return 8;
    case Robot::kAloha: return 14;
    case Robot::kDroid: return 8;
    case Robot::kRaw: return 0;
  }
  return 0;
}

ModelRequest to_model_request(Robot robot, const Fields& fields, const std::optional<std::string>& default_prompt) {
  check_near_misses(robot, fields);
  switch (robot) {
    case Robot::kLibero: return libero(fields, default_prompt);
    case Robot::kAloha: return aloha(fields, default_prompt);
    case Robot::kDroid: return droid(fields, default_prompt);
    case Robot::kRaw: return raw(fields, default_prompt);
  }
  PI0_CHECK(false, "to_model_request: unknown robot");
}

infer::PreviousChunk previous_chunk_of(const Fields& fields, const ModelRequest& model) {
  std::vector<torch::Tensor> given;
  for (const auto& key : data::previous_chunk_keys()) {
    const Field* f = find(fields, key);
    if (f && !f->tensor.defined())
      throw UserError("'" + key + "' is text, expected " +
                      (key == "prev_action_chunk" ? "an array of numbers [R,D]" : "an int"));
    given.push_back(f ? f->tensor : torch::Tensor());
  }
  return infer::previous_chunk(given[0], given[1], given[2], model.tensors.at("state").size(0), "observation");
}

}  // namespace pi0::serve
