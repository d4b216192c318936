// pi0-train --dump-batches N DIR (train::dump_samples): the first samples training reads, written as PNG frames and
// JSON for every dataset format, equal to what the dataset and the training loader hold.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

#include <nlohmann/json.hpp>

#include "pi0/common/check.h"
#include "pi0/data/example_data.h"
#include "pi0/data/norm_stats.h"
#include "pi0/data/png.h"
#include "pi0/model/observation.h"
#include "pi0/train/data_setup.h"
#include "pi0/train/sample_dump.h"
#include "support/app_process.h"
#include "support/tiny_run.h"
#include "unit/data/data_test_util.h"
#include "unit/data/lerobot_test_util.h"

using namespace pi0;
using Catch::Contains;
using pi0::testing::read_text;
using pi0::testing::TinyRun;
namespace fs = std::filesystem;

namespace {

torch::Tensor read_png(const std::string& path) {
  const auto bytes = read_text(path);
  return data::decode_png(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path);
}

nlohmann::json sample_json(const std::string& dir, int i) {
  char name[32];
  std::snprintf(name, sizeof name, "sample_%03d", i);
  return nlohmann::json::parse(read_text(dir + "/" + name + "/sample.json"));
}

std::string sample_dir(const std::string& dir, int i) {
  char name[32];
  std::snprintf(name, sizeof name, "sample_%03d", i);
  return dir + "/" + name;
}

torch::Tensor as_tensor(const nlohmann::json& j) {
  if (j.is_array() && !j.empty() && j[0].is_array()) {
    std::vector<torch::Tensor> rows;
    for (const auto& r : j) rows.push_back(as_tensor(r));
    return torch::stack(rows);
  }
  return torch::tensor(j.get<std::vector<double>>(), torch::kFloat64);
}

// Every dumped sample against the dataset (raw frames, state, actions, prompt) and the training loader (order,
// the model's images, normalized state and actions, tokens) of the same config.
void check_dump(const config::Config& cfg, const std::string& dir, int n) {
  const int64_t micro = cfg.train.batch_size / cfg.train.grad_accum_steps;
  auto pipe = train::make_data_pipeline(cfg, micro, 0, 1);
  std::vector<data::SampleRef> order;
  model::Batch batch;
  for (int k = 0; k < n; ++k) {
    const int i = static_cast<int>(k % micro);
    if (i == 0) {
      order = pipe.loader->batch_samples(pipe.loader->position());
      batch = pipe.loader->next();
    }
    INFO("sample " << k);
    const auto j = sample_json(dir, k);
    const auto& ref = order[static_cast<size_t>(i)];
    CHECK(j.at("index").get<int64_t>() == ref.index);
    CHECK(j.at("dataset_index").get<int64_t>() == ref.source);
    CHECK(j.at("dataset").get<std::string>() == pipe.sources.at(static_cast<size_t>(ref.source)).name);
    const auto raw = pipe.sources.at(static_cast<size_t>(ref.source)).dataset->get(ref.index);
    CHECK(j.at("episode").get<int64_t>() == raw.episode);
    CHECK(j.at("frame").get<int64_t>() == raw.frame);
    CHECK(j.at("prompt").get<std::string>() == raw.prompt);
    CHECK(torch::equal(as_tensor(j.at("state_raw")).to(torch::kFloat32), raw.state));
    CHECK(torch::equal(as_tensor(j.at("actions_raw")).to(torch::kFloat32), raw.actions));
    CHECK(torch::equal(as_tensor(j.at("state")).to(torch::kFloat32), batch.observation.state[i]));
    CHECK(torch::equal(as_tensor(j.at("actions")).to(torch::kFloat32), batch.actions[i]));
    const auto tokens = j.at("tokens").get<std::vector<int64_t>>();
    CHECK(torch::equal(torch::tensor(tokens, torch::kInt64), batch.observation.tokenized_prompt[i].to(torch::kInt64)));
    CHECK(j.at("token_count").get<int64_t>() == batch.observation.tokenized_prompt_mask[i].sum().item<int64_t>());
    for (size_t slot = 0; slot < model::kCameraNames.size(); ++slot) {
      const auto& name = model::kCameraNames[slot];
      INFO(name);
      const bool present = batch.observation.image_masks[slot][i].item<bool>();
      CHECK(j.at("cameras").at(name).at("present").get<bool>() == present);
      const std::string model_png = sample_dir(dir, k) + "/" + name + ".png";
      CHECK(fs::exists(model_png) == present);
      if (!present) continue;
      // Lossless: the frame as read, and the model's input mapped back to 0..255 (x/255·2−1 inverted exactly).
      CHECK(torch::equal(read_png(sample_dir(dir, k) + "/" + name + "_raw.png"), raw.images[slot]));
      const auto seen = ((batch.observation.images[slot][i] + 1) * 127.5).round().clamp(0, 255).to(torch::kUInt8);
      CHECK(torch::equal(read_png(model_png), seen.permute({1, 2, 0})));
    }
  }
  CHECK_FALSE(fs::exists(sample_dir(dir, n)));
}

}  // namespace

