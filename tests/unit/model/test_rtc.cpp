// Real-time chunking (model/rtc.h): the soft mask and guidance weight against the values of
// ../shared/docs/rtc-reference.md (2.2, 2.3), per-token flow time against the scalar path, training-time delays, and
// the invariants of sampling: inactive requests are plain sampling bit for bit, trained mode returns the committed
// rows, guidance pulls the committed rows towards the previous chunk.
#include <catch2/catch.hpp>

#include <cmath>

#include "pi0/common/check.h"
#include "pi0/model/flow_matching.h"
#include "pi0/model/pi0.h"
#include "pi0/model/rtc.h"
#include "support/perturbed_model.h"
#include "support/test_support.h"

using namespace pi0;
using namespace pi0::model;

namespace {
using testing::perturbed_model;

// A perturbed tiny model, a batch of 2, fixed noise and a previous chunk of 3 rows (the horizon is 4).
struct SamplingCase {
  Pi0Options o;
  Pi0 model;
  Observation obs;
  torch::Tensor noise, prev;
  explicit SamplingCase(bool pi05)
      : o(dummy_options(pi05)),
        model(perturbed_model(o)),
        obs(testing::random_observation(o, 2)),
        noise(torch::randn({2, o.action_horizon, o.action_dim})),
        prev(torch::randn({2, 3, o.action_dim})) {}
  torch::Tensor sample(int64_t steps, const RtcRequest* rtc = nullptr, SampleTiming* timing = nullptr) {
    return model->sample_actions(obs, noise, steps, true, timing, rtc);
  }
};

RtcRequest request(RtcMode mode, const torch::Tensor& prev, int64_t delay, int64_t horizon_end = -1) {
  RtcRequest r;
  r.mode = mode;
  r.prev = prev;
  r.delay = delay;
  r.execute_horizon = horizon_end;
  return r;
}
}  // namespace

TEST_CASE("rtc: the soft mask equals the reference's exp and linear ramps", "[unit][model][rtc]") {
  // H = 50, d = 4, end = 10 (rtc-reference.md 2.3, printed there to 3 decimals).
  const auto exp_w = rtc_prefix_weights(4, 10, 50, RtcSchedule::kExp);
  const std::vector<double> exp_ref = {1, 1, 1, 1, .677, .433, .256, .133, .055, .013};
  const auto lin_w = rtc_prefix_weights(4, 10, 50, RtcSchedule::kLinear);
  const std::vector<double> lin_ref = {1, 1, 1, 1, .857, .714, .571, .429, .286, .143};
  REQUIRE(exp_w.size(0) == 50);
  for (size_t i = 0; i < exp_ref.size(); ++i) {
    INFO("row " << i);
    CHECK(exp_w[static_cast<int64_t>(i)].item<double>() == Approx(exp_ref[i]).margin(5e-4));
    CHECK(lin_w[static_cast<int64_t>(i)].item<double>() == Approx(lin_ref[i]).margin(5e-4));
  }
  CHECK(exp_w.narrow(0, 10, 40).abs().sum().item<double>() == 0.0);
  // Hard masking keeps only the committed rows; ones keeps everything up to the end; start is clipped to the end.
  CHECK(rtc_prefix_weights(4, 10, 50, RtcSchedule::kZeros).sum().item<double>() == 4.0);
  CHECK(rtc_prefix_weights(4, 10, 50, RtcSchedule::kOnes).sum().item<double>() == 10.0);
  CHECK(rtc_prefix_weights(12, 10, 50, RtcSchedule::kExp).sum().item<double>() == 10.0);
  CHECK(rtc_prefix_weights(0, 0, 50, RtcSchedule::kExp).abs().sum().item<double>() == 0.0);
}

TEST_CASE("rtc: the guidance weight equals the reference's values for beta 10 and 5", "[unit][model][rtc]") {
  // t = 1.0, 0.9, ..., 0.1 (rtc-reference.md 2.2).
  const std::vector<double> b10 = {10, 9.111, 4.25, 2.762, 2.167, 2.0, 2.167, 2.762, 4.25, 9.111};
  const std::vector<double> b5 = {5, 5, 4.25, 2.762, 2.167, 2.0, 2.167, 2.762, 4.25, 5};
  for (int i = 0; i < 10; ++i) {
    const double t = 1.0 - 0.1 * i;
    INFO("t = " << t);
    CHECK(rtc_guidance_weight(t, 10.0) == Approx(b10[static_cast<size_t>(i)]).margin(1e-3));
    CHECK(rtc_guidance_weight(t, 5.0) == Approx(b5[static_cast<size_t>(i)]).margin(1e-3));
  }
  CHECK(rtc_guidance_weight(0.0, 3.0) == 3.0);
}

