// Untrusted inputs (issue 11): non-finite and misspelled observation keys, LIBERO groups that are not episodes,
// datasets with none of the configured cameras, and warnings that must not flood the log.
#include <catch2/catch.hpp>

#include <cmath>

#include "data_test_util.h"
#include "pi0/common/check.h"
#include "pi0/common/log_line.h"
#include "pi0/data/dataset.h"
#include "pi0/data/example_data.h"
#include "pi0/data/hdf5_file.h"
#include "pi0/data/observation_file.h"
#include "pi0/data/tokenizer.h"
#include "support/log_capture.h"

using namespace pi0;
using namespace pi0::data;
using Catch::Contains;

namespace {

using testing::LogCapture;

ObservationFormat tiny_format(const NormStats& stats) {
  ObservationFormat f;
  f.transform.image_size = 8;
  f.transform.action_dim = 6;
  f.transform.norm = "zscore";
  f.transform = f.transform.resolved();
  f.norm_stats = &stats;
  f.vocab_size = 100;
  return f;
}

NormStats tiny_stats() {
  NormStats s;
  s.keys["state"] = KeyStats{{0, 0, 0, 0}, {1, 1, 1, 1}, {}, {}};
  return s;
}

std::map<std::string, torch::Tensor> good_obs() {
  std::map<std::string, torch::Tensor> t;
  t["state"] = torch::zeros({2, 4});
  t["image/base_0_rgb"] = torch::zeros({2, 8, 8, 3});
  t["tokenized_prompt"] = torch::ones({2, 5}, torch::kLong);
  t["tokenized_prompt_mask"] = torch::ones({2, 5}, torch::kBool);
  return t;
}

std::string read_error(const std::map<std::string, torch::Tensor>& t) {
  const NormStats stats = tiny_stats();
  try {
    read_observation(t, tiny_format(stats), "obs.safetensors", std::nullopt, nullptr);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("observation reader: a good observation reads, masks default to true", "[unit][data][inputs]") {
  const NormStats stats = tiny_stats();
  const auto in = read_observation(good_obs(), tiny_format(stats), "obs.safetensors", std::nullopt, nullptr);
  CHECK(in.observation.state.sizes() == torch::IntArrayRef({2, 6}));
  CHECK(in.observation.image_masks[0].all().item<bool>());
  CHECK(!in.observation.image_masks[1].any().item<bool>());
}

TEST_CASE("observation reader: NaN and infinite state or float image name the key", "[unit][data][inputs]") {
  auto nan_state = good_obs();
  nan_state["state"][1][2] = NAN;
  CHECK_THAT(read_error(nan_state), Contains("obs.safetensors: 'state' holds NaN at [1, 2], expected finite values"));
  auto inf_state = good_obs();
  inf_state["state"][0][0] = -INFINITY;
  CHECK_THAT(read_error(inf_state), Contains("'state' holds -Inf at [0, 0]"));
  auto pinf_state = good_obs();
  pinf_state["state"] = pinf_state["state"].to(torch::kFloat64);
  pinf_state["state"][0][3] = INFINITY;
  CHECK_THAT(read_error(pinf_state), Contains("'state' holds +Inf at [0, 3]"));
  auto nan_image = good_obs();
  nan_image["image/base_0_rgb"][0][4][4][1] = NAN;  // min() and max() of this image are NaN: passed the range check
  CHECK_THAT(read_error(nan_image), Contains("'image/base_0_rgb' holds NaN at [0, 4, 4, 1]"));
  auto huge_state = good_obs();  // finite in float64, infinite in the model's float32
  huge_state["state"] = huge_state["state"].to(torch::kFloat64);
  huge_state["state"][0][1] = 1e300;
  CHECK_THAT(read_error(huge_state), Contains("obs.safetensors: 'state' normalized with norm stats (a value beyond "
                                              "float32's range?) holds +Inf at [0, 1]"));
  auto nan_noise = good_obs();
  nan_noise["noise"] = torch::zeros({2, 3});
  nan_noise["noise"][1][1] = NAN;
  CHECK_THAT(read_error(nan_noise), Contains("'noise' holds NaN"));
}

TEST_CASE("observation reader: unknown keys are errors with a did-you-mean", "[unit][data][inputs]") {
  auto typo = good_obs();
  typo["image_mazk/base_0_rgb"] = torch::zeros({2}, torch::kBool);
  CHECK_THAT(read_error(typo), Contains("obs.safetensors: unknown key 'image_mazk/base_0_rgb' (did you mean "
                                        "'image_mask/base_0_rgb'?)"));
  auto camera = good_obs();
  camera["image/base_rgb"] = torch::zeros({2, 8, 8, 3});
  CHECK_THAT(read_error(camera), Contains("unknown key 'image/base_rgb' (did you mean 'image/base_0_rgb'?)"));
  auto unrelated = good_obs();
  unrelated["episode_\x87id"] = torch::zeros({1});
  const std::string e = read_error(unrelated);
  CHECK_THAT(e, Contains("unknown key 'episode_\\x87id', expected one of state, image/<camera>"));
  CHECK(e.find('\x87') == std::string::npos);
}

TEST_CASE("LIBERO: links under data/ that are not demo_N are skipped with a warning that lists them", "[unit][data][inputs]") {
  test::TempDir dir;
  const std::string path = dir.file("groups.hdf5");
  {
    H5File f = H5File::create(path);
    const int64_t T = 3;
    std::vector<double> actions(T * 7, 0.1), ee(T * 6, 0.2), grip(T * 2, 0.0);
    std::vector<uint8_t> img(T * 4 * 4 * 3, 7);
    for (const std::string g : {"data/demo_0", "data/demo_1"}) {
      f.create_group(g + "/obs");
      f.write(g + "/actions", {T, 7}, H5T_NATIVE_DOUBLE, actions.data());
      f.write(g + "/obs/ee_states", {T, 6}, H5T_NATIVE_DOUBLE, ee.data());
      f.write(g + "/obs/gripper_states", {T, 2}, H5T_NATIVE_DOUBLE, grip.data());
      f.write(g + "/obs/agentview_rgb", {T, 4, 4, 3}, H5T_NATIVE_UINT8, img.data());
    }
    f.create_group("data/demo_1_old");  // std::stoll read this as demo 1
    f.write("data/mask", {T}, H5T_NATIVE_DOUBLE, actions.data());
    f.write_string_attr("data", "problem_info", "{\"language_instruction\": \"test\"}");
  }
  LogCapture log;
  DatasetOptions o;
  o.paths = {path};
  RobotDataset ds(o);
  CHECK(ds.num_episodes() == 2);
  CHECK(ds.size() == 6);
  CHECK_THAT(log.text(), Contains("skipped 2 link(s) under data/ not named demo_N (robomimic's episode groups): "
                                  "'demo_1_old', 'mask'"));
}

TEST_CASE("dataset: none of the configured cameras in the file is an error listing its image keys", "[unit][data][inputs]") {
  test::TempDir dir;
  ExampleDataOptions eo;
  eo.episodes = 1;
  eo.steps = 3;
  eo.image_size = 8;
  const std::string path = write_example_libero(dir.str(), eo);
  DatasetOptions o;
  o.paths = {path};
  o.cameras = {{"base_0_rgb", "agentview_image"}, {"left_wrist_0_rgb", "robot0_eye_in_hand_image"}};
  try {
    RobotDataset ds(o);
    FAIL("expected a UserError");
  } catch (const UserError& e) {
    CHECK_THAT(e.what(), Contains(path + ": none of the cameras in dataset.cameras {base_0_rgb: agentview_image, "
                                         "left_wrist_0_rgb: robot0_eye_in_hand_image} exists in data/demo_0; its image "
                                         "keys are 'data/demo_0/obs/agentview_rgb', 'data/demo_0/obs/eye_in_hand_rgb'"));
  }
  o.cameras = {{"base_0_rgb", "agentview_image"}, {"left_wrist_0_rgb", "eye_in_hand_rgb"}};  // one found: fine
  CHECK_NOTHROW(RobotDataset(o));
}

// Issue 49 item 11: with pi0.5's state in the prompt, the discretized state is most of the tokens: the warning says
// how many are the state's, so the user raises model.max_token_len instead of shortening the task text.
TEST_CASE("tokenizer: a truncated pi0.5 prompt says how many tokens the discretized state takes", "[unit][data][inputs]") {
  const auto tok = test::tiny_tokenizer();
  const std::string key = "tokenizer: prompt with the discretized state truncated to max_token_len";
  LogCapture log;
  const int64_t before = warn_once_count(key);
  const auto state = torch::linspace(-0.9, 0.9, 32);
  const auto full = tok->tokenize("pick", 400, state);
  const int64_t n = full.mask.sum().item<int64_t>();
  tok->tokenize("pick", 16, state);
  CHECK(warn_once_count(key) == before + 1);
  if (before == 0) {
    CHECK_THAT(log.text(), Contains("tokenizer: prompt is " + std::to_string(n) + " tokens, of which the discretized "
                                    "state takes ") &&
                               Contains("(32 state dims, pi0.5's state in the prompt) and the task text ") &&
                               Contains("truncated to max_token_len 16") && Contains("raise model.max_token_len"));
  }
}

TEST_CASE("tokenizer: a too-long prompt warns once per run and quotes at most 200 characters", "[unit][data][inputs]") {
  const auto tok = test::tiny_tokenizer();
  std::string prompt;
  for (int i = 0; i < 1200; ++i) prompt += "pick up the bowl ";  // 20 kB
  LogCapture log;
  const int64_t before = warn_once_count("tokenizer: prompt truncated to max_token_len");
  for (int i = 0; i < 20; ++i) tok->tokenize(prompt, 16);
  CHECK(warn_once_count("tokenizer: prompt truncated to max_token_len") == before + 20);
  CHECK(log.lines() <= 2);  // the warning (unless an earlier test said it) and "10 times so far"
  CHECK(log.text().size() < 1000);
  if (before == 0) CHECK_THAT(log.text(), Contains("...' (" + std::to_string(prompt.size() - 1) + " bytes)"));
}
