// LeRobot datasets (format: lerobot) read back from datasets the tests write with tests/data/write_lerobot.py:
// every version (v2.0, v2.1, v3.0), PNG image features (bit-exact) and AV1 / H.264 video features (PSNR bound),
// fixed-size and plain list columns, chunk boundaries, v3.0 multi-episode files with non-zero from_timestamp;
// action chunks at episode ends, prompts from tasks; HDF5 ↔ LeRobot equality down to the training loss; norm stats
// from parquet columns only; and the one-line errors for bad input.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include "data_test_util.h"
#include "lerobot_test_util.h"
#include "pi0/common/check.h"
#include "pi0/config/policy_metadata.h"
#include "pi0/data/dataset.h"
#include "pi0/data/hdf5_file.h"
#include "pi0/data/lerobot.h"
#include "pi0/data/norm_stats.h"
#include "pi0/data/parquet.h"
#include "pi0/data/video.h"
#include "pi0/io/bundle.h"
#include "pi0/train/metrics.h"
#include "pi0/train/trainer.h"

using namespace pi0;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

const std::vector<int64_t> kLengths = {5, 7, 4, 6, 3};  // write_lerobot.py's default --lengths

data::DatasetOptions lerobot_options(const std::string& root, int64_t horizon = 4) {
  data::DatasetOptions o;
  o.format = "lerobot";
  o.paths = {root};
  o.action_horizon = horizon;
  return o;
}

/// Every sample of a dataset written with the default lengths equals the formulas; `video`: PSNR bound instead of
/// equality, and the frame must be nearer the right one than its neighbours. Samples visited in a shuffled order
/// (random access: seeks) and then in order (GOP reuse).
void check_readback(const std::string& root, bool video, int64_t hw = 16, int64_t tasks = 2) {
  data::RobotDataset ds(lerobot_options(root));
  REQUIRE(ds.num_episodes() == static_cast<int64_t>(kLengths.size()));
  REQUIRE(ds.size() == std::accumulate(kLengths.begin(), kLengths.end(), int64_t{0}));
  REQUIRE(ds.state_dim() == 8);
  REQUIRE(ds.action_dim() == 7);
  std::vector<int64_t> order(static_cast<size_t>(ds.size()));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(3));
  std::vector<int64_t> in_order(order.size());
  std::iota(in_order.begin(), in_order.end(), 0);
  order.insert(order.end(), in_order.begin(), in_order.end());
  double worst_psnr = 99;
  for (int64_t i : order) {
    const auto s = ds.get(i);
    const int64_t e = s.episode, t = s.frame, len = kLengths[static_cast<size_t>(e)];
    INFO("sample " << i << " = episode " << e << " frame " << t);
    CHECK(torch::equal(s.state, test::lerobot_state(e, t, 8)));
    for (int64_t h = 0; h < 4; ++h)  // past the episode end the last action repeats
      CHECK(torch::equal(s.actions[h], test::lerobot_action(e, std::min(t + h, len - 1), 7)));
    CHECK(s.prompt == "pick up object " + std::to_string(e % tasks));
    REQUIRE(s.image_masks == std::vector<bool>{true, true, false});
    CHECK_FALSE(s.images[2].defined());
    for (int cam = 0; cam < 2; ++cam) {
      const int64_t ce = e + 10 * cam;
      REQUIRE(s.images[cam].sizes() == torch::IntArrayRef({hw, hw, 3}));
      if (!video) {
        CHECK(torch::equal(s.images[cam], test::lerobot_png_pixels(ce, t, hw)));
      } else {
        const double p = test::psnr(s.images[cam], test::lerobot_video_pixels(ce, t, hw));
        worst_psnr = std::min(worst_psnr, p);
        CHECK(p >= 35.0);  // AV1 crf 10 / H.264 crf 0 in yuv420p: measured ≥ 40 dB on this smooth content
        for (int64_t n : {t - 1, t + 1})
          if (n >= 0 && n < len) CHECK(test::psnr(s.images[cam], test::lerobot_video_pixels(ce, n, hw)) < p);
      }
    }
  }
  if (video) WARN("worst PSNR " << worst_psnr << " dB");
}