TEST_CASE("rtc: a uniform per-token time equals the scalar time path", "[unit][model][rtc]") {
  for (bool pi05 : {false, true}) {
    INFO("pi05=" << pi05);
    auto o = dummy_options(pi05);
    auto model = perturbed_model(o);
    auto obs = testing::random_observation(o, 3);
    auto actions = torch::randn({3, o.action_horizon, o.action_dim});
    auto noise = torch::randn_like(actions);
    auto time = torch::tensor({0.3f, 0.7f, 0.95f});
    const auto per_token = time.view({3, 1}).expand({3, o.action_horizon}).contiguous();
    const auto scalar = model->compute_loss(obs, actions, noise, time);
    const auto tokens = model->compute_loss(obs, actions, noise, per_token);
    if (!pi05) {
      // pi0 already mixes the time into each action token: the same numbers go through the same ops.
      CHECK(torch::equal(scalar, tokens));
    } else {
      // pi0.5's adaRMS condition becomes [B,H,W] instead of [B,W]: its matmuls have H times the rows, which a BLAS
      // may sum in another order — float32 rounding of a 64-wide dot product (~64·6e-8), carried through 2 layers.
      CHECK(testing::max_rel_error(tokens, scalar) < 1e-5);
      model->to(torch::kFloat64);
      model->set_compute_dtype(torch::kFloat64);
      auto obs64 = testing::random_observation(o, 3, 2, 2, torch::kFloat64);
      const auto a64 = actions.to(torch::kFloat64), n64 = noise.to(torch::kFloat64);
      const auto s64 = model->compute_loss(obs64, a64, n64, time.to(torch::kFloat64));
      const auto t64 = model->compute_loss(obs64, a64, n64, per_token.to(torch::kFloat64));
      CHECK(testing::max_rel_error(t64, s64) < 1e-12);
      model->to(torch::kFloat32);
      model->set_compute_dtype(torch::kFloat32);
    }
    // A different time on one token changes that example's loss: the per-token path is really per token.
    auto changed = per_token.clone();
    changed[1][0] = 0.0f;
    const auto other = model->compute_loss(obs, actions, noise, changed);
    CHECK(!torch::allclose(other[1], scalar[1], 1e-4, 1e-6));
    CHECK(testing::max_rel_error(other[0], scalar[0]) < 1e-5);
  }
}

TEST_CASE("rtc: training delays are uniform or exponential within binomial bounds", "[unit][model][rtc]") {
  const int64_t n = 4000, max_delay = 5;
  for (const std::string dist : {"uniform", "exp"}) {
    INFO(dist);
    auto gen = at::detail::createCPUGenerator(7);
    const auto d = sample_rtc_delays(n, max_delay, dist, 0.5, torch::TensorOptions(), gen);
    REQUIRE(d.scalar_type() == torch::kLong);
    CHECK(d.min().item<int64_t>() == 0);
    CHECK(d.max().item<int64_t>() == max_delay);
    double total = 0;
    for (int64_t k = 0; k <= max_delay; ++k) total += dist == "exp" ? std::exp(-0.5 * k) : 1.0;
    for (int64_t k = 0; k <= max_delay; ++k) {
      const double p = (dist == "exp" ? std::exp(-0.5 * k) : 1.0) / total;
      const double count = (d == k).sum().item<double>();
      // 5 binomial standard deviations: a false failure once in ~1.7 million runs per bin.
      INFO("d = " << k << ": " << count << " of " << n << ", expected " << n * p);
      CHECK(std::abs(count - n * p) < 5 * std::sqrt(n * p * (1 - p)));
    }
  }
  // A rank's slice is the global draw's rows, and draws the same amount from the generator.
  auto g1 = at::detail::createCPUGenerator(3), g2 = at::detail::createCPUGenerator(3);
  const auto all = sample_rtc_delays(8, 4, "uniform", 0.5, torch::TensorOptions(), g1);
  const auto part = sample_rtc_delays(8, 4, "uniform", 0.5, torch::TensorOptions(), g2, 2, 3);
  CHECK(torch::equal(part, all.narrow(0, 2, 3)));
  CHECK(torch::equal(torch::rand({4}, g1), torch::rand({4}, g2)));
}

TEST_CASE("rtc: committed rows get clean time and leave the loss", "[unit][model][rtc]") {
  const auto time = torch::tensor({0.5f, 0.9f});
  const auto delays = torch::tensor({0L, 2L});
  const auto t = rtc_token_time(time, delays, 4);
  CHECK(torch::equal(t, torch::tensor({{0.5f, 0.5f, 0.5f, 0.5f}, {0.0f, 0.0f, 0.9f, 0.9f}})));
  const auto m = rtc_loss_mask(delays, 4, torch::TensorOptions().dtype(torch::kFloat32));
  CHECK(torch::equal(m, torch::tensor({{1.0f, 1.0f, 1.0f, 1.0f}, {0.0f, 0.0f, 1.0f, 1.0f}})));
}

