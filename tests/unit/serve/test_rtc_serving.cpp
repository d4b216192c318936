// Real-time chunking through pi0-serve and pi0-infer (docs/serving.md, "Real-time chunking"): a request's
// prev_action_chunk, inference_delay and execute_horizon; trained mode's committed rows, guided mode's pull towards
// them, plain requests untouched, a bad chunk as one error line, the metadata, and the --rtc flags of both apps.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

#include <msgpack.hpp>

#include "pi0/serve/policy.h"
#include "pi0/serve/server.h"
#include "support/log_capture.h"
#include "unit/serve/serve_fixture.h"

using namespace pi0;
using namespace pi0::serve_test;
using Catch::Contains;

namespace {

constexpr int64_t kTrainedDelay = 2;  // train.rtc_max_delay of the trained bundles (below kHorizon)
constexpr int64_t kLiberoDims = 7;

serve::PolicyOptions rtc_options(const TinyBundle& b, const std::string& mode, int64_t max_batch = 0) {
  auto o = policy_options(b, serve::Robot::kLibero, max_batch);
  o.rtc.mode = mode;
  return o;
}

// A LIBERO observation continuing `rows` [R,7] (robot units), `delay` of them executing meanwhile.
serve::Fields continuing(int64_t seed, const torch::Tensor& rows, int64_t delay) {
  auto f = libero_fields(seed);
  f["prev_action_chunk"].tensor = rows;
  f["inference_delay"].tensor = torch::scalar_tensor(delay, torch::kLong);
  return f;
}

// `fields` and `key` as a msgpack nested list of floats: what kai0's clients send (ndarray.tolist()).
std::string with_nested_list(const serve::Fields& fields, const std::string& key, const torch::Tensor& rows_RD) {
  REQUIRE(fields.size() < 15);  // the fields' own map header is then one byte (a fixmap), replaced below
  const std::string frame = serve::encode_fields(fields);
  msgpack::sbuffer b;
  msgpack::packer<msgpack::sbuffer> pk(b);
  pk.pack_map(static_cast<uint32_t>(fields.size() + 1));
  pk.pack(key);
  const auto rows = rows_RD.to(torch::kFloat64).contiguous();
  pk.pack_array(static_cast<uint32_t>(rows.size(0)));
  for (int64_t i = 0; i < rows.size(0); ++i) {
    pk.pack_array(static_cast<uint32_t>(rows.size(1)));
    for (int64_t j = 0; j < rows.size(1); ++j) pk.pack(rows[i][j].item<double>());
  }
  return std::string(b.data(), b.size()) + frame.substr(1);
}

// The committed rows come back through normalize → model space → unnormalize in float32: a few roundings of 2^-24
// each on values below 5 (the rows and the stats' q01, q99: tiny bundles' actions are below 3), under 2e-6; the
// check allows 1e-5 of the rows' scale.
double round_trip_tolerance(const torch::Tensor& rows) {
  return 1e-5 * std::max(1.0, rows.abs().max().item<double>());
}

torch::Tensor actions_of(const serve::Fields& reply) { return reply.at("actions").tensor; }

}  // namespace

