#include "pi0/model/rtc.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "pi0/common/check.h"

namespace pi0::model {

namespace {
template <class E>
E parse_enum(const std::string& name, const std::string& key, std::initializer_list<std::pair<const char*, E>> values) {
  std::string expected;
  for (const auto& [text, value] : values) {
    if (name == text) return value;
    expected += expected.empty() ? text : std::string(", ") + text;
  }
  throw UserError(key + " must be one of " + expected + " (got '" + name + "')");
}
}  // namespace

RtcMode parse_rtc_mode(const std::string& name, const std::string& key) {
  return parse_enum<RtcMode>(name, key, {{"off", RtcMode::kOff}, {"trained", RtcMode::kTrained},
                                         {"guided", RtcMode::kGuided}});
}
RtcJacobian parse_rtc_jacobian(const std::string& name, const std::string& key) {
  return parse_enum<RtcJacobian>(name, key, {{"identity", RtcJacobian::kIdentity}, {"exact", RtcJacobian::kExact}});
}
RtcSchedule parse_rtc_schedule(const std::string& name, const std::string& key) {
  return parse_enum<RtcSchedule>(name, key, {{"exp", RtcSchedule::kExp}, {"linear", RtcSchedule::kLinear},
                                             {"ones", RtcSchedule::kOnes}, {"zeros", RtcSchedule::kZeros}});
}
std::string to_string(RtcMode mode) {
  switch (mode) {
    case RtcMode::kOff: return "off";
    case RtcMode::kTrained: return "trained";
    case RtcMode::kGuided: return "guided";
  }
  return "?";
}
std::string to_string(RtcJacobian jacobian) { return jacobian == RtcJacobian::kExact ? "exact" : "identity"; }
std::string to_string(RtcSchedule schedule) {
  switch (schedule) {
    case RtcSchedule::kZeros: return "zeros";
    case RtcSchedule::kOnes: return "ones";
    case RtcSchedule::kLinear: return "linear";
    case RtcSchedule::kExp: return "exp";
  }
  return "?";
}

bool RtcRequest::active() const {
  if (mode == RtcMode::kOff || !prev.defined() || prev.size(1) == 0) return false;
  return mode == RtcMode::kGuided || delay > 0;
}

torch::Tensor rtc_prefix_weights(int64_t start, int64_t end, int64_t horizon, RtcSchedule schedule) {
  end = std::clamp<int64_t>(end, 0, horizon);
  start = std::clamp<int64_t>(start, 0, end);
  std::vector<float> w(static_cast<size_t>(horizon), 0.0f);
  const double span = static_cast<double>(end - start + 1);
  for (int64_t i = 0; i < end; ++i) {
    double value = 1.0;
    if (i >= start) {
      const double c = static_cast<double>(end - i) / span;
      switch (schedule) {
        case RtcSchedule::kZeros: value = 0.0; break;
        case RtcSchedule::kOnes: value = 1.0; break;
        case RtcSchedule::kLinear: value = c; break;
        case RtcSchedule::kExp: value = c * std::expm1(c) / (M_E - 1.0); break;
      }
    }
    w[static_cast<size_t>(i)] = static_cast<float>(value);
  }
  return torch::tensor(w, torch::kFloat32);
}

double rtc_guidance_weight(double t, double max_weight) {
  const double denominator = t * (1.0 - t);
  if (!(denominator > 0.0)) return max_weight;
  return std::min(max_weight, (t * t + (1.0 - t) * (1.0 - t)) / denominator);
}

void check_rtc_request(const RtcRequest& rtc, int64_t horizon, int64_t action_dim, const std::string& source) {
  if (rtc.mode == RtcMode::kOff) return;
  if (!rtc.prev.defined()) {
    if (rtc.delay != 0)
      throw UserError(source + ": inference_delay is " + std::to_string(rtc.delay) +
                      " but no prev_action_chunk was given (the delay counts its rows)");
    return;
  }
  const auto& y = rtc.prev;
  if (y.dim() != 3 || y.size(2) != action_dim)
    throw UserError(source + ": prev_action_chunk must be [B,rows," + std::to_string(action_dim) + "] in model space");
  const int64_t rows = y.size(1);
  if (rows > horizon)
    throw UserError(source + ": prev_action_chunk has " + std::to_string(rows) + " rows; at most the action horizon (" +
                    std::to_string(horizon) + ") expected");
  if (rtc.delay < 0 || rtc.delay > rows)
    throw UserError(source + ": inference_delay is " + std::to_string(rtc.delay) + "; expected 0.." +
                    std::to_string(rows) + " (the rows of prev_action_chunk)");
  if (rtc.delay >= horizon)
    throw UserError(source + ": inference_delay is " + std::to_string(rtc.delay) + "; it must be below the action horizon (" +
                    std::to_string(horizon) + ")");
  if (!torch::isfinite(y).all().item<bool>())
    throw UserError(source + ": prev_action_chunk holds a non-finite value (NaN or inf)");
}

std::pair<torch::Tensor, torch::Tensor> rtc_trained_prefix(const RtcRequest& rtc, int64_t horizon,
                                                           const torch::TensorOptions& options) {
  const int64_t b = rtc.prev.size(0), a = rtc.prev.size(2), d = rtc.delay;
  auto prefix = torch::zeros({b, horizon, a}, options);
  auto mask = torch::zeros({b, horizon}, options.dtype(torch::kBool));
  if (d > 0) {
    prefix.narrow(1, 0, d).copy_(rtc.prev.narrow(1, 0, d));
    mask.narrow(1, 0, d).fill_(true);
  }
  return {prefix, mask};
}

torch::Tensor rtc_sample_trained(const VelocityField& v, torch::Tensor x, int64_t num_steps, const torch::Tensor& prefix,
                                 const torch::Tensor& mask, const std::function<void()>& after_step) {
  PI0_CHECK(num_steps > 0, "num_steps must be positive");
  const auto mask3 = mask.unsqueeze(-1);
  const auto zero_time = torch::zeros({}, x.options());
  const float dt = -1.0f / static_cast<float>(num_steps);
  float t = 1.0f;
  for (int64_t step = 0; step < num_steps; ++step) {
    // The committed rows enter every step as the recorded actions at clean time (how the model was trained).
    x = torch::where(mask3, prefix, x);
    const auto time = torch::where(mask, zero_time, torch::full({}, t, x.options()));
    x = x + dt * v(x, time);
    t += dt;
    if (after_step) after_step();
  }
  return torch::where(mask3, prefix, x);
}

torch::Tensor rtc_sample_guided(const VelocityField& v, torch::Tensor x, int64_t num_steps, const torch::Tensor& target,
                                const torch::Tensor& weights, const RtcGuidance& guidance,
                                const std::function<void()>& after_step) {
  PI0_CHECK(num_steps > 0, "num_steps must be positive");
  const auto w_rows = weights.to(x.options()).view({1, -1, 1});
  const auto y = target.to(x.options());
  const int64_t b = x.size(0);
  const float dt = -1.0f / static_cast<float>(num_steps);
  float t = 1.0f;
  for (int64_t step = 0; step < num_steps; ++step) {
    const auto time = torch::full({b}, t, x.options());
    torch::Tensor vel, correction;
    if (guidance.jacobian == RtcJacobian::kExact) {
      // (∂x0̂/∂x)ᵀe = e − t·(∂v/∂x)ᵀe: one backward pass through whatever v computes from x (the action expert;
      // the prefix cache it reads was made without grad, so it is a constant here).
      torch::AutoGradMode grad_on(true);
      auto xg = x.detach().requires_grad_(true);
      vel = v(xg, time);
      auto x0 = xg - t * vel;
      auto err = ((y - x0) * w_rows).detach();
      correction = torch::autograd::grad({x0}, {xg}, {err})[0];
      vel = vel.detach();
    } else {
      vel = v(x, time);
      correction = (y - (x - t * vel)) * w_rows;
    }
    const double w = rtc_guidance_weight(t, guidance.max_weight);
    x = x + dt * (vel - w * correction);
    t += dt;
    if (after_step) after_step();
  }
  return x;
}

torch::Tensor rtc_sample(const VelocityField& v, torch::Tensor x, int64_t num_steps, const RtcRequest& rtc,
                         const std::function<void()>& after_step) {
  PI0_CHECK(rtc.active(), "rtc_sample needs an active request (trained with d > 0, or guided with rows)");
  const int64_t h = x.size(1);
  if (rtc.mode == RtcMode::kTrained) {
    auto [prefix, mask] = rtc_trained_prefix(rtc, h, x.options());
    return rtc_sample_trained(v, std::move(x), num_steps, prefix, mask, after_step);
  }
  const int64_t rows = rtc.prev.size(1);
  auto target = torch::zeros_like(x);
  target.narrow(1, 0, rows).copy_(rtc.prev);
  const int64_t end = std::min(rtc.execute_horizon < 0 ? rows : rtc.execute_horizon, rows);
  const auto weights = rtc_prefix_weights(rtc.delay, end, h, rtc.guidance.schedule);
  return rtc_sample_guided(v, std::move(x), num_steps, target, weights, rtc.guidance, after_step);
}

}  // namespace pi0::model
