// Robot profiles: a robot runtime's observation keys → the model's keys that infer::make_inputs reads (the one
// input path of pi0-infer and the trainer's transforms), and the model's robot actions → the robot's dims.
// Mirrors openpi's policies (src/openpi/policies/{libero,aloha,droid}_policy.py):
//   libero  observation/state [8], observation/image + observation/wrist_image (HWC or CHW, uint8 or float in
//           [0,1]), prompt → base_0_rgb, left_wrist_0_rgb (right wrist absent); actions [:, :7]
//   aloha   state [14], images/{cam_high, cam_low, cam_left_wrist, cam_right_wrist} CHW, prompt → cam_high =
//           base, the wrists when present, cam_low dropped (openpi does the same); actions [:, :14]. The joint flips
//           and gripper conversions (adapt_to_pi) are the bundle's: infer::make_inputs / robot_actions apply
//           them when the model was trained with data.dataset.adapt_to_pi (on by default for ALOHA, as openpi).
//   droid   observation/joint_position [7] + observation/gripper_position [1] (concatenated: the state),
//           observation/exterior_image_1_left, observation/wrist_image_left, prompt; actions [:, :8]
//   raw     the model's keys: image/<camera> [H,W,3] (uint8, or float in [-1,1]), image_mask/<camera> (bool),
//           state [S], prompt or tokenized_prompt + tokenized_prompt_mask; a leading batch dim [B,...] is also
//           accepted (the answer then is [B,H,D]); all of the bundle's action dims.
// Float images are converted like openpi's _parse_image: (255·x).astype(uint8) (truncation), CHW → HWC when the
// first dim is 3.
// Every profile also takes real-time chunking's optional keys (data::previous_chunk_keys(), previous_chunk_of):
// prev_action_chunk [R,D] (or [B,R,D] for batched raw requests; an ndarray or a nested list, as kai0's clients
// send ndarray.tolist()), inference_delay and execute_horizon. openpi's clients send none of them.
#pragma once
#include <map>
#include <optional>
#include <string>

#include <torch/torch.h>

#include "pi0/infer/inference.h"
#include "pi0/serve/msgpack_numpy.h"

namespace pi0::serve {

enum class Robot { kLibero, kAloha, kDroid, kRaw };

/// "libero" | "aloha" | "droid" | "raw"; UserError naming --robot otherwise.
Robot parse_robot(const std::string& name);
std::string robot_name(Robot robot);
/// Action dims the robot receives (7, 14, 8); 0 for raw (all of the bundle's).
int64_t robot_action_dims(Robot robot);
/// State dims the profile expects (8, 14, 8); 0 for raw (any).
int64_t robot_state_dims(Robot robot);

/// What infer::make_inputs needs for one request.
struct ModelRequest {
  std::map<std::string, torch::Tensor> tensors;  ///< image/<cam> [B,H,W,3], image_mask/<cam> [B], state [B,S], ...
  std::optional<std::string> prompt;             ///< task text (tokenized with the bundle's tokenizer)
  bool batched = false;                          ///< raw only: the client sent [B,...]; answer [B,H,D]
};

/// The robot's observation → the model's keys. `default_prompt` is used when the frame has no 'prompt'.
/// Throws UserError (one line naming the key, what came and what was expected).
ModelRequest to_model_request(Robot robot, const Fields& fields, const std::optional<std::string>& default_prompt);

/// Real-time chunking's keys of a request, alike in every profile, for the request `model` made of it (its batch);
/// robot_rows undefined when the frame has no prev_action_chunk. Throws UserError (one line naming the key).
infer::PreviousChunk previous_chunk_of(const Fields& fields, const ModelRequest& model);

}  // namespace pi0::serve