TEST_CASE("pi0-serve real-time chunking: trained mode answers the committed rows as they were sent", "[serve]") {
  TempDir dir("pi0serve_rtc");
  const auto b = make_tiny_bundle(dir, "libero", torch::kFloat32, "", kTrainedDelay);
  LiveServer live(b, rtc_options(b, "auto"));
  WsClient c(live.port());
  const auto plain = c.infer(serve::encode_fields(libero_fields(3)));
  CHECK(plain.count("rtc/mode") == 0);
  // The robot executed row 0 of that answer; rows 1..3 are still to run when it captures the next observation.
  const auto rows = actions_of(plain).narrow(0, 1, kHorizon - 1).contiguous();

  const auto r = c.infer(serve::encode_fields(continuing(4, rows, kTrainedDelay)));
  CHECK(*r.at("rtc/mode").text == "trained");  // auto: the bundle was trained for this delay
  CHECK(r.at("rtc/delay").tensor.item<int64_t>() == kTrainedDelay);
  const auto got = actions_of(r);
  REQUIRE(got.sizes() == torch::IntArrayRef({kHorizon, kLiberoDims}));
  const auto committed = rows.narrow(0, 0, kTrainedDelay);
  INFO("committed rows " << committed << "\nanswer " << got);
  CHECK(max_abs_diff(got.narrow(0, 0, kTrainedDelay), committed) <= round_trip_tolerance(committed));
  // The rows after them continue the committed ones: not what plain sampling of the same observation gives.
  const auto plain4 = live.policy.infer(libero_fields(4)).actions;
  CHECK(max_abs_diff(got.narrow(0, kTrainedDelay, kHorizon - kTrainedDelay),
                     plain4.narrow(0, kTrainedDelay, kHorizon - kTrainedDelay)) > 1e-6);

  // The rows as a nested list of float64 (kai0's clients): the same float32 values, the same answer.
  auto fields = libero_fields(4);
  fields["inference_delay"].tensor = torch::scalar_tensor(kTrainedDelay, torch::kLong);
  const auto listed = c.infer(with_nested_list(fields, "prev_action_chunk", rows));
  CHECK(max_abs_diff(actions_of(listed), got) == 0.0);
  CHECK(*listed.at("rtc/mode").text == "trained");

  // Trained mode with d = 0 samples as plain sampling does, bit for bit, and says which mode answered.
  LiveServer trained(b, rtc_options(b, "trained"));
  WsClient t(trained.port());
  const auto zero = t.infer(serve::encode_fields(continuing(4, rows, 0)));
  CHECK(*zero.at("rtc/mode").text == "trained");
  CHECK(zero.at("rtc/delay").tensor.item<int64_t>() == 0);
  CHECK(torch::equal(actions_of(zero), plain4));
}

TEST_CASE("pi0-serve real-time chunking: guided mode pulls the answer towards the sent rows and differs from plain "
          "sampling", "[serve]") {
  TempDir dir("pi0serve_rtc");
  const auto b = make_tiny_bundle(dir, "libero");  // trained without delays: auto means guided
  LiveServer live(b, rtc_options(b, "auto"));
  WsClient c(live.port());
  const auto rows = actions_of(c.infer(serve::encode_fields(libero_fields(3)))).narrow(0, 1, kHorizon - 1).contiguous();
  const auto plain4 = live.policy.infer(libero_fields(4)).actions;
  constexpr int64_t kDelay = 1;

  const auto r = c.infer(serve::encode_fields(continuing(4, rows, kDelay)));
  CHECK(*r.at("rtc/mode").text == "guided");
  CHECK(r.at("rtc/delay").tensor.item<int64_t>() == kDelay);
  const auto got = actions_of(r);
  CHECK(torch::isfinite(got).all().item<bool>());
  CHECK(max_abs_diff(got, plain4) > 1e-4);
  // The committed row has the full weight: the answer's row 0 is nearer the sent one than plain sampling's.
  const double guided_gap = max_abs_diff(got.narrow(0, 0, kDelay), rows.narrow(0, 0, kDelay));
  const double plain_gap = max_abs_diff(plain4.narrow(0, 0, kDelay), rows.narrow(0, 0, kDelay));
  INFO("guided " << guided_gap << ", plain " << plain_gap);
  CHECK(guided_gap < plain_gap);

  // The exact Jacobian (one backward pass per step) runs on the model thread, which samples under no_grad.
  auto exact_options = rtc_options(b, "guided");
  exact_options.rtc.guidance.jacobian = model::RtcJacobian::kExact;
  LiveServer exact(b, exact_options);
  WsClient e(exact.port());
  const auto x = e.infer(serve::encode_fields(continuing(4, rows, kDelay)));
  CHECK(*x.at("rtc/mode").text == "guided");
  CHECK(torch::isfinite(actions_of(x)).all().item<bool>());
  CHECK(max_abs_diff(actions_of(x), plain4) > 1e-4);
}

