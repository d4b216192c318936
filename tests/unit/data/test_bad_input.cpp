// Every user-caused data error is a pi0::UserError naming the file and the key; the texts are checked here.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>

#include "data_test_util.h"
#include "pi0/common/check.h"
#include "pi0/data/dataset.h"
#include "pi0/data/example_data.h"
#include "pi0/data/hdf5_file.h"
#include "pi0/data/loader.h"

using namespace pi0::data;
using Catch::Contains;

namespace {

struct Tiny {
  int64_t steps = 4;
  int64_t channels = 3;
  bool float_images = false;
  bool rank3_actions = false;
  bool nan_state = false;
  bool inf_action = false;
  bool skip_gripper = false;
};

/// A minimal one-demo LIBERO file with one defect switched on.
std::string write_tiny(const std::string& path, const Tiny& t) {
  H5File f = H5File::create(path);
  const std::string g = "data/demo_0";
  f.create_group(g + "/obs");
  const int64_t T = t.steps, S = 4;
  std::vector<double> actions(static_cast<size_t>(T * 7), 0.1), ee(static_cast<size_t>(T * 6), 0.2),
      grip(static_cast<size_t>(T * 2), 0.01);
  if (t.nan_state && T > 2) ee[2 * 6 + 1] = NAN;
  if (t.inf_action && T > 1) actions[1 * 7 + 3] = INFINITY;
  if (t.rank3_actions) f.write(g + "/actions", {T, 7, 1}, H5T_NATIVE_DOUBLE, actions.data());
  else f.write(g + "/actions", {T, 7}, H5T_NATIVE_DOUBLE, actions.data());
  f.write(g + "/obs/ee_states", {T, 6}, H5T_NATIVE_DOUBLE, ee.data());
  if (!t.skip_gripper) f.write(g + "/obs/gripper_states", {T, 2}, H5T_NATIVE_DOUBLE, grip.data());
  if (t.float_images) {
    std::vector<float> img(static_cast<size_t>(T * S * S * t.channels), 0.5f);
    f.write(g + "/obs/agentview_rgb", {T, S, S, t.channels}, H5T_NATIVE_FLOAT, img.data());
  } else {
    std::vector<uint8_t> img(static_cast<size_t>(T * S * S * t.channels), 7);
    f.write(g + "/obs/agentview_rgb", {T, S, S, t.channels}, H5T_NATIVE_UINT8, img.data());
  }
  f.write_string_attr("data", "problem_info", "{\"language_instruction\": \"test\"}");
  return path;
}

RobotDataset open_libero(const std::string& path) {
  DatasetOptions o;
  o.paths = {path};
  return RobotDataset(o);
}

}  // namespace

TEST_CASE("bad input: missing file, glob or directory", "[unit][data]") {
  pi0::test::TempDir dir;
  REQUIRE_THROWS_WITH(open_libero(dir.file("nope.hdf5")), Contains("nope.hdf5: file not found"));
  DatasetOptions o;
  o.paths = {dir.file("*.hdf5")};
  REQUIRE_THROWS_WITH(RobotDataset(o), Contains("*.hdf5' matches no file"));
  std::ofstream(dir.file("text.hdf5")) << "not hdf5";
  REQUIRE_THROWS_WITH(open_libero(dir.file("text.hdf5")), Contains("text.hdf5: not an HDF5 file"));
  o.paths = {};
  REQUIRE_THROWS_WITH(RobotDataset(o), Contains("dataset.paths: empty"));
  o.paths = {dir.file("text.hdf5")};
  o.format = "rlds";
  REQUIRE_THROWS_WITH(RobotDataset(o), Contains("dataset.format: got 'rlds', expected 'libero', 'aloha' or 'lerobot'"));
}

TEST_CASE("bad input: missing key", "[unit][data]") {
  pi0::test::TempDir dir;
  Tiny t;
  t.skip_gripper = true;
  const std::string p = write_tiny(dir.file("a.hdf5"), t);
  REQUIRE_THROWS_WITH(open_libero(p), Contains("a.hdf5: key data/demo_0/obs/gripper_states not found"));
  DatasetOptions o;
  o.paths = {write_tiny(dir.file("b.hdf5"), {})};
  o.action_key = "act";
  REQUIRE_THROWS_WITH(RobotDataset(o), Contains("b.hdf5: key data/demo_0/act not found (dataset.action_key)"));
  H5File::create(dir.file("c.hdf5"));
  REQUIRE_THROWS_WITH(open_libero(dir.file("c.hdf5")), Contains("c.hdf5: key data not found"));
}

