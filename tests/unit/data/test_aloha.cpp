// ALOHA adapt_to_pi (openpi aloha_policy.py): joint flips and gripper conversions against values worked out by
// hand from openpi's formulas, the round trip action → inverse → action, and the dataset applying it by default for
// ALOHA only (so norm stats see converted values). Inference's side of it: tests/unit/infer/test_inference.cpp.
#include <catch2/catch.hpp>

#include <cmath>

#include "data_test_util.h"
#include "pi0/common/check.h"
#include "pi0/config/config.h"
#include "pi0/data/aloha.h"
#include "pi0/data/dataset.h"
#include "pi0/data/example_data.h"
#include "pi0/data/norm_stats.h"

using namespace pi0;
using namespace pi0::data;
using Catch::Contains;

namespace {
const std::vector<int64_t> kFlipped = {1, 2, 8, 9};
}

TEST_CASE("adapt_to_pi state: joint flips and gripper linear → angular (openpi's formulas)", "[unit][data]") {
  auto state = torch::linspace(-0.6, 0.7, 16, torch::kFloat64).view({1, 16});
  state[0][6] = 0.5;
  state[0][13] = 0.9;
  const auto out = aloha_state_to_pi(state, "test state");
  for (int64_t d = 0; d < 16; ++d) {
    INFO("dim " << d);
    if (d == 6 || d == 13) continue;
    const double sign = std::count(kFlipped.begin(), kFlipped.end(), d) ? -1.0 : 1.0;
    CHECK(out[0][d].item<double>() == Approx(sign * state[0][d].item<double>()).margin(1e-12));  // dims ≥ 14 untouched
  }
  // Gripper 0.5: linear = 0.5·(0.058 − 0.01844) + 0.01844 = 0.03822 m; asin((0.022² + 0.03822² − 0.036²) /
  // (2·0.022·0.03822)) = 0.39627 rad; (0.39627 − 0.5476) / (1.6296 − 0.5476) = −0.1400559.
  CHECK(out[0][6].item<double>() == Approx(-0.1400559217021429).margin(1e-9));
  CHECK(out[0][13].item<double>() == Approx(0.5016401573077245).margin(1e-9));
}

TEST_CASE("adapt_to_pi actions: flips, gripper_from_angular_inv, and the inverse round trip", "[unit][data]") {
  auto a = torch::zeros({2, 14}, torch::kFloat64);
  a[0][6] = 0.25;
  a[0][1] = 0.4;
  const auto to_pi = aloha_actions_to_pi(a, "test actions");
  // 0.25·(1.4910 + 0.6213) − 0.6213 − 0.5476 = −0.640825
  CHECK(to_pi[0][6].item<double>() == Approx(-0.640825).margin(1e-12));
  CHECK(to_pi[0][1].item<double>() == Approx(-0.4).margin(1e-12));
  // The inverse (AlohaOutputs): (0.3 + 0.5476 − (−0.6213)) / (1.4910 + 0.6213) = 0.6954031.
  auto m = torch::zeros({1, 14}, torch::kFloat64);
  m[0][13] = 0.3;
  CHECK(aloha_actions_from_pi(m, "x")[0][13].item<double>() == Approx(0.6954031150878188).margin(1e-12));

  torch::manual_seed(0);
  const auto actions = torch::rand({3, 5, 20}) * 2 - 1;  // float32, [B,H,A] with padding dims past 14
  const auto back = aloha_actions_from_pi(aloha_actions_to_pi(actions, "a"), "a");
  CHECK(back.scalar_type() == torch::kFloat32);
  CHECK((back - actions).abs().max().item<double>() < 1e-6);
  CHECK((aloha_actions_to_pi(actions, "a") - actions).abs().max().item<double>() > 0.1);  // it does change them

  REQUIRE_THROWS_WITH(aloha_state_to_pi(torch::zeros({2, 8}), "run.hdf5: state"),
                      Contains("run.hdf5: state has 8 dims, expected >= 14 for adapt_to_pi (ALOHA"));
}

TEST_CASE("the dataset applies adapt_to_pi for ALOHA by default, so norm stats see converted values", "[unit][data]") {
  pi0::test::TempDir dir;
  ExampleDataOptions eo;
  eo.episodes = 2;
  eo.steps = 6;
  eo.image_size = 8;
  DatasetOptions o;
  o.format = "aloha";
  o.paths = {write_example_aloha(dir.str(), eo)};
  o.prompt = "fold";
  o.action_horizon = 2;
  DatasetOptions raw_o = o;
  raw_o.adapt_to_pi = "false";
  const RobotDataset adapted(o), raw(raw_o);
  const auto s = adapted.get(3), r = raw.get(3);
  CHECK(torch::allclose(s.state, aloha_state_to_pi(r.state, "x"), 0, 1e-6));
  CHECK(torch::allclose(s.actions, aloha_actions_to_pi(r.actions, "x"), 0, 1e-6));
  CHECK(s.state[1].item<float>() == -r.state[1].item<float>());
  const auto stats = compute_norm_stats(adapted), raw_stats = compute_norm_stats(raw);
  CHECK(stats.at("state").mean[1] == Approx(-raw_stats.at("state").mean[1]));

  DatasetOptions bad = o;
  bad.adapt_to_pi = "yes";
  REQUIRE_THROWS_WITH(RobotDataset(bad), Contains("dataset.adapt_to_pi: got 'yes', expected auto, true or false"));
  // Config: the key, its default per format, and its validation.
  auto cfg = config::parse_config(YAML::Load("data: {dataset: {format: aloha, paths: [x]}}"), "run.yaml");
  CHECK(cfg.data.dataset.adapt_to_pi_enabled());
  cfg = config::parse_config(YAML::Load("data: {dataset: {format: aloha, paths: [x], adapt_to_pi: false}}"), "run.yaml");
  CHECK_FALSE(cfg.data.dataset.adapt_to_pi_enabled());
  CHECK_FALSE(config::parse_config(YAML::Load("{}"), "run.yaml").data.dataset.adapt_to_pi_enabled());
  REQUIRE_THROWS_WITH(config::parse_config(YAML::Load("data: {dataset: {adapt_to_pi: maybe}}"), "run.yaml"),
                      Contains("data.dataset.adapt_to_pi must be auto, true or false (got 'maybe')"));
}
