// Real-time chunking (RTC): the next action chunk is sampled while the robot still executes the previous one, and
// is made to continue it. ../shared/docs/rtc-reference.md has the sources; formulas here are in openpi's time
// convention (t from 1 = noise to 0 = data, v = noise − actions, x += dt·v with dt = −1/n).
//
//   prev  Y [B,R,A]: the previous chunk's rows still to execute when this observation was taken, row 0 next, in
//         model space (normalized, zero-padded to A). The answer's rows 0..d−1 correspond to Y's rows 0..d−1 (they
//         execute while the answer is computed); the robot continues at row d.
//   trained (Black, Ren, Equi, Levine 2025): rows < d of x are set to Y with clean time (t = 0) at every Euler
//         step and once more at the end. Needs a model trained with train.rtc_max_delay ≥ d; costs nothing extra.
//   guided (Black, Galliker, Levine 2025, Eq. 2–5): each step's velocity is corrected towards Y:
//         x0̂ = x − t·v,  e = W ⊙ (Y − x0̂),  g = e − t·(∂v/∂x)ᵀe (exact) or g = e (identity),
//         v' = v − w(t)·g,  w(t) = min(β, (t² + (1−t)²) / (t(1−t))) (β at t = 1).
//         W is the soft mask over rows: 1 below d, a ramp down to 0 at `execute_horizon`, 0 after it.
//         The exact product is one backward pass of the action expert per step (the prefix KV cache is a
//         constant); identity is LeRobot's form (its RTCProcessor takes the gradient of x0̂ through x only).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include <torch/torch.h>

namespace pi0::model {

enum class RtcMode { kOff, kTrained, kGuided };
enum class RtcJacobian { kIdentity, kExact };
/// The soft mask's ramp between d and the end (rtc-reference.md 2.3): kExp is P1's Eq. 5 (its best in Fig. 8),
/// kLinear LeRobot's default, kOnes 1 up to the end, kZeros hard masking (1 below d only).
enum class RtcSchedule { kZeros, kOnes, kLinear, kExp };

/// "off" | "trained" | "guided" (UserError naming `key` otherwise).
RtcMode parse_rtc_mode(const std::string& name, const std::string& key);
RtcJacobian parse_rtc_jacobian(const std::string& name, const std::string& key);
RtcSchedule parse_rtc_schedule(const std::string& name, const std::string& key);
std::string to_string(RtcMode mode);
std::string to_string(RtcJacobian jacobian);
std::string to_string(RtcSchedule schedule);

/// Guided mode's defaults: LeRobot's β = 10 (its docs call it the best for 10-step flow matching), P1's exp ramp,
/// and the identity Jacobian (no backward pass; users report it behaves better than the exact product).
struct RtcGuidance {
  RtcJacobian jacobian = RtcJacobian::kIdentity;
  RtcSchedule schedule = RtcSchedule::kExp;
  double max_weight = 10.0;  ///< β
};

/// One call's real-time chunking: what the previous chunk left and how to use it.
struct RtcRequest {
  RtcMode mode = RtcMode::kOff;
  torch::Tensor prev;           ///< Y [B,R,A] float, model space, R ≥ delay rows (R ≤ H)
  int64_t delay = 0;            ///< d
  int64_t execute_horizon = -1; ///< end row of the soft region (guided); −1: R. Clipped to [d, min(R, H)]
  RtcGuidance guidance;
  /// Whether sampling differs from plain sampling at all (off, no rows, or trained with d = 0: it does not).
  bool active() const;
};

/// W [H] float32: 1 for i < start, the schedule's ramp for start ≤ i < end, 0 for i ≥ end, with
/// c_i = (end − i) / (end − start + 1) (linear: c_i; exp: c_i·(e^{c_i} − 1)/(e − 1)). start is clipped to end.
torch::Tensor rtc_prefix_weights(int64_t start, int64_t end, int64_t horizon, RtcSchedule schedule);

/// w(t) = min(β, (t² + (1 − t)²) / (t (1 − t))), β where the fraction is infinite (t = 1 or t = 0).
double rtc_guidance_weight(double t, double max_weight);

/// v(x, t): x [B,H,A], t [B] (one time per example) or [B,H] (one per action token, trained mode) → v [B,H,A].
using VelocityField = std::function<torch::Tensor(const torch::Tensor& x, const torch::Tensor& t)>;

/// Euler integration from t = 1 to 0 in `num_steps` steps under `rtc` (must be active()): trained or guided.
/// `after_step` (when given) runs after each step. The exact Jacobian differentiates `v` with respect to x (it is
/// called with x requiring grad, inside grad mode). Returns the final x [B,H,A].
torch::Tensor rtc_sample(const VelocityField& v, torch::Tensor x, int64_t num_steps, const RtcRequest& rtc,
                         const std::function<void()>& after_step = {});

/// The two loops rtc_sample dispatches to, on precomputed inputs (what a captured CUDA graph reads from fixed
/// buffers). Trained: `prefix` [B,H,A] (Y's rows < d, zeros after), `mask` [B,H] bool (rows < d). Guided: `target`
/// [B,H,A] (Y zero-padded to H rows), `weights` [H] (rtc_prefix_weights).
torch::Tensor rtc_sample_trained(const VelocityField& v, torch::Tensor x, int64_t num_steps, const torch::Tensor& prefix,
                                 const torch::Tensor& mask, const std::function<void()>& after_step = {});
torch::Tensor rtc_sample_guided(const VelocityField& v, torch::Tensor x, int64_t num_steps, const torch::Tensor& target,
                                const torch::Tensor& weights, const RtcGuidance& guidance,
                                const std::function<void()>& after_step = {});

/// Checks a request against a horizon H and action dim A; UserError naming `source`: d < 0, d > rows given, rows
/// beyond H, wrong width, non-finite rows.
void check_rtc_request(const RtcRequest& rtc, int64_t horizon, int64_t action_dim, const std::string& source);

/// Trained mode's inputs: Y's first d rows in a zero [B,H,A] tensor, and the [B,H] bool mask of those rows.
std::pair<torch::Tensor, torch::Tensor> rtc_trained_prefix(const RtcRequest& rtc, int64_t horizon,
                                                           const torch::TensorOptions& options);

}  // namespace pi0::model
