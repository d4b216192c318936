// infer/inference.h: the inference path of pi0-infer and pi0-serve. ALOHA's convention converted on the way in
// and back on the way out (adapt_to_pi), and predict() giving what its steps give one by one.
#include <catch2/catch.hpp>

#include "pi0/config/config.h"
#include "pi0/data/aloha.h"
#include "pi0/infer/inference.h"
#include "pi0/model/pi0.h"
#include "support/test_support.h"

using namespace pi0;
using namespace pi0::data;

TEST_CASE("inference converts the observation's state to pi0's convention and the actions back", "[unit][infer]") {
  io::Bundle b;
  b.config.data.dataset.format = "aloha";
  b.transform.norm = "none";
  b.transform.action_dim = 32;
  b.transform.image_size = 14;
  b.transform.max_token_len = 4;
  torch::manual_seed(2);
  const auto state = torch::rand({2, 14});
  std::map<std::string, torch::Tensor> obs = {
      {"state", state},
      {"image/base_0_rgb", torch::zeros({2, 14, 14, 3}, torch::kUInt8)},
      {"tokenized_prompt", torch::ones({2, 4}, torch::kInt32)},
      {"tokenized_prompt_mask", torch::ones({2, 4}, torch::kBool)}};
  const auto in = infer::make_inputs(b, obs, "obs.safetensors", std::nullopt, nullptr);
  const auto expected = aloha_state_to_pi(state, "x");
  CHECK((in.raw_state - expected).abs().max().item<double>() < 1e-7);
  CHECK((in.observation.state.narrow(1, 0, 14) - expected).abs().max().item<double>() < 1e-7);
  b.config.data.dataset.adapt_to_pi = "false";
  CHECK(torch::equal(infer::make_inputs(b, obs, "obs.safetensors", std::nullopt, nullptr).raw_state, state));
  b.config.data.dataset.adapt_to_pi = "auto";

  torch::manual_seed(1);
  const auto model_actions = torch::rand({2, 4, 32}) * 2 - 1;
  const auto robot = infer::robot_actions(b, model_actions, torch::zeros({2, 14}));
  CHECK((robot - aloha_actions_from_pi(model_actions, "x")).abs().max().item<double>() < 1e-7);
  b.config.data.dataset.adapt_to_pi = "false";
  CHECK((infer::robot_actions(b, model_actions, torch::zeros({2, 14})) - model_actions).abs().max().item<double>() == 0);
}

TEST_CASE("predict gives sample_actions' actions and their robot_actions", "[unit][infer]") {
  io::Bundle b;
  const auto o = model::dummy_options(false);
  torch::manual_seed(3);
  b.model = model::Pi0(o);
  b.model->eval();
  b.transform.norm = "zscore";
  KeyStats actions;
  for (int64_t d = 0; d < 6; ++d) {  // the robot has 6 of the model's action dims
    actions.mean.push_back(0.1 * static_cast<double>(d));
    actions.std.push_back(1.0 + 0.5 * static_cast<double>(d));
  }
  b.norm_stats.keys["actions"] = actions;
  infer::InferenceInputs in;
  in.observation = testing::random_observation(o, 2);
  in.raw_state = torch::zeros({2, 6});
  const auto noise = torch::randn({2, o.action_horizon, o.action_dim});

  const auto got = infer::predict(b, in, noise, 3);
  const auto expected = b.model->sample_actions(in.observation, noise, 3);
  CHECK(got.actions.sizes() == expected.sizes());
  CHECK(torch::equal(got.actions, expected));
  CHECK(torch::equal(got.robot_actions, infer::robot_actions(b, expected, in.raw_state)));
  CHECK(got.robot_actions.sizes() == torch::IntArrayRef({2, o.action_horizon, 6}));
  CHECK(got.robot_actions.is_contiguous());
  CHECK(got.model_ms > 0);
  CHECK(infer::model_device(b) == torch::Device(torch::kCPU));
}
