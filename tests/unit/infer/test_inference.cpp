// infer/inference.h: the inference path of pi0-infer and pi0-serve. ALOHA's convention converted on the way in
// and back on the way out (adapt_to_pi), and predict() giving what its steps give one by one; real-time chunking's
// way back in (model_actions, the inverse of robot_actions), its keys (previous_chunk) and its modes (rtc_request).
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

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

namespace {

using Catch::Contains;

// Action stats of `dims` dims, varied per dim, for z-score and quantile normalization alike.
KeyStats action_stats(int64_t dims) {
  KeyStats k;
  for (int64_t d = 0; d < dims; ++d) {
    const double x = static_cast<double>(d);
    k.mean.push_back(0.02 * x);
    k.std.push_back(0.5 + 0.07 * x);
    k.q01.push_back(-1.0 - 0.02 * x);
    k.q99.push_back(1.0 + 0.04 * x);
  }
  return k;
}

// A bundle without a model: what model_actions, robot_actions and rtc_request read.
io::Bundle rtc_bundle(int64_t horizon, int64_t model_dim, int64_t trained_delay) {
  io::Bundle b;
  b.config.model.action_horizon = horizon;
  b.config.model.action_dim = model_dim;
  b.config.data.dataset.adapt_to_pi = "false";
  b.config.train.rtc_max_delay = trained_delay;
  b.transform.norm = "none";
  b.transform.action_dim = model_dim;
  return b;
}

}  // namespace

// The rows come back as float32 through unnormalize → normalize (and the ALOHA conversion, in float64, rounded
// to float32 twice): each step rounds to 2^-24 of values below 4 here, a dozen steps, then divided by a std of at
// least 0.5: under 3e-6. The check allows 1e-5.
TEST_CASE("model_actions inverts robot_actions for z-score and quantile stats and delta actions and ALOHA's convention",
          "[unit][infer]") {
  constexpr int64_t kDims = 14, kModelDim = 32;
  struct Case {
    std::string name, norm;
    bool delta, aloha;
  };
  const std::vector<Case> cases = {{"z-score", "zscore", false, false},
                                   {"quantile", "quantile", false, false},
                                   {"z-score, delta actions", "zscore", true, false},
                                   {"quantile, delta actions, ALOHA", "quantile", true, true},
                                   {"no normalization, ALOHA", "none", false, true}};
  for (const auto& c : cases) {
    INFO(c.name);
    io::Bundle b = rtc_bundle(8, kModelDim, 0);
    b.transform.norm = c.norm;
    b.norm_stats.keys["actions"] = action_stats(kDims);
    if (c.delta) b.transform.delta_action_mask = {true, true, true, false, true, true, false, true};
    if (c.aloha) b.config.data.dataset.adapt_to_pi = "true";
    torch::manual_seed(7);
    const auto state = torch::rand({2, kDims}) - 0.5;
    auto model_BHA = torch::rand({2, 8, kModelDim}) * 2 - 1;
    const auto robot = infer::robot_actions(b, model_BHA, state);
    const int64_t dims = robot.size(-1);  // all of the model's dims without normalization, else the stats'
    const auto back = infer::model_actions(b, robot, state, "test");
    REQUIRE(back.sizes() == model_BHA.sizes());
    CHECK((back.narrow(-1, 0, dims) - model_BHA.narrow(-1, 0, dims)).abs().max().item<double>() < 1e-5);
    if (dims < kModelDim) CHECK(back.narrow(-1, dims, kModelDim - dims).abs().max().item<double>() == 0.0);
    // A robot served fewer dims (a profile's) sends those: the rest stay 0 in model space.
    if (!c.aloha && c.norm != "none") {
      const auto fewer = infer::model_actions(b, robot.narrow(-1, 0, 10), state, "test");
      CHECK((fewer.narrow(-1, 0, 10) - model_BHA.narrow(-1, 0, 10)).abs().max().item<double>() < 1e-5);
      CHECK(fewer.narrow(-1, 10, kModelDim - 10).abs().max().item<double>() == 0.0);
    }
  }
  io::Bundle b = rtc_bundle(8, kModelDim, 0);
  b.transform.norm = "zscore";
  b.norm_stats.keys["actions"] = action_stats(kDims);
  CHECK_THROWS_WITH(infer::model_actions(b, torch::zeros({1, 3, 15}), torch::zeros({1, kDims}), "observation"),
                    Contains("observation: prev_action_chunk has 15 dims per row; this policy's actions have 14"));
  // Finite rows that leave float32's range once normalized: said as such. z-score divides by std + 1e-6, so a row at
  // float32's largest value overflows in a dim whose std is below 1.
  REQUIRE(b.norm_stats.at("actions").std[0] + 1e-6 < 0.99);
  auto huge = torch::zeros({1, 3, kDims});
  huge[0][1][0] = std::numeric_limits<float>::max();
  CHECK_THROWS_WITH(infer::model_actions(b, huge, torch::zeros({1, kDims}), "observation"),
                    Contains("observation: prev_action_chunk overflows after normalisation: row 1, dim 0 is ") &&
                        !Contains("non-finite"));
}

