// Policy metadata (issue 23 item 9): openpi's ALOHA configs serve {"reset_pose": [0, -1.5, 1.5, 0, 0, 0]} and its
// ALOHA example resets the arms there; the training config declares serve.policy_metadata over the defaults of its
// data's robot, and the value travels with the config (a bundle's config.yaml).
#include <catch2/catch.hpp>

#include "pi0/common/check.h"
#include "pi0/config/config.h"
#include "pi0/config/policy_metadata.h"

using namespace pi0::config;
using Catch::Contains;

namespace {
Config parse(const std::string& yaml, std::vector<std::string> overrides = {}) {
  return parse_config(YAML::Load(yaml), "run.yaml", overrides);
}
const nlohmann::json kOpenpiResetPose = nlohmann::json::array({0, -1.5, 1.5, 0, 0, 0});
}  // namespace

TEST_CASE("policy metadata: openpi's defaults per robot, the config's keys over them", "[unit][config]") {
  CHECK(policy_metadata(parse("data: {dataset: {format: aloha}}\n")) == nlohmann::json({{"reset_pose", kOpenpiResetPose}}));
  CHECK(policy_metadata(parse("data: {dataset: {format: libero}}\n")) == nlohmann::json::object());
  // LeRobot data in ALOHA's convention is ALOHA data; without it, no robot defaults.
  CHECK(policy_metadata(parse("data: {dataset: {format: lerobot, adapt_to_pi: 'true'}}\n")).at("reset_pose") ==
        kOpenpiResetPose);
  CHECK(policy_metadata(parse("data: {dataset: {format: lerobot}}\n")).empty());

  const auto c = parse(R"(
data: {dataset: {format: aloha}}
serve:
  policy_metadata:
    reset_pose: [0.1, -1.2, 1.3, 0, 0, 0]
    camera: front
    quoted: "7"
    fps: 50
    ratio: 0.5
    flag: true
    nested: {a: [1, two]}
)");
  const auto md = policy_metadata(c);
  CHECK(md.at("reset_pose") == nlohmann::json({0.1, -1.2, 1.3, 0, 0, 0}));
  CHECK(md.at("camera") == "front");
  CHECK(md.at("quoted") == "7");  // quoted YAML stays a string
  CHECK(md.at("fps") == 50);
  CHECK(md.at("fps").is_number_integer());
  CHECK(md.at("ratio") == 0.5);
  CHECK(md.at("flag") == true);
  CHECK(md.at("nested") == nlohmann::json({{"a", {1, "two"}}}));

  // null removes a default; --set reaches single keys.
  CHECK_FALSE(policy_metadata(parse("data: {dataset: {format: aloha}}\nserve: {policy_metadata: {reset_pose: null}}\n"))
                  .contains("reset_pose"));
  CHECK(policy_metadata(parse("data: {dataset: {format: aloha}}\n", {"serve.policy_metadata.reset_pose=[1, 2]"}))
            .at("reset_pose") == nlohmann::json({1, 2}));

  // The resolved config (a bundle's config.yaml) carries the declaration.
  const auto again = parse_config(to_yaml(c), "config.yaml");
  CHECK(policy_metadata(again) == md);
}

TEST_CASE("policy metadata: what pi0-serve could not send is refused at config load", "[unit][config]") {
  REQUIRE_THROWS_WITH(parse("serve: {policy_metadata: [1, 2]}\n"),
                      Contains("serve.policy_metadata must be a mapping of names to values"));
  REQUIRE_THROWS_WITH(parse("serve: {policy_metadata: {robot: franka}}\n"),
                      Contains("serve.policy_metadata.robot: 'robot' is a key pi0-serve's metadata sets itself"));
  REQUIRE_THROWS_WITH(parse("serve: {policy_metadata: {pose: [1, .inf]}}\n"),
                      Contains("serve.policy_metadata.pose[1] must be a finite number (got '.inf')"));
  REQUIRE_THROWS_WITH(parse("serve:\n  policy_metadata:\n    pose:\n      ? [1]\n      : 2\n"),
                      Contains("serve.policy_metadata.pose: a map key that is not a name"));
  REQUIRE_THROWS_WITH(parse("serve: {policy_metadata: {pose: 1}, extra: 2}\n"), Contains("unknown key 'serve.extra'"));
  REQUIRE_THROWS_WITH(parse("serve: {policy_metadata:}\n"), Contains("serve.policy_metadata has no value"));
}
