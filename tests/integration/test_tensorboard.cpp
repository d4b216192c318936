// train.tensorboard end to end, read by TensorBoard itself: a tiny training with validation, interrupted after its
// checkpoint and resumed, then tests/train/read_tensorboard.py (PyPI's tensorboard, pinned, in a venv under the build
// folder) reads the event files. Every metrics.jsonl value must come back at its step as the same float32, the first
// batch's camera views at step 0, one file per start and no step twice; a record torn by a kill is skipped.
// A mixture of two datasets: its per-dataset validation values (val_loss/<asset id>, issue 49 item 10) are among
// those compared.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "pi0/common/fs.h"
#include "pi0/config/config.h"
#include "pi0/data/dataset.h"
#include "pi0/data/example_data.h"
#include "pi0/data/norm_stats.h"
#include "pi0/io/checkpoint_dir.h"
#include "pi0/train/metrics.h"
#include "pi0/train/trainer.h"
#include "support/skip.h"
#include "support/test_support.h"
#include "support/tiny_run.h"

using namespace pi0;
using pi0::testing::TinyRun;
namespace fs = pi0::posix_fs;

namespace {

/// The TensorBoard the reader is pinned to (tensorboard.backend.event_processing's loaders read the files).
constexpr char kTensorBoardPackage[] = "tensorboard==2.21.0";

std::string run_capture(const std::string& cmd, int* rc) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  while (p && fgets(buf, sizeof buf, p)) out += buf;
  *rc = p ? pclose(p) : -1;
  return out;
}

// <build>/tensorboard_venv's python, made once under a lock (test cases run in parallel). Without python3-venv or
// PyPI the case skips visibly, or fails with PI0_REQUIRE_TENSORBOARD=1 (CI); returns "" then.
std::string tensorboard_python() {
  const std::string venv = std::string(PI0_BINARY_DIR) + "/tensorboard_venv";
  const std::string cmd = "flock " + venv + ".lock sh -c '" + venv +
                          "/bin/python -c \"import tensorboard, PIL\" 2>/dev/null || { rm -rf " + venv +
                          " && python3 -m venv " + venv + " && " + venv +
                          "/bin/pip install -q --disable-pip-version-check " + kTensorBoardPackage + "; }'";
  int rc = 0;
  const std::string text = run_capture(cmd, &rc);
  if (rc == 0) return venv + "/bin/python";
  const std::string why = "creating the tensorboard venv failed (needs python3-venv and PyPI access): " + cmd + "\n" + text;
  const char* require = std::getenv("PI0_REQUIRE_TENSORBOARD");
  if (require && std::string(require) == "1") {
    FAIL_CHECK(why << "\nand PI0_REQUIRE_TENSORBOARD=1");
  } else {
    testing::skip(why);
  }
  return "";
}

nlohmann::json read_with_tensorboard(const std::string& python, const std::string& dir) {
  int rc = 0;
  const auto out = run_capture(python + " " + PI0_SOURCE_DIR + "/tests/train/read_tensorboard.py " + dir +
                                   " 2>/dev/null", &rc);
  INFO(out);
  REQUIRE(rc == 0);
  return nlohmann::json::parse(out);
}

using Key = std::pair<std::string, int64_t>;  // (tag, step)

// Every numeric value of every metrics.jsonl record, as float32 (what a simple_value holds).
std::map<Key, float> metrics_values(const std::string& run_dir) {
  std::map<Key, float> out;
  for (const auto& r : train::read_metrics(run_dir + "/metrics.jsonl"))
    for (auto it = r.begin(); it != r.end(); ++it)
      if (it.key() != "step" && it.value().is_number())
        out[{it.key(), r.at("step").get<int64_t>()}] = static_cast<float>(it.value().get<double>());
  return out;
}

std::map<Key, float> scalars_of(const nlohmann::json& file) {
  std::map<Key, float> out;
  for (const auto& s : file.at("scalars")) {
    const Key k{s[0].get<std::string>(), s[1].get<int64_t>()};
    CHECK(out.count(k) == 0);  // one value per tag and step in a file
    out[k] = static_cast<float>(s[2].get<double>());
  }
  return out;
}

}  // namespace

