// The flow-matching time sampler (model/flow_matching.h): openpi's distribution, a rank's slice drawn as the whole
// batch would be, and the model's own draws going through it; train.loss_mask's masks and masked mean.
#include <catch2/catch.hpp>

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "pi0/model/flow_matching.h"
#include "pi0/model/pi0.h"
#include "support/test_support.h"

using namespace pi0;
using namespace pi0::model;

TEST_CASE("flow-matching time: Beta(1.5, 1)·0.999 + 0.001, from 0.001 up to 1 exclusive", "[unit][model]") {
  auto gen = at::detail::createCPUGenerator(7);
  const int64_t n = 200000;
  const auto t = sample_flow_time(n, torch::kFloat64, gen);
  REQUIRE(t.sizes() == torch::IntArrayRef({n}));
  CHECK(t.min().item<double>() >= 0.001);
  CHECK(t.max().item<double>() < 1.0);
  // Mean 0.6·0.999 + 0.001 and standard deviation √(1.5/(2.5²·3.5))·0.999 of a Beta(1.5, 1) draw; the empirical
  // mean is within 6 standard errors (0.26/√n ≈ 5.9e-4 each) whatever the seed.
  const double mean = 0.6 * 0.999 + 0.001, sd = std::sqrt(1.5 / (6.25 * 3.5)) * 0.999;
  CHECK(std::abs(t.mean().item<double>() - mean) < 6 * sd / std::sqrt(static_cast<double>(n)));
  // The CDF at 0.5: P(t ≤ 0.5) = ((0.5 − 0.001)/0.999)^1.5 ≈ 0.353, within 6 standard errors of a proportion.
  const double p = std::pow((0.5 - 0.001) / 0.999, 1.5);
  const double below = (t <= 0.5).to(torch::kFloat64).mean().item<double>();
  CHECK(std::abs(below - p) < 6 * std::sqrt(p * (1 - p) / static_cast<double>(n)));
}

TEST_CASE("flow-matching time: a rank's slice is the whole batch's draw, and consumes the generator alike",
          "[unit][model]") {
  const int64_t world = 4, b = 3;
  auto whole_gen = at::detail::createCPUGenerator(11);
  const auto u = torch::rand({world * b}, whole_gen, torch::kFloat32);
  const auto after_whole = torch::rand({5}, whole_gen, torch::kFloat32);
  for (int64_t rank = 0; rank < world; ++rank) {
    auto gen = at::detail::createCPUGenerator(11);
    const auto mine = sample_flow_time(world * b, torch::kFloat32, gen, rank * b, b);
    CHECK(torch::equal(mine, u.narrow(0, rank * b, b).pow(1.0 / 1.5) * 0.999 + 0.001));
    CHECK(torch::equal(torch::rand({5}, gen, torch::kFloat32), after_whole));
  }
}

TEST_CASE("flow-matching time: compute_loss without given time draws it with the sampler", "[unit][model]") {
  for (bool pi05 : {false, true}) {
    auto o = dummy_options(pi05);
    Pi0 model(o);
    const auto obs = testing::random_observation(o, 2);
    const auto actions = torch::randn({2, o.action_horizon, o.action_dim});
    torch::manual_seed(5);
    const auto drawn = model->compute_loss(obs, actions);
    torch::manual_seed(5);
    const auto noise = torch::randn_like(actions);
    const auto time = sample_flow_time(2, actions.options());
    const auto given = model->compute_loss(obs, actions, noise, time);
    CHECK(torch::equal(drawn, given));
  }
}

TEST_CASE("action_loss_mask keeps recorded rows and the robot's own dims, as chosen", "[unit][model]") {
  const auto rows = torch::tensor({2, 4}, torch::kInt64);  // sample 0: 2 recorded rows of 4; sample 1: all 4
  const auto dims = torch::tensor({3, 5}, torch::kInt64);  // 3 and 5 real action dims of 6
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  CHECK(torch::equal(action_loss_mask(rows, dims, 4, 6, false, false, f32), torch::ones({2, 4, 6})));
  const auto end = action_loss_mask(rows, dims, 4, 6, true, false, f32);
  CHECK(end[0].sum().item<float>() == 2 * 6);
  CHECK(end[0][1].sum().item<float>() == 6);
  CHECK(end[0][2].sum().item<float>() == 0);
  CHECK(end[1].sum().item<float>() == 4 * 6);
  const auto pad = action_loss_mask(rows, dims, 4, 6, false, true, f32);
  CHECK(pad[0].sum().item<float>() == 4 * 3);
  CHECK(pad[0][3][2].item<float>() == 1);
  CHECK(pad[0][3][3].item<float>() == 0);
  CHECK(pad[1].sum().item<float>() == 4 * 5);
  const auto both = action_loss_mask(rows, dims, 4, 6, true, true, f32);
  CHECK(both[0].sum().item<float>() == 2 * 3);
  CHECK(both[1].sum().item<float>() == 4 * 5);
  CHECK(torch::equal(both, end * pad));
  // Without the batch's facts (a batch built by hand) a mask cannot be made.
  CHECK_THROWS(action_loss_mask(torch::Tensor(), dims, 4, 6, true, false, f32));
}

TEST_CASE("masked_mean averages over the kept elements only", "[unit][model]") {
  // elementwise[b,h,d] = 100 b + 10 h + d, B=2, H=3, D=2.
  const auto e = (torch::arange(2).view({2, 1, 1}) * 100 + torch::arange(3).view({1, 3, 1}) * 10 +
                  torch::arange(2).view({1, 1, 2}))
                     .to(torch::kFloat32);
  // Keep sample 0's first row (0, 1) and sample 1's first two rows' first dim (100, 110): mean 211 / 4 = 52.75.
  auto m = torch::zeros({2, 3, 2});
  m[0][0].fill_(1);
  m[1][0][0] = 1;
  m[1][1][0] = 1;
  CHECK(masked_mean(e, m).item<float>() == 52.75f);
  // A row mask [B,H,1] counts each kept row D times: rows (0,0) and (1,2): (0 + 1 + 120 + 121) / 4 = 60.5.
  auto rows = torch::zeros({2, 3, 1});
  rows[0][0][0] = 1;
  rows[1][2][0] = 1;
  CHECK(masked_mean(e, rows).item<float>() == 60.5f);
  CHECK(masked_mean(e, torch::ones({2, 3, 2})).item<float>() == e.mean().item<float>());
  CHECK(masked_mean(e, torch::zeros({2, 3, 2})).item<float>() == 0.0f);  // not NaN
}
