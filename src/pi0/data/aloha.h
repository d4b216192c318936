// ALOHA in the convention pi0 was pre-trained in (openpi aloha_policy.py, `adapt_to_pi=True`, which every openpi
// ALOHA recipe uses). ALOHA records 14 dims [left arm 6 joints, left gripper, right arm 6, right gripper]:
//   - some joints turn the other way: multiply by the flip mask [1,-1,-1,1,1,1,1, 1,-1,-1,1,1,1,1];
//   - the gripper (dims 6 and 13) is a normalized *linear* finger position on ALOHA; pi0 saw an angular one.
// State:   flip, then gripper linear → angular (openpi _decode_state / _gripper_to_angular).
// Actions: flip, then gripper via _gripper_from_angular_inv (openpi AlohaInputs._encode_actions_inv).
// Inverse on the model's actions at inference: flip, then _gripper_from_angular (AlohaOutputs._encode_actions).
// Applied first, before delta actions and normalization (norm stats are computed on adapted values, as openpi's
// compute_norm_stats runs the data transforms). Dims past 14 pass through unchanged.
#pragma once
#include <string>

#include <torch/torch.h>

namespace pi0::data {

constexpr int64_t kAlohaDims = 14;

/// State [...,S] (S >= 14) in ALOHA's convention → pi0's. `what` names the data in the error for S < 14.
torch::Tensor aloha_state_to_pi(const torch::Tensor& state, const std::string& what);
/// Actions [...,A] (A >= 14) recorded on ALOHA → the model's training targets.
torch::Tensor aloha_actions_to_pi(const torch::Tensor& actions, const std::string& what);
/// Inverse of aloha_actions_to_pi: the model's actions → commands for ALOHA.
torch::Tensor aloha_actions_from_pi(const torch::Tensor& actions, const std::string& what);

}  // namespace pi0::data