TEST_CASE("rtc: inactive requests sample exactly as plain sampling", "[unit][model][rtc]") {
  for (bool pi05 : {false, true}) {
    INFO("pi05=" << pi05);
    SamplingCase c(pi05);
    const auto plain = c.sample(5);
    // Off, no rows, trained with d = 0: plain sampling. Guided with an all-zero mask (d = 0, end 0): v − w·0 = v.
    for (const auto& r : {request(RtcMode::kOff, c.prev, 2), request(RtcMode::kGuided, torch::Tensor(), 0),
                          request(RtcMode::kTrained, c.prev, 0), request(RtcMode::kGuided, c.prev, 0, 0)}) {
      CHECK(torch::equal(c.sample(5, &r), plain));
    }
    // The exact Jacobian differentiates the velocity: under autograd the layers take ATen's RoPE composite, whose
    // sums ATen's CPU and CUDA kernels contract into FMAs, where plain sampling runs nn::rope_scatter (two roundings):
    // the same values to a float32 ulp per rotation, not the same bits.
    auto exact = request(RtcMode::kGuided, c.prev, 0, 0);
    exact.guidance.jacobian = RtcJacobian::kExact;
    CHECK(testing::max_rel_error(c.sample(5, &exact), plain) < 1e-6);
  }
}

TEST_CASE("rtc: trained mode returns the committed rows and conditions the rest on them", "[unit][model][rtc]") {
  for (bool pi05 : {false, true}) {
    INFO("pi05=" << pi05);
    SamplingCase c(pi05);
    const auto plain = c.sample(5);
    const auto r = request(RtcMode::kTrained, c.prev, 2);
    const auto out = c.sample(5, &r);
    CHECK(torch::equal(out.narrow(1, 0, 2), c.prev.narrow(1, 0, 2)));
    CHECK(!torch::allclose(out.narrow(1, 2, 2), plain.narrow(1, 2, 2), 1e-4, 1e-5));
    // Per-step timing still sees every step.
    SampleTiming timing;
    c.sample(5, &r, &timing);
    CHECK(timing.step_ms.size() == 5);
  }
}

TEST_CASE("rtc: guidance pulls the committed rows towards the previous chunk, both Jacobians", "[unit][model][rtc]") {
  for (bool pi05 : {false, true}) {
    INFO("pi05=" << pi05);
    SamplingCase c(pi05);
    const auto plain = c.sample(10);
    const auto& prev = c.prev;
    const double plain_gap = (plain.narrow(1, 0, 2) - prev.narrow(1, 0, 2)).abs().mean().item<double>();
    torch::Tensor outs[2];
    for (auto jac : {RtcJacobian::kIdentity, RtcJacobian::kExact}) {
      auto r = request(RtcMode::kGuided, prev, 2);
      r.guidance.jacobian = jac;
      const auto out = c.sample(10, &r);
      const double gap = (out.narrow(1, 0, 2) - prev.narrow(1, 0, 2)).abs().mean().item<double>();
      INFO(to_string(jac) << ": mean gap to the previous rows " << gap << " (plain " << plain_gap << ")");
      CHECK(gap < 0.2 * plain_gap);
      CHECK(torch::isfinite(out).all().item<bool>());
      outs[jac == RtcJacobian::kExact] = out;
    }
    // The exact product differs from the identity (the expert's Jacobian is not zero).
    CHECK(!torch::allclose(outs[0], outs[1], 1e-5, 1e-6));
  }
}

TEST_CASE("rtc: bad requests are refused with one line naming the problem", "[unit][model][rtc]") {
  const auto prev = torch::randn({1, 3, 8});
  CHECK_THROWS_WITH(check_rtc_request(request(RtcMode::kGuided, prev, 4), 4, 8, "obs"),
                    Catch::Contains("inference_delay is 4; expected 0..3"));
  CHECK_THROWS_WITH(check_rtc_request(request(RtcMode::kGuided, torch::randn({1, 3, 7}), 1), 4, 8, "obs"),
                    Catch::Contains("[B,rows,8]"));
  CHECK_THROWS_WITH(check_rtc_request(request(RtcMode::kGuided, torch::randn({1, 5, 8}), 1), 4, 8, "obs"),
                    Catch::Contains("at most the action horizon (4)"));
  auto bad = prev.clone();
  bad[0][1][2] = std::nanf("");
  CHECK_THROWS_WITH(check_rtc_request(request(RtcMode::kTrained, bad, 1), 4, 8, "obs"), Catch::Contains("non-finite"));
  CHECK_NOTHROW(check_rtc_request(request(RtcMode::kTrained, prev, 3), 4, 8, "obs"));
  CHECK_THROWS_WITH(parse_rtc_mode("fast", "--rtc"), Catch::Contains("--rtc must be one of off, trained, guided"));
}