TEST_CASE("pi0-serve real-time chunking: requests without its keys get the answer of a server without it", "[serve]") {
  TempDir dir("pi0serve_rtc");
  const auto b = make_tiny_bundle(dir, "libero", torch::kFloat32, "", kTrainedDelay);
  LiveServer live(b, rtc_options(b, "auto"));
  serve::Policy off(io::load_bundle(b.bundle), rtc_options(b, "off"));
  WsClient c(live.port());
  for (int64_t seed : {5, 6}) {
    const auto r = c.infer(serve::encode_fields(libero_fields(seed)));
    CHECK(torch::equal(actions_of(r), off.infer(libero_fields(seed)).actions));
    for (const auto& [key, field] : r) {  // openpi's answer keys only
      INFO(key);
      CHECK((key == "actions" || key.rfind("policy_timing/", 0) == 0 || key.rfind("server_timing/", 0) == 0));
    }
  }
  // --rtc off ignores the keys, even malformed ones (openpi ignores keys it does not use).
  auto rows = torch::full({2, kLiberoDims}, std::nan(""));
  const auto ignored = off.infer(continuing(5, rows, 3));
  CHECK(torch::equal(ignored.actions, off.infer(libero_fields(5)).actions));
  CHECK(ignored.rtc.is_null());
}

