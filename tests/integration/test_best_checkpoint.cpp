// What a run with a validation split tells about its checkpoints (issue 49 items 9 and 10): per-dataset validation
// values of a mixture and how they make up the aggregate, the "best so far" log line, and pi0-export / pi0-serve
// --best taking the checkpoint checkpoint.keep_best ranks first, with one-line errors where there is no such ranking.
// pi0-serve --checkpoint serving a run's best: tests/unit/serve/test_serve_best.cpp (built with pi0-serve only).
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "pi0/config/config.h"
#include "pi0/data/example_data.h"
#include "pi0/data/norm_stats.h"
#include "pi0/io/checkpoint_dir.h"
#include "pi0/io/manifest.h"
#include "pi0/io/safetensors.h"
#include "pi0/train/best_checkpoint.h"
#include "pi0/train/metrics.h"
#include "pi0/train/trainer.h"
#include "pi0/train/trainer_state.h"
#include "support/app_process.h"
#include "support/log_capture.h"
#include "support/test_support.h"
#include "support/corrupt.h"
#include "support/run_metrics.h"
#include "support/tiny_run.h"

using namespace pi0;
using Catch::Contains;
using pi0::testing::metric_by_step;
using pi0::testing::set_val_loss;

namespace {

// A mixture of two generated LIBERO-layout datasets ("near" and "far", other episodes each), each with its own norm
// stats, a validation split and keep_best, trained for `num_steps`; written as dir/mix.yaml (the apps read files).
std::string write_mixture(const testing::TempDir& dir, int64_t num_steps = 4) {
  YAML::Node cfg = YAML::LoadFile(std::string(PI0_SOURCE_DIR) + "/configs/debug.yaml");
  cfg["data"].remove("dataset");
  cfg["data"].remove("norm_stats");
  uint64_t seed = 1;
  for (const std::string name : {"near", "far"}) {
    data::ExampleDataOptions eo;
    eo.episodes = 4;
    eo.steps = 16;
    eo.image_size = 32;
    eo.seed = seed++;
    data::write_example_libero(dir.str(name), eo);
    data::DatasetOptions d;
    d.paths = {dir.str(name) + "/*.hdf5"};
    d.action_horizon = 8;
    data::save_norm_stats(data::compute_norm_stats(data::RobotDataset(d)), dir.str(name + ".json"));
    YAML::Node e;
    e["format"] = "libero";
    e["paths"].push_back(dir.str(name) + "/*.hdf5");
    e["norm_stats"] = dir.str(name + ".json");
    e["asset_id"] = name;
    e["weight"] = name == "near" ? 2 : 1;
    cfg["data"]["datasets"].push_back(e);
  }
  cfg["data"]["tokenizer"] = std::string(PI0_SOURCE_DIR) + "/data/tokenizer/tiny_spm.model";
  cfg["data"]["validation_split"] = 0.5;
  cfg["train"]["val_samples"] = 10;
  cfg["train"]["num_steps"] = num_steps;
  cfg["train"]["batch_size"] = 4;
  cfg["train"]["ema_decay"] = 0;
  cfg["train"]["log_interval"] = 1;
  cfg["checkpoint"]["run_dir"] = dir.str("run");
  cfg["checkpoint"]["save_interval"] = 1;
  cfg["checkpoint"]["keep_last"] = 10;  // all kept: the ranking's first is the lowest pass so far
  cfg["checkpoint"]["keep_best"] = 1;
  const auto path = dir.str("mix.yaml");
  std::ofstream(path) << YAML::Dump(cfg);
  return path;
}

}  // namespace