std::string write(const test::TempDir& dir, const std::string& name, const std::string& args) {
  const std::string root = dir.file(name);
  test::write_lerobot(root, args);
  return root;
}

}  // namespace

TEST_CASE("lerobot: built with Arrow, libpng and FFmpeg", "[lerobot]") {
  // CI (PI0_REQUIRE_LEROBOT=1) builds through scripts/setup.sh, which provides all three: there a missing one fails.
  INFO(data::parquet::build_info());
  if (!test::lerobot_built()) return;
  CHECK(data::parquet::available());
  CHECK(data::video_available());
}

TEST_CASE("lerobot v2.0 PNG images: frames, state, action chunks and prompts read back exactly", "[lerobot]") {
  if (!test::lerobot_built()) return;
  test::TempDir dir;
  // chunks_size 2: episodes 2-3 in chunk-001 and 4 in chunk-002 (the template's {episode_chunk:03d}).
  const auto root = write(dir, "libero", "--version v2.0 --images png --chunks-size 2");
  REQUIRE(fs::exists(root + "/data/chunk-002/episode_000004.parquet"));
  check_readback(root, false);
}

TEST_CASE("lerobot v2.1 plain list columns and small row groups read back exactly", "[lerobot]") {
  if (!test::lerobot_built()) return;
  test::TempDir dir;
  const auto root = write(dir, "plain", "--version v2.1 --images png --list plain --row-group 3");
  check_readback(root, false);
}

TEST_CASE("lerobot v3.0 PNG: multi-episode parquet files across a chunk boundary read back exactly", "[lerobot]") {
  if (!test::lerobot_built()) return;
  test::TempDir dir;
  // 2 episodes per data file, 2 files per chunk: data/chunk-000/file-000, file-001, chunk-001/file-000.
  const auto root = write(dir, "v3", "--version v3.0 --images png --episodes-per-file 2 --chunks-size 2");
  REQUIRE(fs::exists(root + "/data/chunk-001/file-000.parquet"));
  check_readback(root, false);
}

TEST_CASE("lerobot v3.0 AV1 video: frames at from_timestamp + timestamp within the PSNR bound", "[lerobot]") {
  if (!test::lerobot_built()) return;
  test::TempDir dir;
  // 3 episodes per MP4 (episodes 1, 2, 4 start at non-zero from_timestamp), data files grouped by 2: the data and
  // video file indices of an episode differ.
  const auto root = write(dir, "av1", "--version v3.0 --images av1 --episodes-per-file 2 --episodes-per-video 3");
  check_readback(root, true);
}

TEST_CASE("lerobot v3.0 H.264 video reads back within the PSNR bound", "[lerobot]") {
  if (!test::lerobot_built()) return;
  test::TempDir dir;
  const auto root = write(dir, "h264", "--version v3.0 --images h264 --episodes-per-video 2");
  check_readback(root, true);
}

TEST_CASE("lerobot v2.1 AV1 video, one MP4 per episode and camera, reads back", "[lerobot]") {
  if (!test::lerobot_built()) return;
  test::TempDir dir;
  const auto root = write(dir, "v21av1", "--version v2.1 --images av1");
  check_readback(root, true);
}

TEST_CASE("lerobot video decoder reuses the decoded GOP for neighbouring timestamps", "[lerobot]") {
  if (!test::lerobot_built()) return;
  test::TempDir dir;
  const auto root = write(dir, "gop", "--version v2.1 --images av1 --lengths 30 --chunks-size 1000");
  data::VideoDecoder dec(root + "/videos/chunk-000/image/episode_000000.mp4");
  for (int t = 0; t < 30; ++t) dec.frame_at(t / 10.0, data::kLeRobotToleranceS, "frame " + std::to_string(t));
  CHECK(dec.seeks() == 1);             // one seek for the first query, then forward decoding
  CHECK(dec.frames_decoded() == 30);   // each frame decoded once
  dec.frame_at(2.9, data::kLeRobotToleranceS, "again");  // cached
  CHECK(dec.frames_decoded() == 30);
}