TEST_CASE("dump_samples: LIBERO HDF5 samples as training reads them, flip_images honoured", "[unit][train][data]") {
  TinyRun run;
  const auto cfg = run.config("run");
  const std::string dir = run.dir.str("samples");
  CHECK(train::dump_samples(cfg, 3, dir) == 3);
  check_dump(cfg, dir, 3);
  const auto j = sample_json(dir, 0);
  CHECK(j.at("format") == "libero");
  CHECK(j.at("flip_images") == "true");
  CHECK_THAT(j.at("tokens_text").get<std::string>(), Contains("reach the red blob") && Contains("State:"));

  // data.dataset.flip_images reaches the reader: the same frame, not rotated.
  const auto upright = run.config("run", {"data.dataset.flip_images=false"});
  CHECK(train::dump_samples(upright, 1, run.dir.str("upright")) == 1);
  const auto a = read_png(run.dir.str("samples") + "/sample_000/base_0_rgb_raw.png");
  const auto b = read_png(run.dir.str("upright") + "/sample_000/base_0_rgb_raw.png");
  CHECK_FALSE(torch::equal(a, b));
  CHECK(torch::equal(a, b.flip({0, 1})));

  // Nothing is overwritten; a count below 1 is refused.
  REQUIRE_THROWS_WITH(train::dump_samples(cfg, 1, dir), Contains("'" + dir + "' already exists"));
  REQUIRE_THROWS_WITH(train::dump_samples(cfg, 0, run.dir.str("none")), Contains("expected >= 1"));
  CHECK_FALSE(fs::exists(run.dir.str("none")));
}

TEST_CASE("dump_samples: ALOHA HDF5 with three cameras", "[unit][train][data]") {
  pi0::testing::TempDir tmp("pi0dump_aloha");
  data::ExampleDataOptions eo;
  eo.episodes = 2;
  eo.steps = 10;
  const auto glob = data::write_example_aloha(tmp.str("data"), eo);
  data::DatasetOptions d;
  d.format = "aloha";
  d.paths = {glob};
  d.prompt = "fold";
  d.action_horizon = 8;
  data::save_norm_stats(data::compute_norm_stats(data::RobotDataset(d)), tmp.str("norm_stats.json"));
  const auto cfg = config::load_config(
      std::string(PI0_SOURCE_DIR) + "/configs/debug.yaml",
      {"data.dataset.format=aloha", "data.dataset.paths=[" + glob + "]", "data.dataset.prompt=fold",
       "data.norm_stats=" + tmp.str("norm_stats.json"), "model.action_dim=16", "train.batch_size=4",
       "data.tokenizer=" + std::string(PI0_SOURCE_DIR) + "/data/tokenizer/tiny_spm.model"});
  train::dump_samples(cfg, 5, tmp.str("samples"));  // from two micro-batches of 4
  check_dump(cfg, tmp.str("samples"), 5);
  const auto j = sample_json(tmp.str("samples"), 4);
  CHECK(j.at("cameras").at("right_wrist_0_rgb").at("key") == "cam_right_wrist");
  CHECK(j.at("state_raw").size() == 14);
  CHECK(j.at("prompt") == "fold");
}

TEST_CASE("dump_samples: a LeRobot dataset's frames, state and task prompt", "[lerobot][train]") {
  if (!test::lerobot_built()) return;
  test::TempDir tmp;
  const std::string root = tmp.file("v21");
  test::write_lerobot(root, "--version v2.1 --images png --size 32");
  data::DatasetOptions d;
  d.format = "lerobot";
  d.paths = {root};
  d.action_horizon = 8;
  data::save_norm_stats(data::compute_norm_stats(data::RobotDataset(d)), tmp.file("norm_stats.json"));
  const auto cfg = config::load_config(
      std::string(PI0_SOURCE_DIR) + "/configs/debug.yaml",
      {"data.dataset.format=lerobot", "data.dataset.paths=[" + root + "]", "data.norm_stats=" + tmp.file("norm_stats.json"),
       "train.batch_size=4", "data.tokenizer=" + std::string(PI0_SOURCE_DIR) + "/data/tokenizer/tiny_spm.model"});
  train::dump_samples(cfg, 4, tmp.file("samples"));
  check_dump(cfg, tmp.file("samples"), 4);
  for (int i = 0; i < 4; ++i) {
    const auto j = sample_json(tmp.file("samples"), i);
    const int64_t e = j.at("episode"), t = j.at("frame");
    CHECK(torch::equal(read_png(sample_dir(tmp.file("samples"), i) + "/base_0_rgb_raw.png"), test::lerobot_png_pixels(e, t, 32)));
    CHECK(torch::equal(read_png(sample_dir(tmp.file("samples"), i) + "/left_wrist_0_rgb_raw.png"),
                       test::lerobot_png_pixels(e + 10, t, 32)));
    CHECK(j.at("prompt") == "pick up object " + std::to_string(e % 2));
    CHECK(j.at("flip_images") == "false");
  }
}

TEST_CASE("pi0-train --dump-batches N DIR: exit 0 with one log line, bad N or an existing DIR exit 2", "[integration][app]") {
  TinyRun run;
  std::string sets = " --config " + std::string(PI0_SOURCE_DIR) + "/configs/debug.yaml --set 'data.dataset.paths=[" +
                     run.data_glob + "]' --set data.norm_stats=" + run.norm_stats +
                     " --set data.tokenizer=" + std::string(PI0_SOURCE_DIR) + "/data/tokenizer/tiny_spm.model";
  const std::string dir = run.dir.str("samples");
  const auto r = testing::run_app_process("pi0-train", sets + " --dump-batches 2 " + dir, run.dir);
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK(fs::exists(dir + "/sample_001/sample.json"));
  CHECK_FALSE(fs::exists(dir + "/sample_002"));
  // The program's log line, in the one format every program uses.
  CHECK(std::regex_search(r.out, std::regex(R"((^|\n)\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] info wrote 2 samples of )")));
  testing::check_user_error(testing::run_app_process("pi0-train", sets + " --dump-batches two " + run.dir.str("x"), run.dir),
                            "pi0-train", "--dump-batches: got 'two' samples, expected an integer >= 1");
  testing::check_user_error(testing::run_app_process("pi0-train", sets + " --dump-batches 1 " + dir, run.dir),
                            "pi0-train", "already exists");
}