TEST_CASE("tensorboard: TensorBoard's reader reads every metrics.jsonl value, the camera views at step 0, one file "
          "per start, no step twice across a resume, and skips a torn last record",
          "[integration][train]") {
  const auto python = tensorboard_python();
  if (python.empty()) return;
  // A mixture of two datasets, so the per-dataset validation values (val_loss/<asset id>) are among those checked.
  TinyRun run;
  data::ExampleDataOptions eo;
  eo.episodes = 4;
  eo.steps = 20;
  eo.seed = 3;
  data::write_example_libero(run.dir.str("second"), eo);
  data::DatasetOptions d;
  d.paths = {run.dir.str("second") + "/*.hdf5"};
  d.action_horizon = 8;
  data::save_norm_stats(data::compute_norm_stats(data::RobotDataset(d)), run.dir.str("second_stats.json"));
  const auto yaml = run.dir.str("tb.yaml");
  {
    auto cfg = YAML::LoadFile(std::string(PI0_SOURCE_DIR) + "/configs/debug.yaml");
    cfg["data"].remove("dataset");
    cfg["data"].remove("norm_stats");
    for (const auto& [glob, stats, asset] :
         std::vector<std::tuple<std::string, std::string, std::string>>{
             {run.data_glob, run.norm_stats, "first"}, {d.paths[0], run.dir.str("second_stats.json"), "second"}}) {
      YAML::Node entry;
      entry["format"] = "libero";
      entry["paths"].push_back(glob);
      entry["norm_stats"] = stats;
      entry["asset_id"] = asset;
      cfg["data"]["datasets"].push_back(entry);
    }
    std::ofstream(yaml) << YAML::Dump(cfg);
  }
  const auto run_dir = run.dir.str("tb");
  const auto config = [&](int64_t steps) {
    return config::load_config(
        yaml, {"data.tokenizer=" + std::string(PI0_SOURCE_DIR) + "/data/tokenizer/tiny_spm.model",
               "checkpoint.run_dir=" + run_dir, "train.log_interval=1", "train.batch_size=8", "data.num_workers=1",
               "train.tensorboard=true", "data.validation_split=0.34", "train.val_samples=8", "train.ema_decay=0",
               "train.num_steps=" + std::to_string(steps), "train.val_interval=2", "checkpoint.save_interval=2"});
  };
  {
    train::Trainer a(config(4));
    a.run();
  }
  // Killed after step 4 was logged but before its checkpoint was complete: the resume continues from step 2, and the
  // first file's steps 3 and 4 (as metrics.jsonl's records) belong to no run any more.
  fs::remove_all(io::checkpoint_path(run_dir, 4));
  {
    train::RunOptions ro;
    ro.resume = true;
    train::Trainer b(config(6), ro);
    b.run();
  }
  const auto expected = metrics_values(run_dir);
  // Training values at every step, validation at 2, 4 and 6.
  CHECK(expected.count({"loss", 6}) == 1);
  CHECK(expected.count({"val_loss", 6}) == 1);
  CHECK(expected.count({"val_action_mse", 4}) == 1);
  CHECK(expected.count({"lr", 3}) == 1);

  const auto read = read_with_tensorboard(python, run_dir);
  const auto& files = read.at("files");
  REQUIRE(files.size() == 2);  // one per start
  std::map<Key, float> all;
  for (size_t i = 0; i < files.size(); ++i) {
    INFO("file " << files[i].at("name"));
    CHECK(files[i].at("name").get<std::string>().rfind("events.out.tfevents.", 0) == 0);
    CHECK(files[i].at("file_version") == "brain.Event:2");
    for (const auto& [key, v] : scalars_of(files[i])) {
      CHECK(all.count(key) == 0);  // no step logged twice across the files
      CHECK((i == 0 ? key.second <= 2 : key.second >= 3));
      all[key] = v;
    }
  }
  CHECK(files[0].at("session_starts").empty());
  CHECK(files[1].at("session_starts") == nlohmann::json::array({3}));
  // Every value, same names and steps, equal as float32.
  CHECK(all.size() == expected.size());
  for (const auto& [key, v] : expected) {
    INFO(key.first << " at step " << key.second);
    REQUIRE(all.count(key) == 1);
    CHECK(all.at(key) == v);
  }
  // What TensorBoard shows (its accumulator over the directory) is the same.
  std::map<Key, float> shown;
  for (const auto& [tag, points] : read.at("accumulator").at("scalars").items())
    for (const auto& p : points) shown[{tag, p[0].get<int64_t>()}] = static_cast<float>(p[1].get<double>());
  CHECK(shown == expected);

  // The first batch's camera views at step 0: 5 samples (openpi's count) of the micro-batch of 8, the three camera
  // slots side by side at model.image_size; only the first start logs them.
  const int64_t size = config(4).model.image_size;
  const auto& images = files[0].at("images");
  REQUIRE(images.size() == 5);
  std::set<std::string> tags;
  for (const auto& im : images) {
    tags.insert(im[0].get<std::string>());
    CHECK(im[1] == 0);
    CHECK(im[2] == size);
    CHECK(im[3] == 3 * size);
    CHECK(im[4] == size);  // the PNG decodes to the size the event states
    CHECK(im[5] == 3 * size);
  }
  CHECK(tags == std::set<std::string>{"camera_views/0", "camera_views/1", "camera_views/2", "camera_views/3",
                                      "camera_views/4"});
  CHECK(files[1].at("images").empty());
  CHECK(read.at("accumulator").at("images").size() == 5);

  // A run killed while writing its last record: the reader skips the torn record and reads everything before it.
  testing::TempDir cut("tbcut");
  const auto last = run_dir + "/" + files[1].at("name").get<std::string>();
  std::ifstream in(last, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  std::ofstream(cut.str(files[1].at("name").get<std::string>()), std::ios::binary)
      << bytes.substr(0, bytes.size() - 3);
  const auto torn = read_with_tensorboard(python, cut.str());
  REQUIRE(torn.at("files").size() == 1);
  const auto before = files[1].at("scalars"), after = torn.at("files")[0].at("scalars");
  // The last record is step 6's validation values (written after its training values).
  REQUIRE(before.size() > after.size());
  CHECK(before.back()[1] == 6);
  for (size_t i = 0; i < after.size(); ++i) CHECK(after[i] == before[i]);
  std::set<int64_t> steps_lost;
  for (size_t i = after.size(); i < before.size(); ++i) steps_lost.insert(before[i][1].get<int64_t>());
  CHECK(steps_lost == std::set<int64_t>{6});
  CHECK(torn.at("files")[0].at("file_version") == "brain.Event:2");
}