TEST_CASE("lerobot norm stats read only parquet columns and equal those of the same data as PNG", "[lerobot]") {
  if (!test::lerobot_built()) return;
  test::TempDir dir;
  const auto png = write(dir, "png", "--version v2.0 --images png");
  const auto av1 = write(dir, "av1", "--version v3.0 --images av1");
  fs::remove_all(av1 + "/videos");  // never decoded
  const auto a = data::compute_norm_stats(data::RobotDataset(lerobot_options(png)));
  const auto b = data::compute_norm_stats(data::RobotDataset(lerobot_options(av1)));
  for (const char* k : {"state", "actions"}) {
    CHECK(a.at(k).mean == b.at(k).mean);
    CHECK(a.at(k).std == b.at(k).std);
    CHECK(a.at(k).q01 == b.at(k).q01);
    CHECK(a.at(k).q99 == b.at(k).q99);
  }
  CHECK(a.at("state").mean[0] != 0.0);
}

namespace {

/// The same content as `write_lerobot.py --version v2.0 --images png --tasks 1` in the ALOHA HDF5 layout (one file
/// per episode: observations/state, actions, observations/images/{image,wrist_image}).
std::string write_hdf5_twin(const std::string& dir, int64_t hw) {
  fs::create_directories(dir);
  for (size_t e = 0; e < kLengths.size(); ++e) {
    const int64_t T = kLengths[e];
    auto f = data::H5File::create(dir + "/episode_" + std::to_string(e) + ".hdf5");
    std::vector<torch::Tensor> st, ac, im, wr;
    for (int64_t t = 0; t < T; ++t) {
      st.push_back(test::lerobot_state(e, t, 8));
      ac.push_back(test::lerobot_action(e, t, 7));
      im.push_back(test::lerobot_png_pixels(e, t, hw));
      wr.push_back(test::lerobot_png_pixels(e + 10, t, hw));
    }
    const auto s = torch::stack(st).contiguous(), a = torch::stack(ac).contiguous();
    const auto i = torch::stack(im).contiguous(), w = torch::stack(wr).contiguous();
    f.create_group("observations");
    f.create_group("observations/images");
    f.write("observations/state", {T, 8}, H5T_NATIVE_FLOAT, s.data_ptr());
    f.write("actions", {T, 7}, H5T_NATIVE_FLOAT, a.data_ptr());
    f.write("observations/images/image", {T, hw, hw, 3}, H5T_NATIVE_UINT8, i.data_ptr());
    f.write("observations/images/wrist_image", {T, hw, hw, 3}, H5T_NATIVE_UINT8, w.data_ptr());
  }
  return dir + "/*.hdf5";
}

}  // namespace