TEST_CASE("validation per dataset: a mixture's values, weighted by their positions, give the aggregate, in the log and "
          "metrics.jsonl", "[integration][train]") {
  testing::TempDir dir("perdataset");
  const auto cfg = config::load_config(write_mixture(dir));
  testing::LogCapture log;
  train::Trainer t(cfg);
  t.run();
  const auto v = t.validate();
  REQUIRE(v.has_value());
  REQUIRE(v->datasets.size() == 2);
  CHECK(v->datasets[0].name == "near");
  CHECK(v->datasets[1].name == "far");
  int64_t samples = 0;
  double loss_sum = 0, loss_positions = 0, mse_sum = 0, mse_positions = 0;
  for (const auto& d : v->datasets) {
    INFO(d.name);
    CHECK(d.samples > 0);  // each held out half its episodes: both are in the 10 samples
    // Without train.loss_mask every sample counts its whole chunk (horizon 8 × action_dim 8) in the loss, and its
    // robot's own 7 action dims in val_action_mse: the position weights are sample weights.
    CHECK(d.loss_positions == static_cast<double>(d.samples * 8 * 8));
    CHECK(d.action_positions == static_cast<double>(d.samples * 8 * 7));
    samples += d.samples;
    loss_sum += d.loss * static_cast<double>(d.samples);
    mse_sum += d.action_mse * static_cast<double>(d.samples);
    loss_positions += d.loss_positions;
    mse_positions += d.action_positions;
  }
  CHECK(samples == v->samples);
  // The aggregate is Σ numerators / Σ positions (float64 sums of per-sample float32 sums), so the sample-weighted
  // mean of the datasets' values equals it up to float64 rounding.
  CHECK(loss_sum / static_cast<double>(samples) == Approx(v->loss).epsilon(1e-12));
  CHECK(mse_sum / static_cast<double>(samples) == Approx(v->action_mse).epsilon(1e-12));
  CHECK(v->datasets[0].loss != v->datasets[1].loss);  // other data, other values: not the aggregate copied

  // metrics.jsonl: every pass has both datasets' values beside the aggregate, in the same relation.
  const auto run = dir.str("run");
  const auto agg = metric_by_step(run, "val_loss"), agg_mse = metric_by_step(run, "val_action_mse");
  const auto near = metric_by_step(run, "val_loss/near"), far = metric_by_step(run, "val_loss/far");
  const auto near_mse = metric_by_step(run, "val_action_mse/near"), far_mse = metric_by_step(run, "val_action_mse/far");
  REQUIRE(agg.size() == 4);  // keep_best: a pass before every save
  REQUIRE(near.size() == 4);
  REQUIRE(far.size() == 4);
  REQUIRE(near_mse.size() == 4);
  REQUIRE(far_mse.size() == 4);
  const double wn = static_cast<double>(v->datasets[0].samples), wf = static_cast<double>(v->datasets[1].samples);
  for (const auto& [step, value] : agg) {
    INFO("step " << step);
    CHECK((wn * near.at(step) + wf * far.at(step)) / (wn + wf) == Approx(value).epsilon(1e-12));
    CHECK((wn * near_mse.at(step) + wf * far_mse.at(step)) / (wn + wf) == Approx(agg_mse.at(step)).epsilon(1e-12));
  }
  CHECK(near.at(4) == v->datasets[0].loss);  // the pass at step 4 and the one after it: the same weights, same samples
  CHECK_THAT(log.text(), Contains("step 4/4 |   dataset 'near': val_loss ") &&
                             Contains("samples"));
  CHECK_THAT(log.text(), Contains("step 4/4 |   dataset 'far': val_loss "));
}

TEST_CASE("validation of a single dataset adds no per-dataset keys", "[integration][train]") {
  testing::TinyRun run;
  train::Trainer(run.config("a", {"data.validation_split=0.34", "train.val_samples=4", "train.num_steps=1"})).run();
  for (const auto& r : train::read_metrics(run.dir.str("a") + "/metrics.jsonl"))
    for (auto it = r.begin(); it != r.end(); ++it) CHECK(it.key().find('/') == std::string::npos);
  CHECK(metric_by_step(run.dir.str("a"), "val_loss").size() == 1);
}

TEST_CASE("keep_best: the log names the best checkpoint at each pass, and pi0-export --best exports it",
          "[integration][train]") {
  if (!testing::apps_built({"pi0-export", "pi0-serve"})) return;
  testing::TempDir dir("best");
  const auto yaml = write_mixture(dir, 3);
  {
    testing::LogCapture log;
    train::Trainer(config::load_config(yaml)).run();
    // After every pass (and the save at its step), the first of keep_best's ranking: the lowest val_loss so far.
    const auto val = metric_by_step(dir.str("run"), "val_loss");
    REQUIRE(val.size() == 3);
    double best = INFINITY;
    int64_t best_step = 0;
    for (const auto& [step, value] : val) {
      if (value < best) best = value, best_step = step;
      CHECK_THAT(log.text(), Contains(fmt::format("best so far: step {} (val_loss {:.4f}), checkpoint {}", best_step,
                                                  best, io::checkpoint_path(dir.str("run"), best_step))));
    }
  }
  // Whatever the passes measured, step 2 now ranks first (a verified value) while step 3 is the newest: --best must
  // take 2, the default 3.
  REQUIRE(io::complete_checkpoints(dir.str("run")) == std::vector<int64_t>{1, 2, 3});
  set_val_loss(dir.str("run"), 1, 0.5, /*reseal=*/true);
  set_val_loss(dir.str("run"), 2, 1e-6, /*reseal=*/true);
  set_val_loss(dir.str("run"), 3, 1.0, /*reseal=*/true);
  const auto ranked = train::best_checkpoints(dir.str("run"), "--best");
  REQUIRE(ranked.size() == 3);
  CHECK(ranked[0].step == 2);
  CHECK(ranked[0].val_loss == 1e-6);
  CHECK(ranked[1].step == 1);

  auto app = [&](const char* name, const std::string& args) { return testing::run_app_process(name, args, dir); };
  const auto best = app("pi0-export", "--checkpoint " + dir.str("run") + " --best --out " + dir.str("best_bundle"));
  INFO(best.out << best.err);
  REQUIRE(best.code == 0);
  CHECK_THAT(best.out + best.err, Contains("--best: the best checkpoint of " + dir.str("run") + " is step 2 (val_loss "
                                           "1e-06), " + io::checkpoint_path(dir.str("run"), 2)));
  const auto newest = app("pi0-export", "--checkpoint " + dir.str("run") + " --out " + dir.str("newest_bundle"));
  REQUIRE(newest.code == 0);
  // The bundles hold those checkpoints' weights: step 2's and step 3's differ.
  const auto w2 = io::read_safetensors(dir.str("best_bundle") + "/model.safetensors");
  const auto w3 = io::read_safetensors(dir.str("newest_bundle") + "/model.safetensors");
  bool differ = false;
  for (const auto& [name, t] : w2) differ = differ || !torch::equal(t, w3.at(name));
  CHECK(differ);

  // A ranked checkpoint whose contents do not verify is passed over for the next best, named in a warning.
  {
    const auto model = io::checkpoint_path(dir.str("run"), 2) + "/model.safetensors";
    const auto size = std::filesystem::file_size(model);
    std::fstream f(model, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size - 3));
    f.put('\x7f');
  }
  const auto fallback = app("pi0-export", "--checkpoint " + dir.str("run") + " --best --out " + dir.str("fallback"));
  CHECK(fallback.code == 0);
  CHECK_THAT(fallback.err + fallback.out, Contains("does not verify and is skipped") &&
                                              Contains("--best: falling back to the next best, step 1"));

}

