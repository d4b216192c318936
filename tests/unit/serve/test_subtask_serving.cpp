// pi0-serve with a model trained with train.subtask (docs/subtask.md): the metadata announces the subtask decoding,
// every answer carries the decoded subtask under one extra key, and a plain bundle's answers keep openpi's keys only.
#include <catch2/catch.hpp>

#include "pi0/serve/policy.h"
#include "pi0/serve/server.h"
#include "unit/serve/serve_fixture.h"

using namespace pi0;
using namespace pi0::serve_test;

TEST_CASE("pi0-serve: a subtask model answers its decoded subtask under an extra key and the actions after it",
          "[serve][subtask]") {
  TempDir dir("pi0serve");
  const auto b = make_tiny_bundle(dir, "libero", torch::kFloat32, "", 0,
                                  ", subtask: {enabled: true, key: subtask_index, max_tokens: 7}");
  LiveServer live(b, serve::Robot::kLibero);
  WsClient c(live.port());
  REQUIRE(c.metadata.contains("subtask"));
  CHECK(c.metadata.at("subtask").at("cue") == "Subtask: ");
  CHECK(c.metadata.at("subtask").at("max_tokens") == 7);

  const auto fields = libero_fields(3);
  const auto expected = live.policy.infer(fields);
  REQUIRE(expected.subtask.is_string());
  const auto r = c.infer(serve::encode_fields(fields));
  REQUIRE(r.count("subtask") == 1);
  CHECK(*r.at("subtask").text == expected.subtask.get<std::string>());
  CHECK(max_abs_diff(r.at("actions").tensor, expected.actions) == 0.0);
  CHECK(r.size() == 4);  // openpi's three keys (actions and the two timings) and the subtask

  // The same weights exported without train.subtask (make_tiny_bundle seeds them alike) sample without a block:
  // other actions, so the decoded subtask reaches the action expert.
  TempDir plain_dir("pi0serve");
  const auto plain = make_tiny_bundle(plain_dir, "libero");
  serve::Policy plain_policy(io::load_bundle(plain.bundle), policy_options(plain, serve::Robot::kLibero));
  const auto without = plain_policy.infer(fields);
  CHECK(without.subtask.is_null());
  CHECK(max_abs_diff(without.actions, expected.actions) > 1e-5);
  // Repeated requests decode the same subtask (greedy) and answer the same actions.
  const auto again = live.policy.infer(fields);
  CHECK(again.subtask == expected.subtask);
  CHECK(max_abs_diff(again.actions, expected.actions) == 0.0);
}

TEST_CASE("pi0-serve: a plain bundle announces no subtask and answers without the key", "[serve][subtask]") {
  TempDir dir("pi0serve");
  const auto b = make_tiny_bundle(dir, "libero");
  LiveServer live(b, serve::Robot::kLibero);
  WsClient c(live.port());
  CHECK_FALSE(c.metadata.contains("subtask"));
  const auto r = c.infer(serve::encode_fields(libero_fields(3)));
  CHECK(r.count("subtask") == 0);
  CHECK(live.policy.infer(libero_fields(3)).subtask.is_null());
}

TEST_CASE("encode_response sends the subtask only when there is one", "[serve][unit][subtask]") {
  serve::Response r;
  r.actions = torch::zeros({4, 7});
  std::string plain = serve::encode_response(r);
  r.subtask = "close the gripper";
  const std::string with = serve::encode_response(r);
  CHECK(with.size() > plain.size());
  CHECK(with.find("subtask") != std::string::npos);
  CHECK(with.find("close the gripper") != std::string::npos);
  CHECK(plain.find("subtask") == std::string::npos);
}