TEST_CASE("lerobot PNG and HDF5 with identical content give identical samples and training losses", "[lerobot][train]") {
  if (!test::lerobot_built()) return;
  test::TempDir dir;
  const int64_t hw = 32;
  const auto v21 = write(dir, "v21", "--version v2.1 --images png --tasks 1 --size 32");
  const auto v30 = write(dir, "v30", "--version v3.0 --images png --tasks 1 --size 32");
  const auto h5 = write_hdf5_twin(dir.file("h5"), hw);
  data::DatasetOptions ho;
  ho.format = "aloha";
  ho.paths = {h5};
  ho.cameras = {{"base_0_rgb", "image"}, {"left_wrist_0_rgb", "wrist_image"}};
  ho.state_keys = {"state"};
  ho.action_key = "actions";
  ho.prompt = "pick up object 0";
  ho.adapt_to_pi = "false";
  ho.action_horizon = 8;
  data::RobotDataset hd(ho);
  for (const auto& root : {v21, v30}) {
    data::RobotDataset ld(lerobot_options(root, 8));
    REQUIRE(ld.size() == hd.size());
    for (int64_t i = 0; i < hd.size(); ++i) {
      const auto a = hd.get(i), b = ld.get(i);
      INFO(root << " sample " << i);
      CHECK(torch::equal(a.state, b.state));
      CHECK(torch::equal(a.actions, b.actions));
      CHECK(a.prompt == b.prompt);
      for (int c = 0; c < 2; ++c) CHECK(torch::equal(a.images[c], b.images[c]));
    }
  }
  // Train the tiny debug model on each: same data in the same order, so bit-identical losses.
  const std::string norm = dir.file("norm_stats.json");
  data::save_norm_stats(data::compute_norm_stats(hd), norm);
  auto run = [&](const std::string& name, std::vector<std::string> data_keys) {
    std::vector<std::string> o = {"data.norm_stats=" + norm,
                                  "data.tokenizer=" + std::string(PI0_SOURCE_DIR) + "/data/tokenizer/tiny_spm.model",
                                  "checkpoint.run_dir=" + dir.file(name), "train.log_interval=1", "train.num_steps=3",
                                  "train.batch_size=4", "data.num_workers=1", "checkpoint.save_interval=100"};
    o.insert(o.end(), data_keys.begin(), data_keys.end());
    train::Trainer t(config::load_config(std::string(PI0_SOURCE_DIR) + "/configs/debug.yaml", o));
    t.run();
    std::vector<double> losses;
    for (const auto& r : train::read_metrics(dir.file(name) + "/metrics.jsonl")) losses.push_back(r.at("loss").get<double>());
    return losses;
  };
  const auto l_h5 = run("h5", {"data.dataset.format=aloha", "data.dataset.paths=[" + h5 + "]",
                               "data.dataset.cameras={base_0_rgb: image, left_wrist_0_rgb: wrist_image}",
                               "data.dataset.state_keys=[state]", "data.dataset.action_key=actions",
                               "data.dataset.prompt=pick up object 0", "data.dataset.adapt_to_pi=false"});
  const auto l_v21 = run("v21", {"data.dataset.format=lerobot", "data.dataset.paths=[" + v21 + "]"});
  const auto l_v30 = run("v30", {"data.dataset.format=lerobot", "data.dataset.paths=[" + v30 + "]"});
  REQUIRE(l_h5.size() == 3);
  CHECK(l_h5 == l_v21);  // exact
  CHECK(l_h5 == l_v30);
}

TEST_CASE("lerobot ALOHA data: the adapt_to_pi that 'auto' resolved to reaches checkpoints and the bundle", "[lerobot][train]") {
  // Training converts ALOHA-like LeRobot data to pi0's convention; a bundle that said 'auto' (= off for lerobot)
  // would feed the robot's state unconverted and send pi0-convention actions (and no reset_pose) to a real arm.
  if (!test::lerobot_built()) return;
  test::TempDir dir;
  const auto root = write(dir, "aloha", "--version v3.0 --images png --robot-type aloha --state-dim 14 --action-dim 14");
  {
    data::RobotDataset ds(lerobot_options(root));
    REQUIRE(ds.options().adapt_to_pi == "true");
    const std::string norm = dir.file("norm_stats.json");
    data::save_norm_stats(data::compute_norm_stats(ds), norm);
  }
  const std::string run_dir = dir.file("run");
  train::Trainer t(config::load_config(
      std::string(PI0_SOURCE_DIR) + "/configs/debug.yaml",
      {"data.norm_stats=" + dir.file("norm_stats.json"),
       "data.tokenizer=" + std::string(PI0_SOURCE_DIR) + "/data/tokenizer/tiny_spm.model", "checkpoint.run_dir=" + run_dir,
       "train.num_steps=1", "train.batch_size=2", "data.num_workers=1", "checkpoint.save_interval=1",
       "model.action_dim=14", "data.dataset.format=lerobot", "data.dataset.paths=[" + root + "]"}));
  t.run();
  for (const auto& yaml : {run_dir + "/config.yaml", run_dir + "/checkpoints/1/config.yaml"}) {
    INFO(yaml);
    CHECK(config::load_config(yaml).data.dataset.adapt_to_pi == "true");
  }
  io::export_bundle(run_dir + "/checkpoints/1", dir.file("bundle"));
  std::ifstream cj(dir.file("bundle") + "/config.json");
  CHECK(nlohmann::json::parse(cj).at("adapt_to_pi") == true);
  const auto bundle_cfg = config::load_config(dir.file("bundle") + "/config.yaml");
  CHECK(bundle_cfg.data.dataset.adapt_to_pi_enabled());
  CHECK(config::policy_metadata(bundle_cfg).contains("reset_pose"));
}