TEST_CASE("previous_chunk reads the keys as rows and whole numbers and names the key of a bad one", "[unit][infer]") {
  const auto rows = torch::rand({3, 7}, torch::kFloat64);
  const auto one = infer::previous_chunk(rows, torch::scalar_tensor(2, torch::kLong), torch::tensor({3}), 1, "obs");
  REQUIRE(one.robot_rows.sizes() == torch::IntArrayRef({1, 3, 7}));
  CHECK(one.robot_rows.scalar_type() == torch::kFloat32);
  CHECK(torch::equal(one.robot_rows[0], rows.to(torch::kFloat32)));
  CHECK(one.delay == 2);
  CHECK(one.execute_horizon == 3);
  const auto none = infer::previous_chunk({}, {}, {}, 1, "obs");
  CHECK_FALSE(none.robot_rows.defined());
  CHECK(none.delay == 0);
  CHECK_FALSE(none.execute_horizon.has_value());  // absent, not a value a client could send
  CHECK(infer::previous_chunk(torch::rand({2, 3, 7}), torch::scalar_tensor(2.0), {}, 2, "obs").delay == 2);  // np.round()
  CHECK(infer::previous_chunk(torch::ones({3, 7}, torch::kLong), {}, {}, 1, "obs").robot_rows.scalar_type() == torch::kFloat32);

  struct Bad {
    torch::Tensor rows, delay, horizon;
    int64_t batch;
    std::string expected;
  };
  auto nan_rows = rows.clone();
  nan_rows[1][4] = std::nan("");
  const std::vector<Bad> bad = {
      {torch::rand({7}), {}, {}, 1, "obs: 'prev_action_chunk' has shape [7] and dtype Float, expected numbers [R,D] (or [1,R,D])"},
      {torch::rand({2, 3, 7}), {}, {}, 1, "'prev_action_chunk' has shape [2, 3, 7]"},
      {torch::rand({3, 7}), {}, {}, 2, "expected numbers [B,R,D] with B = 2"},
      {torch::ones({3, 7}, torch::kBool), {}, {}, 1, "'prev_action_chunk' has shape [3, 7] and dtype Bool"},
      {nan_rows, {}, {}, 1, "obs: 'prev_action_chunk' holds NaN at [1, 4], expected finite values"},
      {rows, torch::scalar_tensor(1.5), {}, 1, "obs: 'inference_delay' is 1.5, expected a whole number"},
      {rows, torch::tensor({1, 2}), {}, 1, "obs: 'inference_delay' has shape [2] and dtype Long, expected a whole number"},
      {rows, torch::scalar_tensor(true, torch::kBool), {}, 1, "'inference_delay' has shape [] and dtype Bool"},
      {rows, {}, torch::scalar_tensor(std::nan("")), 1, "obs: 'execute_horizon' is nan, expected a whole number"},
  };
  for (const auto& x : bad) {
    INFO(x.expected);
    CHECK_THROWS_WITH(infer::previous_chunk(x.rows, x.delay, x.horizon, x.batch, "obs"), Contains(x.expected));
  }
}

