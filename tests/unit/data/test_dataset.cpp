// HDF5 readers: LIBERO layout (flip, prompt, cameras, repeat-last rule), ALOHA layout (raw and JPEG rows), globs.
#include <catch2/catch.hpp>

#include "data_test_util.h"
#include "pi0/data/dataset.h"
#include "pi0/data/example_data.h"
#include "pi0/data/hdf5_file.h"
#include "pi0/data/jpeg.h"
#include "support/skip.h"

using namespace pi0::data;

TEST_CASE("LIBERO example file opens with the openpi defaults", "[unit][data]") {
  pi0::test::TempDir dir;
  ExampleDataOptions eo;
  eo.episodes = 3;
  eo.steps = 12;
  eo.image_size = 16;
  const std::string path = write_example_libero(dir.str(), eo);
  DatasetOptions o;
  o.paths = {path};
  o.action_horizon = 5;
  RobotDataset ds(o);
  CHECK(ds.num_episodes() == 3);
  CHECK(ds.size() == 36);
  CHECK(ds.state_dim() == 8);  // ee_states (6) + gripper_states (2)
  CHECK(ds.action_dim() == 7);

  RawSample s = ds.get(12 + 3);  // episode 1, frame 3
  CHECK(s.episode == 1);
  CHECK(s.frame == 3);
  CHECK(s.prompt == "reach the red blob");
  REQUIRE(s.images.size() == 3);
  CHECK(s.image_masks == std::vector<bool>{true, true, false});  // no right wrist camera in LIBERO
  CHECK_FALSE(s.images[2].defined());
  CHECK(s.images[0].sizes() == torch::IntArrayRef({16, 16, 3}));
  CHECK(s.actions.sizes() == torch::IntArrayRef({5, 7}));

  // State = concat(obs/ee_states, obs/gripper_states) at t.
  H5File f = H5File::open(path);
  auto ee = f.read_doubles("data/demo_1/obs/ee_states", 3, 1);
  auto gr = f.read_doubles("data/demo_1/obs/gripper_states", 3, 1);
  for (int d = 0; d < 6; ++d) CHECK(s.state[d].item<float>() == static_cast<float>(ee[static_cast<size_t>(d)]));
  for (int d = 0; d < 2; ++d) CHECK(s.state[6 + d].item<float>() == static_cast<float>(gr[static_cast<size_t>(d)]));

  // Frames are rotated 180° on read: stored[t][H-1-y][W-1-x] == sample[y][x].
  auto stored = f.read_bytes("data/demo_1/obs/agentview_rgb", 3, 1);
  torch::Tensor raw = torch::from_blob(stored.data(), {16, 16, 3}, torch::kUInt8);
  CHECK(torch::equal(s.images[0], raw.flip({0, 1})));
  CHECK_FALSE(torch::equal(s.images[0], raw));
  // The example draws a floor gradient dark at the top: after the flip the top row is darker again.
  CHECK(s.images[0][0].to(torch::kFloat).mean().item<float>() < s.images[0][15].to(torch::kFloat).mean().item<float>());

  DatasetOptions no_flip = o;
  no_flip.flip_images = "false";
  CHECK(torch::equal(RobotDataset(no_flip).get(15).images[0], raw));
}

TEST_CASE("action chunks repeat the last action past the episode end", "[unit][data]") {
  pi0::test::TempDir dir;
  ExampleDataOptions eo;
  eo.episodes = 2;
  eo.steps = 6;
  eo.image_size = 8;
  DatasetOptions o;
  o.paths = {write_example_libero(dir.str(), eo)};
  o.action_horizon = 4;
  RobotDataset ds(o);
  const torch::Tensor& a = ds.episode(0).actions;
  torch::Tensor chunk = ds.get(4).actions;  // t = 4 of 6: rows 4, 5, 5, 5
  CHECK(torch::equal(chunk[0], a[4]));
  CHECK(torch::equal(chunk[1], a[5]));
  CHECK(torch::equal(chunk[2], a[5]));
  CHECK(torch::equal(chunk[3], a[5]));
  CHECK(torch::equal(ds.get(6).actions[0], ds.episode(1).actions[0]));  // never crosses into the next episode
}