// ---- bad input: one line naming the file and key ----

namespace {

std::string error_of(const data::DatasetOptions& o, int64_t sample = -1) {
  try {
    data::RobotDataset ds(o);
    if (sample >= 0) ds.get(sample);
  } catch (const UserError& e) {
    const std::string msg = e.what();
    CHECK(msg.find('\n') == std::string::npos);
    return msg;
  }
  FAIL("no UserError");
  return "";
}

void overwrite(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::trunc) << text; }

}  // namespace

TEST_CASE("lerobot bad metadata: missing or malformed info.json, unknown version, bad keys", "[lerobot]") {
  if (!test::lerobot_built()) return;
  test::TempDir dir;
  const auto root = write(dir, "ds", "--version v2.1 --images png");
  const std::string info = root + "/meta/info.json";
  const std::string good = [&] { std::ifstream in(info); return std::string(std::istreambuf_iterator<char>(in), {}); }();

  CHECK_THAT(error_of(lerobot_options(dir.file("nope"))), Contains("nope: LeRobot dataset root not found"));
  fs::rename(info, info + ".bak");
  CHECK_THAT(error_of(lerobot_options(root)), Contains(info + ": file not found"));
  fs::rename(info + ".bak", info);
  overwrite(info, "{\"codebase_version\": ");
  CHECK_THAT(error_of(lerobot_options(root)), Contains(info + ": not valid JSON"));
  auto j = nlohmann::json::parse(good);
  j["codebase_version"] = "v1.6";
  overwrite(info, j.dump());
  CHECK_THAT(error_of(lerobot_options(root)),
             Contains(info + ": codebase_version is \"v1.6\", expected v2.0, v2.1 or v3.0"));
  overwrite(info, good);

  auto o = lerobot_options(root);
  o.cameras = {{"base_0_rgb", "observation.images.top"}};
  CHECK_THAT(error_of(o), Contains(info + ": dataset.cameras.base_0_rgb: 'observation.images.top' is not a feature of "
                                   "this dataset; it has: actions (float32), episode_index (int64), frame_index (int64), "
                                   "image (image), index (int64), state (float32)"));
  o = lerobot_options(root);
  o.state_keys = {"image"};
  CHECK_THAT(error_of(o), Contains("feature 'image' has dtype image, expected a numeric vector"));
  o = lerobot_options(root);
  o.cameras = {{"base_0_rgb", "state"}};
  CHECK_THAT(error_of(o), Contains("dataset.cameras.base_0_rgb: feature 'state' has dtype float32, expected image or video"));
}