TEST_CASE("rtc_request resolves auto by the bundle's trained delay and refuses trained mode beyond it", "[unit][infer]") {
  constexpr int64_t kHorizon = 6, kModelDim = 8;
  const io::Bundle trained = rtc_bundle(kHorizon, kModelDim, 3), untrained = rtc_bundle(kHorizon, kModelDim, 0);
  CHECK(infer::trained_max_delay(trained) == 3);
  const auto state = torch::zeros({1, kModelDim});
  const auto rows = torch::rand({1, 5, kModelDim});
  auto chunk = [&](int64_t delay) {
    infer::PreviousChunk c;
    c.robot_rows = rows;
    c.delay = delay;
    return c;
  };
  auto settings = [](const std::string& mode) {
    infer::RtcSettings s;
    s.mode = mode;
    return s;
  };
  using model::RtcMode;
  const auto r = infer::rtc_request(trained, settings("auto"), chunk(3), state, "obs");
  CHECK(r.mode == RtcMode::kTrained);
  CHECK(r.delay == 3);
  CHECK(torch::equal(r.prev, rows));  // no normalization, all of the model's dims: model space is robot space
  CHECK(infer::rtc_request(trained, settings("auto"), chunk(4), state, "obs").mode == RtcMode::kGuided);
  // d = 0: trained mode would commit nothing; guidance still smooths the seam.
  CHECK(infer::rtc_request(trained, settings("auto"), chunk(0), state, "obs").mode == RtcMode::kGuided);
  CHECK(infer::rtc_request(untrained, settings("auto"), chunk(1), state, "obs").mode == RtcMode::kGuided);
  CHECK(infer::rtc_request(trained, settings("guided"), chunk(1), state, "obs").mode == RtcMode::kGuided);
  CHECK(infer::rtc_request(trained, settings("trained"), chunk(2), state, "obs").mode == RtcMode::kTrained);
  CHECK_THROWS_WITH(infer::rtc_request(trained, settings("trained"), chunk(4), state, "obs"),
                    Contains("obs: inference_delay 4 is beyond what this policy was trained for (train.rtc_max_delay 3)"));
  CHECK_THROWS_WITH(infer::rtc_request(untrained, settings("trained"), chunk(1), state, "obs"),
                    Contains("(train.rtc_max_delay 0)"));
  // Off ignores the keys; a request without rows samples plainly, and a delay without rows is the client's mistake.
  CHECK(infer::rtc_request(trained, settings("off"), chunk(2), state, "obs").mode == RtcMode::kOff);
  infer::PreviousChunk no_rows;
  CHECK(infer::rtc_request(trained, settings("auto"), no_rows, state, "obs").mode == RtcMode::kOff);
  no_rows.delay = 2;
  CHECK_THROWS_WITH(infer::rtc_request(trained, settings("auto"), no_rows, state, "obs"),
                    Contains("obs: inference_delay is 2 but no prev_action_chunk was given"));
  CHECK_THROWS_WITH(infer::rtc_request(trained, settings("auto"), chunk(6), state, "obs"),
                    Contains("obs: inference_delay is 6; expected 0..5 (the rows of prev_action_chunk)"));

  CHECK(infer::rtc_metadata(trained, settings("auto")).at("modes") == nlohmann::json({"guided", "trained"}));
  CHECK(infer::rtc_metadata(untrained, settings("auto")).at("modes") == nlohmann::json({"guided"}));
  CHECK(infer::rtc_metadata(trained, settings("off")).at("modes") == nlohmann::json::array());
  CHECK(infer::rtc_metadata(trained, settings("auto")).at("trained_max_delay") == 3);
  CHECK_NOTHROW(infer::check_rtc_mode_flag("auto", "--rtc"));
  CHECK_THROWS_WITH(infer::check_rtc_mode_flag("sometimes", "--rtc"),
                    Contains("--rtc: got 'sometimes', expected auto, guided, trained or off"));
}