TEST_CASE("bad input: wrong dtype, rank or channel count", "[unit][data]") {
  pi0::test::TempDir dir;
  Tiny f;
  f.float_images = true;
  REQUIRE_THROWS_WITH(open_libero(write_tiny(dir.file("f.hdf5"), f)),
                      Contains("f.hdf5: key data/demo_0/obs/agentview_rgb has dtype float32, expected uint8"));
  Tiny r;
  r.rank3_actions = true;
  REQUIRE_THROWS_WITH(open_libero(write_tiny(dir.file("r.hdf5"), r)),
                      Contains("r.hdf5: key data/demo_0/actions (actions) has rank 3, expected (T,) or (T,D)"));
  Tiny c;
  c.channels = 4;
  REQUIRE_THROWS_WITH(open_libero(write_tiny(dir.file("c.hdf5"), c)),
                      Contains("c.hdf5: key data/demo_0/obs/agentview_rgb has 4 channels, expected 3"));
}

TEST_CASE("bad input: empty episode", "[unit][data]") {
  pi0::test::TempDir dir;
  Tiny e;
  e.steps = 0;
  REQUIRE_THROWS_WITH(open_libero(write_tiny(dir.file("e.hdf5"), e)),
                      Contains("e.hdf5: key data/demo_0/actions (actions) is an empty episode (0 steps)"));
}

TEST_CASE("bad input: NaN or Inf in state or actions", "[unit][data]") {
  pi0::test::TempDir dir;
  Tiny n;
  n.nan_state = true;
  REQUIRE_THROWS_WITH(open_libero(write_tiny(dir.file("n.hdf5"), n)),
                      Contains("n.hdf5: key data/demo_0/obs/ee_states (state) holds NaN at step 2, dim 1"));
  Tiny i;
  i.inf_action = true;
  REQUIRE_THROWS_WITH(open_libero(write_tiny(dir.file("i.hdf5"), i)),
                      Contains("i.hdf5: key data/demo_0/actions (actions) holds Inf at step 1, dim 3"));
}

TEST_CASE("bad input: ALOHA without a prompt", "[unit][data]") {
  pi0::test::TempDir dir;
  ExampleDataOptions eo;
  eo.episodes = 1;
  eo.steps = 2;
  eo.image_size = 8;
  DatasetOptions o;
  o.format = "aloha";
  o.paths = {write_example_aloha(dir.str(), eo)};
  REQUIRE_THROWS_WITH(RobotDataset(o), Contains("episode_0.hdf5: ALOHA files store no language instruction; set dataset.prompt"));
}

TEST_CASE("bad input: norm stats with the wrong dimension or missing keys", "[unit][data]") {
  pi0::test::TempDir dir;
  ExampleDataOptions eo;
  eo.episodes = 1;
  eo.steps = 4;
  eo.image_size = 8;
  DatasetOptions o;
  o.paths = {write_example_libero(dir.str(), eo)};
  auto ds = std::make_shared<RobotDataset>(o);
  NormStats s;
  s.keys["state"] = {std::vector<double>(3, 0.0), std::vector<double>(3, 1.0), {}, {}};
  s.keys["actions"] = {std::vector<double>(7, 0.0), std::vector<double>(7, 1.0), {}, {}};
  save_norm_stats(s, dir.file("norm_stats.json"));
  auto transform = std::make_shared<SampleTransform>(TransformOptions{}, load_norm_stats(dir.file("norm_stats.json")),
                                                     pi0::test::tiny_tokenizer());
  LoaderOptions lo;
  lo.batch_size = 2;
  REQUIRE_THROWS_WITH(DataLoader(ds, transform, lo),
                      Contains("norm_stats.json: key norm_stats.state has dim 3, expected 8"));
  // pi0.5 needs quantiles.
  TransformOptions pi05;
  pi05.model_type = "pi05";
  auto t05 = std::make_shared<SampleTransform>(pi05, compute_norm_stats(*ds), pi0::test::tiny_tokenizer());
  NormStats no_q = load_norm_stats(dir.file("norm_stats.json"));
  no_q.keys["state"] = {std::vector<double>(8, 0.0), std::vector<double>(8, 1.0), {}, {}};
  REQUIRE_THROWS_WITH(SampleTransform(pi05, no_q, pi0::test::tiny_tokenizer()).check_dims(8, 7),
                      Contains("norm_stats.json: key norm_stats.state has no q01/q99"));
  std::ofstream(dir.file("bad.json")) << "{\"norm_stats\": {\"state\": {\"mean\": [1]}}}";
  REQUIRE_THROWS_WITH(load_norm_stats(dir.file("bad.json")), Contains("bad.json: key norm_stats.state.std not found"));
  std::ofstream(dir.file("nokey.json")) << "{\"norm_stats\": {\"state\": {\"mean\": [1], \"std\": [1]}}}";
  REQUIRE_THROWS_WITH(SampleTransform(TransformOptions{}, load_norm_stats(dir.file("nokey.json")), pi0::test::tiny_tokenizer()),
                      Contains("nokey.json: key norm_stats.actions not found"));
  REQUIRE_THROWS_WITH(load_norm_stats(dir.file("missing.json")), Contains("missing.json: file not found"));
}