TEST_CASE("lerobot bad data files: missing or corrupt parquet, non-numeric column, wrong row count", "[lerobot]") {
  if (!test::lerobot_built()) return;
  test::TempDir dir;
  const auto root = write(dir, "ds", "--version v2.0 --images png");
  const std::string ep1 = root + "/data/chunk-000/episode_000001.parquet";
  // A column that is not numeric: declare the image column as the state in info.json.
  {
    const std::string info = root + "/meta/info.json";
    std::ifstream in(info);
    auto j = nlohmann::json::parse(in);
    j["features"]["image"]["dtype"] = "float32";
    j["features"]["image"]["shape"] = {8};
    overwrite(info, j.dump());
    auto o = lerobot_options(root);
    o.state_keys = {"image"};
    o.cameras = {{"base_0_rgb", "wrist_image"}};
    CHECK_THAT(error_of(o), Contains("episode_000000.parquet: column 'image' (struct<bytes: binary, path: string>) is "
                                     "not numeric, expected a number or a list of numbers per row"));
  }
  const auto root2 = write(dir, "ds2", "--version v2.0 --images png");
  const std::string ep1b = root2 + "/data/chunk-000/episode_000001.parquet";
  fs::rename(ep1b, ep1b + ".bak");
  CHECK_THAT(error_of(lerobot_options(root2)), Contains(ep1b + ": parquet file not found"));
  overwrite(ep1b, "PAR1 this is not a parquet file");
  CHECK_THAT(error_of(lerobot_options(root2)), Contains(ep1b + ": not a readable parquet file"));
  fs::remove(ep1b);
  fs::copy_file(root2 + "/data/chunk-000/episode_000000.parquet", ep1b);  // 5 rows where 7 are expected
  CHECK_THAT(error_of(lerobot_options(root2)), Contains(ep1b + ": 5 rows, expected 7 (episode 1's length in"));
  (void)ep1;
}

TEST_CASE("lerobot bad videos: missing, corrupt, shorter than the episode, timestamp outside", "[lerobot]") {
  if (!test::lerobot_built()) return;
  test::TempDir dir;
  const auto root = write(dir, "ds", "--version v2.1 --images av1");
  const auto shorter = write(dir, "short", "--version v2.1 --images av1 --lengths 5,3");
  const std::string mp4 = root + "/videos/chunk-000/image/episode_000001.mp4";
  const auto o = lerobot_options(root);
  // Episode 1 = samples 5..11.
  fs::rename(mp4, mp4 + ".bak");
  CHECK_THAT(error_of(o, 5), Contains(mp4 + ": video file not found"));
  {
    std::ifstream in(mp4 + ".bak", std::ios::binary);
    std::string bytes(std::istreambuf_iterator<char>(in), {});
    overwrite(mp4, bytes.substr(0, 48) + std::string(400, '\x5a'));
  }
  CHECK_THAT(error_of(o, 5), Contains(mp4 + ": "));
  // Episode 1's video replaced by a 3-frame one: frames 0-2 decode, frame 6 is past its end.
  fs::remove(mp4);
  fs::copy_file(shorter + "/videos/chunk-000/image/episode_000001.mp4", mp4);
  data::RobotDataset ds(o);
  const auto frame2 = ds.get(5 + 2);
  CHECK(test::psnr(frame2.images[0], test::lerobot_video_pixels(1, 2, 16)) >= 35.0);
  CHECK_THAT(error_of(o, 5 + 6), Contains(mp4 + ": episode 1 frame 6 (image): no frame at timestamp 0.600000 s: the "
                                          "nearest decoded frame is at 0.200000 s"));
  // A timestamp outside the video: the parquet says frame 4 of episode 0 is at 9.9 s.
  data::VideoDecoder dec(root + "/videos/chunk-000/image/episode_000000.mp4");
  try {
    dec.frame_at(9.9, data::kLeRobotToleranceS, "episode 0 frame 4");
    FAIL("no error");
  } catch (const UserError& e) {
    CHECK_THAT(std::string(e.what()), Contains("episode_000000.mp4: episode 0 frame 4: no frame at timestamp 9.900000 s"));
  }
}
