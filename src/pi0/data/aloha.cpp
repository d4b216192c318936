#include "pi0/data/aloha.h"

#include <cmath>

#include "pi0/common/check.h"

namespace pi0::data {
namespace {

constexpr double kFlip[kAlohaDims] = {1, -1, -1, 1, 1, 1, 1, 1, -1, -1, 1, 1, 1, 1};
constexpr int64_t kGrippers[2] = {6, 13};

// Constants of the ALOHA / Interbotix code as openpi quotes them.
constexpr double kPuppetGripperPositionOpen = 0.01844, kPuppetGripperPositionClosed = 0.05800;  // linear, metres
constexpr double kArmLength = 0.036, kHornRadius = 0.022;
constexpr double kPi0GripperMin = 0.5476, kPi0GripperMax = 1.6296;   // radians: pi0's normalized (0, 1) range
constexpr double kPuppetJointOpen = -0.6213, kPuppetJointClose = 1.4910;  // ALOHA gripper joint range, radians

double normalize(double x, double lo, double hi) { return (x - lo) / (hi - lo); }
double unnormalize(double x, double lo, double hi) { return x * (hi - lo) + lo; }

double gripper_to_angular(double value) {
  const double linear = unnormalize(value, kPuppetGripperPositionOpen, kPuppetGripperPositionClosed);
  // Inverse of Interbotix's angular → linear conversion.
  double s = (kHornRadius * kHornRadius + linear * linear - kArmLength * kArmLength) / (2 * kHornRadius * linear);
  s = std::min(1.0, std::max(-1.0, s));
  return normalize(std::asin(s), kPi0GripperMin, kPi0GripperMax);
}

double gripper_from_angular(double value) { return normalize(value + kPi0GripperMin, kPuppetJointOpen, kPuppetJointClose); }

double gripper_from_angular_inv(double value) {
  return unnormalize(value, kPuppetJointOpen, kPuppetJointClose) - kPi0GripperMin;
}

// Flip mask on the first 14 dims, then `gripper` elementwise on dims 6 and 13 (computed in float64).
torch::Tensor convert(const torch::Tensor& x, const std::string& what, double (*gripper)(double)) {
  if (x.dim() < 1 || x.size(-1) < kAlohaDims) {
    throw UserError(what + " has " + std::to_string(x.dim() < 1 ? 0 : x.size(-1)) +
                    " dims, expected >= 14 for adapt_to_pi (ALOHA: 2 × (6 joints + gripper)); set "
                    "adapt_to_pi: false for other robots");
  }
  auto y = x.to(torch::kFloat64).contiguous().clone();
  auto flat = y.view({-1, y.size(-1)});
  auto acc = flat.accessor<double, 2>();
  for (int64_t r = 0; r < flat.size(0); ++r) {
    for (int64_t d = 0; d < kAlohaDims; ++d) acc[r][d] *= kFlip[d];
    for (int64_t g : kGrippers) acc[r][g] = gripper(acc[r][g]);
  }
  return y.to(x.scalar_type());
}

}  // namespace

torch::Tensor aloha_state_to_pi(const torch::Tensor& state, const std::string& what) {
  return convert(state, what, gripper_to_angular);
}

torch::Tensor aloha_actions_to_pi(const torch::Tensor& actions, const std::string& what) {
  return convert(actions, what, gripper_from_angular_inv);
}

torch::Tensor aloha_actions_from_pi(const torch::Tensor& actions, const std::string& what) {
  return convert(actions, what, gripper_from_angular);
}

}  // namespace pi0::data