TEST_CASE("demos sort numerically, several files and globs, fixed prompt", "[unit][data]") {
  pi0::test::TempDir dir;
  ExampleDataOptions eo;
  eo.episodes = 11;
  eo.steps = 2;
  eo.image_size = 8;
  write_example_libero(dir.str() + "/a", eo);
  eo.episodes = 1;
  eo.seed = 9;
  write_example_libero(dir.str() + "/b", eo);
  DatasetOptions o;
  o.paths = {dir.str() + "/*/*_demo.hdf5"};
  o.prompt = "do it";
  RobotDataset ds(o);
  CHECK(ds.files().size() == 2);
  CHECK(ds.num_episodes() == 12);
  CHECK(ds.episode(2).group == "data/demo_2");  // not demo_10
  CHECK(ds.episode(10).group == "data/demo_10");
  CHECK(ds.get(23).prompt == "do it");
  DatasetOptions dirs = o;
  dirs.paths = {dir.str() + "/a", dir.str() + "/b"};
  CHECK(RobotDataset(dirs).num_episodes() == 12);
}

TEST_CASE("ALOHA layout: one file per episode, qpos/action, three cameras", "[unit][data]") {
  pi0::test::TempDir dir;
  ExampleDataOptions eo;
  eo.episodes = 2;
  eo.steps = 5;
  eo.image_size = 12;
  DatasetOptions o;
  o.format = "aloha";
  o.paths = {write_example_aloha(dir.str(), eo)};
  o.prompt = "fold the towel";
  o.action_horizon = 3;
  RobotDataset ds(o);
  CHECK(ds.num_episodes() == 2);
  CHECK(ds.state_dim() == 14);
  CHECK(ds.action_dim() == 14);
  RawSample s = ds.get(7);  // episode 1, t 2
  CHECK(s.image_masks == std::vector<bool>{true, true, true});
  CHECK(s.prompt == "fold the towel");
  // The example fills frame t of camera c of episode e with (7t + 60c + 13e) % 256; no flip for ALOHA.
  CHECK(s.images[0][0][0][0].item<int>() == (7 * 2 + 0 + 13) % 256);
  CHECK(s.images[1][5][5][1].item<int>() == (7 * 2 + 60 + 13) % 256);
  H5File f = H5File::open(ds.files()[1]);
  CHECK(f.info("observations/qpos").dtype_name() == "float32");
  CHECK(s.state[3].item<float>() == static_cast<float>(f.read_doubles("observations/qpos", 2, 1)[3]));

  // A missing camera -> zeros and mask false.
  DatasetOptions two = o;
  two.cameras = {{"base_0_rgb", "cam_high"}, {"right_wrist_0_rgb", "cam_not_there"}};
  CHECK(RobotDataset(two).get(0).image_masks == std::vector<bool>{true, false, false});
}

TEST_CASE("ALOHA 2 compressed layout: JPEG rows decode to RGB", "[unit][data]") {
  if (!jpeg_available()) {
    pi0::testing::skip("built without libjpeg");
    return;
  }
  pi0::test::TempDir dir;
  ExampleDataOptions eo;
  eo.episodes = 1;
  eo.steps = 4;
  eo.image_size = 16;
  DatasetOptions o;
  o.format = "aloha";
  o.paths = {write_example_aloha(dir.str(), eo, /*jpeg=*/true)};
  o.prompt = "x";
  RobotDataset ds(o);
  RawSample s = ds.get(3);
  REQUIRE(s.images[2].sizes() == torch::IntArrayRef({16, 16, 3}));
  const int expected = (7 * 3 + 120) % 256;
  CHECK(std::abs(s.images[2][8][8][0].item<int>() - expected) <= 3);  // lossy, flat image
}
