// Robot profiles: openpi's key layouts → the model's keys (image layout and dtype conversions as openpi's
// _parse_image does them), and their one-line errors.
#include <catch2/catch.hpp>

#include <cmath>

#include "pi0/common/check.h"
#include "pi0/serve/robot_profile.h"

using namespace pi0;
using serve::Fields;
using serve::Robot;
using Catch::Contains;

namespace {

Fields libero(const torch::Tensor& image) {
  Fields f;
  f["observation/image"].tensor = image;
  f["observation/wrist_image"].tensor = torch::zeros({5, 6, 3}, torch::kUInt8);
  f["observation/state"].tensor = torch::arange(8, torch::kFloat64);
  f["prompt"].text = "go";
  return f;
}

void check_error(Robot robot, const Fields& f, const std::string& text) {
  try {
    serve::to_model_request(robot, f, std::nullopt);
    FAIL("no error, expected: " << text);
  } catch (const UserError& e) {
    INFO(e.what());
    CHECK_THAT(std::string(e.what()), Contains(text));
  }
}

}  // namespace

TEST_CASE("libero profile: HWC and CHW and float images give the same uint8 image", "[serve][unit]") {
  torch::manual_seed(0);
  const auto hwc = torch::randint(0, 256, {10, 12, 3}).to(torch::kUInt8);
  const auto a = serve::to_model_request(Robot::kLibero, libero(hwc), std::nullopt);
  CHECK(torch::equal(a.tensors.at("image/base_0_rgb"), hwc.unsqueeze(0)));
  CHECK(a.tensors.at("image/left_wrist_0_rgb").sizes() == torch::IntArrayRef({1, 5, 6, 3}));
  CHECK(a.tensors.count("image/right_wrist_0_rgb") == 0);
  CHECK(torch::equal(a.tensors.at("state"), torch::arange(8, torch::kFloat32).unsqueeze(0)));
  CHECK(*a.prompt == "go");
  const auto b = serve::to_model_request(Robot::kLibero, libero(hwc.permute({2, 0, 1}).contiguous()), std::nullopt);
  CHECK(torch::equal(b.tensors.at("image/base_0_rgb"), hwc.unsqueeze(0)));
  // float in [0,1]: (255·x) truncated, as numpy's astype(uint8): (v + 0.5) / 255 comes back as v
  const auto v = torch::randint(0, 255, {10, 12, 3}).to(torch::kUInt8);
  const auto f = (v.to(torch::kFloat32) + 0.5f) / 255.0f;
  const auto c = serve::to_model_request(Robot::kLibero, libero(f), std::nullopt);
  CHECK(torch::equal(c.tensors.at("image/base_0_rgb"), v.unsqueeze(0)));
}

TEST_CASE("aloha and droid profiles map openpi's keys", "[serve][unit]") {
  Fields a;
  a["state"].tensor = torch::randn({14});
  a["images/cam_high"].tensor = torch::randint(0, 256, {3, 8, 9}).to(torch::kUInt8);
  a["images/cam_low"].tensor = torch::randint(0, 256, {3, 8, 9}).to(torch::kUInt8);
  a["images/cam_right_wrist"].tensor = torch::randint(0, 256, {3, 4, 4}).to(torch::kUInt8);
  a["prompt"].text = "fold";
  const auto r = serve::to_model_request(Robot::kAloha, a, std::nullopt);
  CHECK(torch::equal(r.tensors.at("image/base_0_rgb")[0], a["images/cam_high"].tensor.permute({1, 2, 0})));
  CHECK(r.tensors.count("image/left_wrist_0_rgb") == 0);
  CHECK(r.tensors.at("image/right_wrist_0_rgb").sizes() == torch::IntArrayRef({1, 4, 4, 3}));
  CHECK(r.tensors.size() == 3);  // cam_low is not a pi0 camera

  Fields d;
  d["observation/joint_position"].tensor = torch::arange(7, torch::kFloat64);
  d["observation/gripper_position"].tensor = torch::full({1}, 0.5, torch::kFloat64);
  d["observation/exterior_image_1_left"].tensor = torch::zeros({6, 6, 3}, torch::kUInt8);
  d["observation/wrist_image_left"].tensor = torch::zeros({6, 6, 3}, torch::kUInt8);
  const auto q = serve::to_model_request(Robot::kDroid, d, std::string("default task"));
  CHECK(torch::equal(q.tensors.at("state")[0], torch::tensor({0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0.5}, torch::kFloat32)));
  CHECK(*q.prompt == "default task");
  CHECK(serve::robot_action_dims(Robot::kDroid) == 8);
  CHECK(serve::robot_action_dims(Robot::kAloha) == 14);
  CHECK(serve::robot_action_dims(Robot::kLibero) == 7);
}