TEST_CASE("pi0-export and pi0-serve --best errors: one line naming the flag and what is missing, exit 2, nothing written",
          "[integration][train]") {
  if (!testing::apps_built({"pi0-export", "pi0-serve"})) return;
  testing::TinyRun run;
  // A run without keep_best (and without a validation split).
  train::Trainer(run.config("plain", {"train.num_steps=1", "checkpoint.save_interval=1"})).run();
  auto app = [&](const char* name, const std::string& args) { return testing::run_app_process(name, args, run.dir); };
  const auto plain = app("pi0-export", "--checkpoint " + run.dir.str("plain") + " --best --out " + run.dir.str("b"));
  CHECK(plain.code == 2);
  CHECK_THAT(plain.err, Contains("--best: run '" + run.dir.str("plain") + "' was trained without checkpoint.keep_best "
                                 "(and without a validation split; ") &&
                            Contains("drop --best to use the newest, or train with data.validation_split and "
                                     "checkpoint.keep_best: 1"));
  CHECK(std::count(plain.err.begin(), plain.err.end(), '\n') == 1);
  CHECK_FALSE(std::filesystem::exists(run.dir.str("b")));
  // One checkpoint instead of a run directory.
  const auto one = app("pi0-export", "--checkpoint " + io::checkpoint_path(run.dir.str("plain"), 1) + " --best --out " +
                                         run.dir.str("b"));
  CHECK(one.code == 2);
  CHECK_THAT(one.err, Contains("--best: '" + io::checkpoint_path(run.dir.str("plain"), 1) + "' is one checkpoint; "
                               "--best picks among a run directory's checkpoints"));
  CHECK_FALSE(std::filesystem::exists(run.dir.str("b")));
  // keep_best, but no checkpoint records a val_loss (removed after the fact, resealed).
  train::Trainer(run.config("nopass", {"train.num_steps=1", "checkpoint.save_interval=1", "data.validation_split=0.34",
                                       "train.val_samples=4", "checkpoint.keep_best=1"}))
      .run();
  {
    const auto ck = io::checkpoint_path(run.dir.str("nopass"), 1);
    nlohmann::json j;
    std::ifstream(ck + "/" + io::kTrainerStateFile) >> j;
    j.erase("val_loss");
    std::ofstream(ck + "/" + io::kTrainerStateFile) << j.dump(2) << "\n";
    io::write_manifest(ck, 1);
  }
  const auto none = app("pi0-export", "--checkpoint " + run.dir.str("nopass") + " --best --out " + run.dir.str("b"));
  CHECK(none.code == 2);
  CHECK_THAT(none.err, Contains("--best: no checkpoint of '" + run.dir.str("nopass") + "' that verifies records a "
                                "val_loss"));
  CHECK_FALSE(std::filesystem::exists(run.dir.str("b")));
  // pi0-serve: --best without --checkpoint, and the same refusal as pi0-export for a run without keep_best.
  const auto serve_bundle = app("pi0-serve", "--bundle " + run.dir.str("x") + " --best");
  CHECK(serve_bundle.code == 2);
  CHECK_THAT(serve_bundle.err, Contains("--best: needs --checkpoint RUN_DIR"));
  const auto serve_plain = app("pi0-serve", "--checkpoint " + run.dir.str("plain") + " --best --port 0");
  CHECK(serve_plain.code == 2);
  CHECK_THAT(serve_plain.err, Contains("--best: run '" + run.dir.str("plain") + "' was trained without "
                                       "checkpoint.keep_best"));
  const auto neither = app("pi0-serve", "--port 0");
  CHECK(neither.code == 2);
  CHECK_THAT(neither.err, Contains("--bundle: missing; give a bundle (pi0-export --out) or --checkpoint RUN_DIR"));
}