TEST_CASE("pi0-serve real-time chunking: requests with a previous chunk run alone and plain ones still share model "
          "calls", "[serve]") {
  TempDir dir("pi0serve_rtc");
  const auto b = make_tiny_bundle(dir, "libero", torch::kFloat32, "", kTrainedDelay);
  serve::ServerOptions so;
  so.io_threads = 4;
  LiveServer live(b, rtc_options(b, "auto", /*max_batch=*/8), so);
  serve::Policy single(io::load_bundle(b.bundle), rtc_options(b, "auto", 1));
  const auto rows = single.infer(libero_fields(3)).actions.narrow(0, 1, kHorizon - 1).contiguous();
  constexpr int kClients = 6, kRequests = 8;
  std::vector<torch::Tensor> expected;
  std::vector<std::string> frames;
  for (int k = 0; k < kClients; ++k) {
    // Even clients plain; odd ones continue a chunk, trained (d = 2) or guided (d = 3, beyond the trained delay).
    const auto f = k % 2 == 0 ? libero_fields(400 + k) : continuing(400 + k, rows, k % 4 == 1 ? 2 : 3);
    expected.push_back(single.infer(f).actions);
    frames.push_back(serve::encode_fields(f));
  }
  std::atomic<int> correct{0}, failed{0};
  std::vector<std::thread> threads;
  for (int k = 0; k < kClients; ++k) {
    threads.emplace_back([&, k] {
      try {
        WsClient c(live.port());
        for (int i = 0; i < kRequests; ++i)
          if (max_abs_diff(actions_of(c.infer(frames[k])), expected[k]) <= 1e-5) correct++;
      } catch (const std::exception&) {  // e.g. an error frame: counted, not a crash of the test binary
        failed++;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failed == 0);
  CHECK(correct == kClients * kRequests);
  CHECK(live.policy.largest_batch() <= 3);  // at most the three plain clients together
}

TEST_CASE("pi0-serve real-time chunking: a bad previous chunk gets one error line and close 1011 and the next request "
          "is answered", "[serve]") {
  TempDir dir("pi0serve_rtc");
  const auto b = make_tiny_bundle(dir, "libero", torch::kFloat32, "", kTrainedDelay);
  LiveServer live(b, rtc_options(b, "auto"));
  LiveServer trained(b, rtc_options(b, "trained"));
  torch::manual_seed(9);
  const auto rows = torch::rand({3, kLiberoDims});
  struct Bad {
    std::string name;
    serve::Fields fields;
    std::string expected;
    bool trained_server = false;
  };
  std::vector<Bad> bad;
  bad.push_back({"delay beyond the rows", continuing(1, rows.narrow(0, 0, 2), 3),
                 "observation: inference_delay is 3; expected 0..2 (the rows of prev_action_chunk)"});
  {
    auto nan_rows = rows.clone();
    nan_rows[1][3] = std::nan("");
    bad.push_back({"NaN row", continuing(1, nan_rows, 1), "'prev_action_chunk' holds NaN at [1, 3]"});
  }
  bad.push_back({"wrong width", continuing(1, torch::rand({3, 6}), 1),
                 "'prev_action_chunk' has 6 dims per row, expected 7 (the rows as pi0-serve returned them)"});
  bad.push_back({"one row of a vector", continuing(1, torch::rand({kLiberoDims}), 0),
                 "'prev_action_chunk' has shape [7] and dtype Float, expected numbers [R,D]"});
  bad.push_back({"more rows than the horizon", continuing(1, torch::rand({kHorizon + 1, kLiberoDims}), 0),
                 "prev_action_chunk has 5 rows; at most the action horizon (4)"});
  bad.push_back({"negative delay", continuing(1, rows, -1), "inference_delay is -1; expected 0..3"});
  {
    auto f = continuing(1, rows, 2);
    f["execute_horizon"].tensor = torch::scalar_tensor(1, torch::kLong);
    bad.push_back({"execute_horizon below the delay", f, "execute_horizon is 1; expected 2..4"});
    f = libero_fields(1);
    f["inference_delay"].tensor = torch::scalar_tensor(2, torch::kLong);
    bad.push_back({"delay without rows", f, "inference_delay is 2 but no prev_action_chunk was given"});
    // The default is an absent key: -1 is no value a client can send, and the range holds with rows or without.
    f = continuing(1, rows, 0);
    f["execute_horizon"].tensor = torch::scalar_tensor(-1, torch::kLong);
    bad.push_back({"execute_horizon -1", f, "observation: execute_horizon is -1; expected 0..4 (from inference_delay "
                                            "to the action horizon)"});
    for (const int64_t h : {kHorizon + 95, int64_t{-3}}) {
      f = libero_fields(1);
      f["execute_horizon"].tensor = torch::scalar_tensor(h, torch::kLong);
      bad.push_back({"execute_horizon without rows", f, "execute_horizon is " + std::to_string(h) + "; expected 0..4"});
    }
    f = continuing(1, rows, 1);
    f["inference_delay"].tensor = torch::scalar_tensor(1.5, torch::kFloat64);
    bad.push_back({"fractional delay", f, "'inference_delay' is 1.5, expected a whole number"});
    f = libero_fields(1);
    f["prev_action_chunk"].text = "[[0, 1]]";
    bad.push_back({"rows as text", f, "'prev_action_chunk' is text, expected an array of numbers [R,D]"});
    f = libero_fields(1);
    f["prev_action_chunks"].tensor = rows;
    bad.push_back({"misspelled key", f, "(did you mean 'prev_action_chunk'?)"});
  }
  bad.push_back({"trained mode beyond the trained delay", continuing(1, rows, 3),
                 "inference_delay 3 is beyond what this policy was trained for (train.rtc_max_delay 2)", true});
  for (const auto& x : bad) {
    INFO(x.name);
    check_refused(x.trained_server ? trained.port() : live.port(), serve::encode_fields(x.fields), false, x.expected);
  }
  // Still serving: a good chunk on a new connection.
  WsClient c(live.port());
  const auto r = c.infer(serve::encode_fields(continuing(1, rows, 1)));
  CHECK(*r.at("rtc/mode").text == "trained");
}

TEST_CASE("pi0-serve real-time chunking: the metadata announces its modes and the bundle's trained delay", "[serve]") {
  TempDir dir("pi0serve_rtc");
  const auto b = make_tiny_bundle(dir, "libero", torch::kFloat32, "", kTrainedDelay);
  {
    LiveServer live(b, rtc_options(b, "auto"));
    WsClient c(live.port());
    const auto& rtc = c.metadata.at("rtc");
    CHECK(rtc.at("modes") == nlohmann::json({"guided", "trained"}));
    CHECK(rtc.at("default") == "auto");
    CHECK(rtc.at("trained_max_delay") == kTrainedDelay);
    CHECK(rtc.at("keys") == nlohmann::json({"prev_action_chunk", "inference_delay", "execute_horizon"}));
    CHECK(rtc.at("guided").at("jacobian") == "identity");
    CHECK(rtc.at("guided").at("schedule") == "exp");
    CHECK(rtc.at("guided").at("max_guidance_weight") == 10.0);
  }
  auto o = rtc_options(b, "off");
  CHECK(serve::Policy(io::load_bundle(b.bundle), o).metadata().at("rtc").at("modes") == nlohmann::json::array());
  o = rtc_options(b, "guided");
  o.rtc.guidance.schedule = model::RtcSchedule::kLinear;
  o.rtc.guidance.max_weight = 5.0;
  const auto md = serve::Policy(io::load_bundle(b.bundle), o).metadata().at("rtc");
  CHECK(md.at("modes") == nlohmann::json({"guided"}));
  CHECK(md.at("guided").at("schedule") == "linear");
  CHECK(md.at("guided").at("max_guidance_weight") == 5.0);

  o = rtc_options(b, "auto");
  o.metadata = {{"rtc", 1}};
  CHECK_THROWS_WITH(serve::Policy(io::load_bundle(b.bundle), o),
                    Contains("--metadata rtc: 'rtc' is a key pi0-serve's metadata sets itself"));
  o = rtc_options(b, "sometimes");
  CHECK_THROWS_WITH(serve::Policy(io::load_bundle(b.bundle), o),
                    Contains("--rtc: got 'sometimes', expected auto, guided, trained or off"));
  o = rtc_options(b, "auto");
  o.rtc.guidance.max_weight = 0;
  CHECK_THROWS_WITH(serve::Policy(io::load_bundle(b.bundle), o), Contains("--rtc-max-weight: got 0, expected a number > 0"));
}

// pi0-infer reads the same keys from its observation file and answers as pi0-serve does (the same inputs, noise
// and steps: within the 1e-5 the openpi-client case allows between the two apps).
TEST_CASE("pi0-infer continues a previous chunk from its observation file as pi0-serve does", "[serve]") {
  if (!testing::apps_built({"pi0-infer"})) return;
  TempDir dir("pi0infer_rtc");
  const auto b = make_tiny_bundle(dir, "libero", torch::kFloat32, "", kTrainedDelay);
  serve::Policy policy(io::load_bundle(b.bundle), rtc_options(b, "auto"));
  const auto rows = policy.infer(libero_fields(3)).actions.narrow(0, 1, kHorizon - 1).contiguous();
  const auto fields = continuing(4, rows, kTrainedDelay);
  const auto served = policy.infer(fields);
  REQUIRE(served.rtc.at("mode") == "trained");

  // LIBERO's profile by hand: state, the two cameras as [1,H,W,3], the prompt as text.
  const std::string obs = dir.str("obs.safetensors"), out = dir.str("out.safetensors");
  io::save_safetensors(obs, {{"state", fields.at("observation/state").tensor.to(torch::kFloat32).unsqueeze(0)},
                             {"image/base_0_rgb", fields.at("observation/image").tensor.unsqueeze(0)},
                             {"image/left_wrist_0_rgb", fields.at("observation/wrist_image").tensor.unsqueeze(0)},
                             {"prev_action_chunk", rows},
                             {"inference_delay", torch::tensor({kTrainedDelay})}});
  const std::string common = "--bundle " + b.bundle + " --obs " + obs + " --out " + out + " --prompt '" +
                             *fields.at("prompt").text + "' --noise " + b.noise + " --num-steps 2";
  const auto r = testing::run_app_process("pi0-infer", common, dir);
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Contains("real-time chunking: trained, inference_delay 2"));
  const auto got = io::read_safetensors(out).at("actions_unnormalized")[0].narrow(-1, 0, kLiberoDims);
  CHECK(max_abs_diff(got, served.actions) <= 1e-5);
  CHECK(max_abs_diff(got.narrow(0, 0, kTrainedDelay), rows.narrow(0, 0, kTrainedDelay)) <=
        round_trip_tolerance(rows));

  // A delay beyond the rows: one line naming the file, exit 2.
  io::save_safetensors(obs, {{"state", fields.at("observation/state").tensor.to(torch::kFloat32).unsqueeze(0)},
                             {"image/base_0_rgb", fields.at("observation/image").tensor.unsqueeze(0)},
                             {"prev_action_chunk", rows},
                             {"inference_delay", torch::tensor({5})}});
  const auto e = testing::run_app_process("pi0-infer", common, dir);
  INFO("stderr: " << e.err);
  CHECK(e.code == 2);
  CHECK_THAT(e.err, Contains("pi0-infer: error: " + obs + ": inference_delay is 5; expected 0..3"));
  CHECK(std::count(e.err.begin(), e.err.end(), '\n') == 1);

  // execute_horizon -1 is no default a file can give (the default is its absence): outside d..H, exit 2.
  io::save_safetensors(obs, {{"state", fields.at("observation/state").tensor.to(torch::kFloat32).unsqueeze(0)},
                             {"image/base_0_rgb", fields.at("observation/image").tensor.unsqueeze(0)},
                             {"prev_action_chunk", rows},
                             {"inference_delay", torch::tensor({kTrainedDelay})},
                             {"execute_horizon", torch::tensor({-1})}});
  const auto h = testing::run_app_process("pi0-infer", common, dir);
  INFO("stderr: " << h.err);
  CHECK(h.code == 2);
  CHECK_THAT(h.err, Contains("pi0-infer: error: " + obs + ": execute_horizon is -1; expected 2..4"));
  CHECK(std::count(h.err.begin(), h.err.end(), '\n') == 1);
}

TEST_CASE("pi0-serve and pi0-infer: bad --rtc flag values are one-line errors with exit code 2", "[serve]") {
  if (!testing::apps_built({"pi0-serve", "pi0-infer"})) return;
  TempDir dir("pi0serve_rtc");
  struct Case {
    std::string flags, expected;
  };
  const std::vector<Case> cases = {
      {"--rtc sometimes", "--rtc: got 'sometimes', expected auto, guided, trained or off"},
      {"--rtc-jacobian full", "--rtc-jacobian: got 'full', expected identity or exact"},
      {"--rtc-schedule cosine", "--rtc-schedule: got 'cosine', expected exp, linear, ones or zeros"},
      {"--rtc-max-weight 0", "--rtc-max-weight: got '0', expected a number > 0"},
      {"--rtc-max-weight -1", "--rtc-max-weight: got '-1', expected a number > 0"},
      {"--rtc-max-weight nan", "--rtc-max-weight: got 'nan', expected a number > 0"},
      {"--rtc-max-weight 5x", "--rtc-max-weight: got '5x', expected a number > 0"},
  };
  // The flags are checked before anything is read: the paths need not exist.
  const std::vector<std::pair<std::string, std::string>> apps = {
      {"pi0-serve", "--bundle " + dir.str("nowhere")},
      {"pi0-infer", "--bundle " + dir.str("nowhere") + " --obs " + dir.str("obs") + " --out " + dir.str("out")}};
  for (const auto& [app, args] : apps) {
    for (const auto& c : cases) {
      INFO(app << " " << c.flags);
      const auto r = testing::run_app_process(app, args + " " + c.flags, dir);
      INFO("stderr: " << r.err);
      CHECK(r.code == 2);
      CHECK(r.err.rfind(app + ": error: ", 0) == 0);
      CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
      CHECK_THAT(r.err, Contains(c.expected));
    }
  }
}

// Issue 49 item 11: --rtc trained on a bundle trained without delays warns at start (it used to say nothing until
// the first request was refused); a bundle trained with delays starts without the warning.
TEST_CASE("pi0-serve: --rtc trained on a bundle trained without delays warns at start", "[serve][rtc]") {
  TempDir dir("pi0serve_rtc_warn");
  const auto plain = make_tiny_bundle(dir, "libero");
  {
    testing::LogCapture log;
    serve::Policy policy(io::load_bundle(plain.bundle), rtc_options(plain, "trained"));
    CHECK_THAT(log.text(), Contains("pi0-serve: --rtc trained, but the bundle was trained without delays "
                                    "(train.rtc_max_delay 0)") &&
                               Contains("serve it with --rtc auto or guided"));
    policy.stop();
  }
  TempDir dir2("pi0serve_rtc_warn_trained");
  const auto trained = make_tiny_bundle(dir2, "libero", torch::kFloat32, "", kTrainedDelay);
  testing::LogCapture log;
  serve::Policy policy(io::load_bundle(trained.bundle), rtc_options(trained, "trained"));
  CHECK(log.text().find("trained without delays") == std::string::npos);
  policy.stop();
}