TEST_CASE("robot profiles: bad observations name the key and what was expected", "[serve][unit]") {
  const auto img = torch::zeros({8, 8, 3}, torch::kUInt8);
  auto f = libero(img);
  f.erase("observation/state");
  check_error(Robot::kLibero, f, "missing key 'observation/state', expected float array [8]");
  f = libero(img);
  f["observation/state"].tensor = torch::zeros({7});
  check_error(Robot::kLibero, f, "'observation/state' has shape [7], expected float array [8]");
  f["observation/state"].tensor = torch::zeros({8}, torch::kInt32);
  check_error(Robot::kLibero, f, "'observation/state' has dtype Int, expected float array [8]");
  f = libero(torch::zeros({8, 8, 4}, torch::kUInt8));
  check_error(Robot::kLibero, f, "'observation/image' has shape [8, 8, 4]");
  f = libero(torch::zeros({8, 8, 3}, torch::kInt64));
  check_error(Robot::kLibero, f, "'observation/image' has dtype Long");
  f = libero(torch::full({8, 8, 3}, 2.0f));
  check_error(Robot::kLibero, f, "float values in [2.000000, 2.000000], expected [0,1]");
  f = libero(img);
  f.erase("prompt");
  check_error(Robot::kLibero, f, "missing key 'prompt'");
  f = libero(img);
  f["prompt"].text.reset();
  f["prompt"].tensor = torch::zeros({1});
  check_error(Robot::kLibero, f, "'prompt' is an array or number, expected a str");
  f = libero(img);
  f["prompt"].text = std::string("pick \xc3\xa0 up \xff", 12);  // bytes that are not UTF-8 (openpi's decode raises)
  check_error(Robot::kLibero, f, "'prompt' is not UTF-8 text (byte 11 of 12)");
  f["prompt"].text = std::string("\xed\xa0\x80", 3);  // an encoded surrogate
  check_error(Robot::kLibero, f, "'prompt' is not UTF-8 text (byte 0 of 3)");
  f["prompt"].text = std::string("\xc0\xaf", 2);  // overlong '/'
  check_error(Robot::kLibero, f, "'prompt' is not UTF-8 text (byte 0 of 2)");
  Fields a;
  a["state"].tensor = torch::zeros({14});
  a["images/cam_top"].tensor = torch::zeros({3, 4, 4}, torch::kUInt8);
  check_error(Robot::kAloha, a, "unknown ALOHA camera 'cam_top'");
  a.erase("images/cam_top");
  a["images/cam_high"].tensor = torch::zeros({4, 4, 3}, torch::kUInt8);
  check_error(Robot::kAloha, a, "'images/cam_high' has shape [4, 4, 3], expected uint8 [3,H,W]");
  CHECK_THROWS_WITH(serve::parse_robot("franka"), Contains("--robot: got 'franka', expected libero, aloha, droid or raw"));
}

