// The model's input batch: what the data pipeline produces and the model consumes (openpi's `Observation`).
// Shapes: B batch, S image side (224 for the released models), L max_token_len, H action_horizon,
// D action_dim (32 for the released models).
#pragma once
#include <array>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace pi0::model {

/// Camera slots in the prefix, in the reference's fixed order.
inline const std::array<std::string, 3> kCameraNames = {"base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"};

struct Observation {
  std::vector<torch::Tensor> images;       ///< one per camera slot, [B,3,S,S] float32 in [-1,1] (NCHW)
  std::vector<torch::Tensor> image_masks;  ///< one per camera slot, [B] bool (false: camera absent)
  torch::Tensor state;                     ///< [B,D] float32, normalized and zero-padded to action_dim
  torch::Tensor tokenized_prompt;          ///< [B,L] int64 token ids (0 = pad)
  torch::Tensor tokenized_prompt_mask;     ///< [B,L] bool, true for real tokens

  int64_t batch_size() const { return state.size(0); }
  /// Moves every tensor to `device`. non_blocking: asynchronous copies from pinned host memory (the caller
  /// keeps the source alive until the stream has consumed them; a later kernel on the stream orders after them).
  Observation to(const torch::Device& device, bool non_blocking = false) const {
    Observation o;
    auto move = [&](const torch::Tensor& t) { return t.to(device, /*non_blocking=*/non_blocking); };
    for (const auto& t : images) o.images.push_back(move(t));
    for (const auto& t : image_masks) o.image_masks.push_back(move(t));
    o.state = move(state);
    o.tokenized_prompt = move(tokenized_prompt);
    o.tokenized_prompt_mask = move(tokenized_prompt_mask);
    return o;
  }
};

/// One training batch: observation plus the normalized, zero-padded target action chunk.
struct Batch {
  Observation observation;
  torch::Tensor actions;  ///< [B,H,D] float32
  /// What train.loss_mask reads (model::action_loss_mask), set by the data pipeline; undefined in batches built by
  /// hand. [B] int64: rows of each chunk that were recorded (the rest repeat the episode's last action), and the
  /// robot's own action dims (the rest are zero padding).
  torch::Tensor action_rows;
  torch::Tensor action_dims;
  /// train.ki (knowledge insulation), else undefined: each example's FAST block, [B,F] int64 PaliGemma token ids
  /// (pg(FAST ids) + "|" + EOS, 0 = pad) and [B,F] bool (data::ProcessedSample::fast_tokens).
  torch::Tensor fast_tokens, fast_mask;
  /// model.type pi0_fast, else undefined: the ar and loss masks of observation.tokenized_prompt, which then holds
  /// openpi's pi0-FAST layout (data::FastPromptTokenizer: prefix ar 0 / loss 0, postfix ar 1 / loss 1). [B,L] bool.
  torch::Tensor token_ar_mask, token_loss_mask;
  /// train.subtask, else undefined: each example's subtask block [B,T] int64 token ids (cue + text + EOS, 0 = pad),
  /// [B,T] bool valid tokens and [B,T] bool cross-entropy targets (data::ProcessedSample::subtask_tokens).
  torch::Tensor subtask_tokens, subtask_mask, subtask_targets;
};

}  // namespace pi0::model