TEST_CASE("robot profiles: NaN or infinite values and misspelled keys are errors naming the key", "[serve][unit][inputs]") {
  auto f = libero(torch::full({8, 8, 3}, 0.5f));
  f["observation/image"].tensor[2][3][0] = NAN;  // min() and max() are NaN
  check_error(Robot::kLibero, f, "'observation/image' holds NaN at [2, 3, 0], expected finite values");
  f = libero(torch::zeros({8, 8, 3}, torch::kUInt8));
  f["observation/state"].tensor[5] = -INFINITY;
  check_error(Robot::kLibero, f, "'observation/state' holds -Inf at [5], expected finite values");
  f = libero(torch::zeros({8, 8, 3}, torch::kUInt8));
  f["observation/wrist_imag"].tensor = torch::zeros({8, 8, 3}, torch::kUInt8);
  check_error(Robot::kLibero, f, "unknown key 'observation/wrist_imag' (did you mean 'observation/wrist_image'?) for --robot libero");
  f = libero(torch::zeros({8, 8, 3}, torch::kUInt8));
  f["episode_id"].tensor = torch::zeros({1});  // unrelated extras are still ignored, as openpi does
  CHECK_NOTHROW(serve::to_model_request(Robot::kLibero, f, std::nullopt));

  Fields raw;
  raw["state"].tensor = torch::zeros({4});
  raw["image/base_0_rgb"].tensor = torch::zeros({8, 8, 3}, torch::kUInt8);
  raw["image_mazk/base_0_rgb"].tensor = torch::zeros({}, torch::kBool);
  raw["prompt"].text = "go";
  check_error(Robot::kRaw, raw, "unknown key 'image_mazk/base_0_rgb' (did you mean 'image_mask/base_0_rgb'?)");
  raw.erase("image_mazk/base_0_rgb");
  raw["image/base_0_rgb"].tensor = torch::full({8, 8, 3}, INFINITY);
  check_error(Robot::kRaw, raw, "'image/base_0_rgb' holds +Inf at [0, 0, 0]");
  Fields a;
  a["state"].tensor = torch::zeros({14});
  a["images/cam_high"].tensor = torch::zeros({3, 4, 4}, torch::kUInt8);
  a["images_cam_left_wrist"].tensor = torch::zeros({3, 4, 4}, torch::kUInt8);
  a["prompt"].text = "go";
  check_error(Robot::kAloha, a, "unknown key 'images_cam_left_wrist' (did you mean 'images/cam_left_wrist'?)");
}

TEST_CASE("robot profiles: every profile reads a previous chunk as rows of the request's batch", "[serve][unit]") {
  auto f = libero(torch::zeros({4, 4, 3}, torch::kUInt8));
  CHECK_FALSE(serve::previous_chunk_of(f, serve::to_model_request(Robot::kLibero, f, std::nullopt)).robot_rows.defined());
  f["prev_action_chunk"].tensor = torch::rand({5, 7}, torch::kFloat64);  // e.g. a nested list: float64
  f["inference_delay"].tensor = torch::scalar_tensor(2, torch::kLong);
  f["execute_horizon"].tensor = torch::scalar_tensor(4, torch::kLong);
  const auto chunk = serve::previous_chunk_of(f, serve::to_model_request(Robot::kLibero, f, std::nullopt));
  REQUIRE(chunk.robot_rows.sizes() == torch::IntArrayRef({1, 5, 7}));
  CHECK(chunk.robot_rows.scalar_type() == torch::kFloat32);
  CHECK(chunk.delay == 2);
  CHECK(chunk.execute_horizon == 4);

  // A batched raw request: one chunk per row of the batch.
  Fields raw;
  raw["state"].tensor = torch::zeros({3, 8});
  raw["image/base_0_rgb"].tensor = torch::zeros({3, 4, 4, 3}, torch::kUInt8);
  raw["prompt"].text = "go";
  raw["prev_action_chunk"].tensor = torch::rand({3, 5, 8});
  const auto req = serve::to_model_request(Robot::kRaw, raw, std::nullopt);
  CHECK(req.tensors.count("prev_action_chunk") == 0);  // not a model input
  CHECK(serve::previous_chunk_of(raw, req).robot_rows.sizes() == torch::IntArrayRef({3, 5, 8}));
  raw["prev_action_chunk"].tensor = torch::rand({5, 8});
  CHECK_THROWS_WITH(serve::previous_chunk_of(raw, req),
                    Contains("observation: 'prev_action_chunk' has shape [5, 8] and dtype Float, expected numbers "
                             "[B,R,D] with B = 3"));
  f["inference_delay"].text = "2";
  f["inference_delay"].tensor = torch::Tensor();
  CHECK_THROWS_WITH(serve::previous_chunk_of(f, serve::to_model_request(Robot::kLibero, f, std::nullopt)),
                    Contains("'inference_delay' is text, expected an int"));
  f.erase("inference_delay");
  f["inference_delai"].tensor = torch::scalar_tensor(2, torch::kLong);
  check_error(Robot::kLibero, f, "unknown key 'inference_delai' (did you mean 'inference_delay'?)");
}
