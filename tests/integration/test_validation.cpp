// Training on held-out data and mixtures end to end: validation passes (the same value on every pass, across a
// resume and whatever else the run does), checkpoint.keep_best, train.loss_mask through a real training step, and a
// mixture of an HDF5 and a LeRobot dataset with different dims trained, exported and served per dataset.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "pi0/config/config.h"
#include "pi0/data/config_options.h"
#include "pi0/data/dataset.h"
#include "pi0/data/example_data.h"
#include "pi0/io/bundle.h"
#include "pi0/io/checkpoint_dir.h"
#include "pi0/io/manifest.h"
#include "pi0/io/safetensors.h"
#include "pi0/train/data_setup.h"
#include "pi0/train/metrics.h"
#include "pi0/train/trainer.h"
#include "pi0/train/trainer_state.h"
#include "support/app_process.h"
#include "support/log_capture.h"
#include "support/test_support.h"
#include "support/corrupt.h"
#include "support/run_metrics.h"
#include "support/tiny_run.h"
#include "unit/data/lerobot_test_util.h"

using namespace pi0;
using pi0::testing::TinyRun;
using Catch::Contains;
using pi0::testing::metric_by_step;
using pi0::testing::set_val_loss;

namespace {

const std::vector<std::string> kSplit = {"data.validation_split=0.34", "train.val_samples=6", "train.ema_decay=0"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::set<int64_t> kept_steps(const std::string& run_dir) {
  const auto steps = io::complete_checkpoints(run_dir);
  return {steps.begin(), steps.end()};
}

}  // namespace

TEST_CASE("validation: val_loss is the same on every pass, across a resume, and keep_best keeps the best",
          "[integration][train]") {
  TinyRun run;
  // A: 4 steps, a checkpoint and (keep_best) a validation pass after every step; only the newest and the 2 best stay.
  train::Trainer a(run.config("a", with(kSplit, {"train.num_steps=4", "checkpoint.save_interval=1",
                                                 "checkpoint.keep_last=1", "checkpoint.keep_best=2"})));
  a.run();
  const auto val_a = metric_by_step(run.dir.str("a"), "val_loss");
  const auto mse_a = metric_by_step(run.dir.str("a"), "val_action_mse");
  REQUIRE(val_a.size() == 4);
  REQUIRE(mse_a.size() == 4);
  for (const auto& [step, v] : val_a) {
    CHECK(std::isfinite(v));
    CHECK(v > 0);
    CHECK(std::isfinite(mse_a.at(step)));
  }
  // keep_best: the newest (keep_last 1) and the two lowest val_loss of steps 1..3 plus 4 — exactly those.
  std::vector<std::pair<double, int64_t>> ranked;
  for (const auto& [step, v] : val_a) ranked.emplace_back(v, step);
  std::sort(ranked.begin(), ranked.end());
  std::set<int64_t> expected = {4, ranked[0].second, ranked[1].second};
  const auto kept = io::complete_checkpoints(run.dir.str("a"));
  CHECK(std::set<int64_t>(kept.begin(), kept.end()) == expected);
  for (const int64_t step : kept) {
    const auto state = train::read_trainer_state(io::checkpoint_path(run.dir.str("a"), step));
    REQUIRE(state.val_loss.has_value());
    CHECK(*state.val_loss == val_a.at(step));
  }

  // B: the same training with validation only every 2 steps, stopped after 2 and resumed to 4. Validation draws
  // nothing from the training streams, so B trains exactly as A, and its passes give A's values.
  const auto b_cfg = [&](int64_t steps) {
    return run.config("b", with(kSplit, {"train.num_steps=" + std::to_string(steps), "train.val_interval=2",
                                         "checkpoint.save_interval=2"}));
  };
  {
    train::Trainer b(b_cfg(2));
    b.run();
    const auto once = b.validate(), twice = b.validate();
    REQUIRE(once.has_value());
    CHECK(once->loss == twice->loss);  // fixed noise and time: bit for bit
    CHECK(once->action_mse == twice->action_mse);
    CHECK(once->samples == 6);
    CHECK(once->loss == val_a.at(2));
  }
  {
    train::RunOptions ro;
    ro.resume = true;
    train::Trainer b(b_cfg(4), ro);
    b.run();
  }
  const auto val_b = metric_by_step(run.dir.str("b"), "val_loss");
  REQUIRE(val_b.size() == 2);
  CHECK(val_b.at(2) == val_a.at(2));
  CHECK(val_b.at(4) == val_a.at(4));
  CHECK(metric_by_step(run.dir.str("b"), "loss") == metric_by_step(run.dir.str("a"), "loss"));
}

TEST_CASE("validation: a resume that changes the held-out set is refused with one line naming the key and both "
          "values", "[integration][train]") {
  TinyRun run;
  const auto base = with(kSplit, {"train.num_steps=1", "checkpoint.save_interval=1"});
  train::Trainer(run.config("a", base)).run();
  const auto seed = run.config("a", base).train.seed;
  train::RunOptions ro;
  ro.resume = true;
  const auto dir = io::checkpoint_path(run.dir.str("a"), 1);
  // Each key that chooses the held-out episodes or their samples, changed alone: refused before the model is built.
  const std::vector<std::pair<std::string, std::string>> changes = {
      {"data.validation_split=0.5", "data.validation_split is 0.5 but was 0.34"},
      {"data.validation_split=0", "data.validation_split is 0.0 but was 0.34"},
      {"train.seed=" + std::to_string(seed + 1),
       "train.seed is " + std::to_string(seed + 1) + " but was " + std::to_string(seed)},
      {"train.val_samples=4", "train.val_samples is 4 but was 6"},
  };
  for (const auto& [set, expected] : changes) {
    INFO(set);
    CHECK_THROWS_WITH(train::Trainer(run.config("a", with(base, {set, "train.num_steps=2"})), ro),
                      Contains("--resume: " + expected + " when checkpoint " + dir + " was written") &&
                          Contains("pass --new-validation-set") && !Contains("\n"));
  }
  CHECK_NOTHROW(train::Trainer(run.config("a", with(base, {"train.num_steps=2"})), ro));  // unchanged: resumes
  // The same keys over other episodes: the data changed (a copy of the file adds episodes).
  const auto first = *std::filesystem::directory_iterator(run.dir.str("data"));
  std::filesystem::copy_file(first.path(), run.dir.str("data") + "/more.hdf5");
  CHECK_THROWS_WITH(train::Trainer(run.config("a", with(base, {"train.num_steps=2"})), ro),
                    Contains("--resume: the held-out validation set differs from the one checkpoint " + dir +
                             " was written with, though data.validation_split, train.seed and train.val_samples are "
                             "the same (the datasets or an entry's validation_episodes changed)") &&
                        !Contains("\n"));
}

TEST_CASE("validation: --new-validation-set resumes with another held-out set and keep_best ranks afresh",
          "[integration][train]") {
  TinyRun run;
  const auto cfg = [&](const std::string& split, int64_t steps, int64_t keep_last) {
    return run.config("a", with(kSplit, {"data.validation_split=" + split, "train.num_steps=" + std::to_string(steps),
                                         "checkpoint.save_interval=1",
                                         "checkpoint.keep_last=" + std::to_string(keep_last),
                                         "checkpoint.keep_best=1"}));
  };
  train::Trainer(cfg("0.34", 2, 2)).run();
  // Step 1 ranks best of the old set, whatever the passes measured (a resealed, verified value).
  set_val_loss(run.dir.str("a"), 1, 0.0, /*reseal=*/true);
  testing::LogCapture log;
  train::RunOptions ro;
  ro.resume = true;
  ro.new_validation_set = true;
  train::Trainer(cfg("0.5", 4, 1), ro).run();
  CHECK_THAT(log.text(), Contains("--new-validation-set: data.validation_split is 0.5 but was 0.34 when checkpoint " +
                                  io::checkpoint_path(run.dir.str("a"), 2) + " was written; val_loss up to step 2 is "
                                  "not comparable with later values, and checkpoint.keep_best ranks only "
                                  "checkpoints of the new set"));
  // Steps 1 and 2 were measured on the old set: no longer ranked, so rotation removed them; the best of 3 and 4 and
  // the newest stay.
  const auto kept = kept_steps(run.dir.str("a"));
  CHECK(kept.count(1) == 0);
  CHECK(kept.count(2) == 0);
  CHECK(kept.count(4) == 1);
  // A later resume with the new set is the same set: no refusal.
  ro.new_validation_set = false;
  CHECK_NOTHROW(train::Trainer(cfg("0.5", 5, 1), ro));
}

TEST_CASE("checkpoint.keep_best ranks only checkpoints that verify and never deletes a verified one to keep another",
          "[integration][train]") {
  TinyRun run;
  const auto cfg = [&](int64_t steps, int64_t keep_last) {
    return run.config("a", with(kSplit, {"train.num_steps=" + std::to_string(steps), "checkpoint.save_interval=1",
                                         "checkpoint.keep_last=" + std::to_string(keep_last),
                                         "checkpoint.keep_best=1"}));
  };
  train::Trainer(cfg(4, 4)).run();
  REQUIRE(kept_steps(run.dir.str("a")) == std::set<int64_t>{1, 2, 3, 4});
  // Step 2 the true best (val_loss is a mean of squares: no pass goes below 0, and ties keep the older), resealed so
  // it verifies; step 3 edited after the fact to rank first, its manifest left as it was.
  set_val_loss(run.dir.str("a"), 2, 0.0, /*reseal=*/true);
  set_val_loss(run.dir.str("a"), 3, -1e9, /*reseal=*/false);
  testing::LogCapture log;
  train::RunOptions ro;
  ro.resume = true;
  train::Trainer(cfg(6, 1), ro).run();
  // The newest (keep_last 1), the verified best, and the one that fails verification, left untouched as a resume
  // leaves one.
  CHECK(kept_steps(run.dir.str("a")) == std::set<int64_t>{2, 3, 6});
  CHECK(*train::read_trainer_state(io::checkpoint_path(run.dir.str("a"), 3)).val_loss == -1e9);
  CHECK_THAT(log.text(), Contains("checkpoint.keep_best: checkpoint " + io::checkpoint_path(run.dir.str("a"), 3) +
                                  " does not verify, so its val_loss is not ranked and it is left untouched: "));
}

TEST_CASE("loss masks: a step's loss is the mean over the positions kept, as derived by hand, off by default",
          "[integration][train]") {
  TinyRun run;
  const auto masked_cfg = run.config("masked", {"train.loss_mask=[episode_end, action_padding]"});
  const auto pipe = train::make_data_pipeline(masked_cfg, 8, 0, 1);
  // Frames near the ends of 30-frame episodes: 1, 2, 5 and 8 recorded rows of the 8-row chunk.
  const std::vector<data::SampleRef> refs = {{0, 29}, {0, 28}, {0, 25}, {0, 3}, {0, 59}, {0, 57}, {0, 10}, {0, 0}};
  const auto batch = data::make_batch(pipe.sources, refs);
  CHECK(torch::equal(batch.action_rows, torch::tensor({1, 2, 5, 8, 1, 3, 8, 8}, torch::kInt64)));
  CHECK(torch::equal(batch.action_dims, torch::full({8}, 7, torch::kInt64)));  // LIBERO's 7 of action_dim 8
  torch::manual_seed(3);
  const auto noise = torch::randn({8, 8, 8});
  const auto time = torch::rand({8}) * 0.9 + 0.05;
  auto step_loss = [&](const config::Config& cfg, torch::Tensor* elementwise) {
    train::Trainer t(cfg);  // same seed: the same initial weights
    {
      torch::NoGradGuard no_grad;
      *elementwise = t.model()->compute_loss(batch.observation, batch.actions, noise, time);
    }
    return t.train_step({batch}, 1e-4, train::StepNoise{{noise}, {time}}).loss;
  };
  torch::Tensor e_masked, e_plain;
  const double masked = step_loss(masked_cfg, &e_masked);
  const double plain = step_loss(run.config("plain"), &e_plain);
  CHECK(torch::equal(e_masked, e_plain));
  // By hand: sample b's rows below its recorded rows, dims below 7.
  double sum = 0, count = 0;
  const auto e = e_plain.to(torch::kFloat64);
  const std::vector<int64_t> rows = {1, 2, 5, 8, 1, 3, 8, 8};
  for (int64_t b = 0; b < 8; ++b) {
    sum += e[b].narrow(0, 0, rows[static_cast<size_t>(b)]).narrow(1, 0, 7).sum().item<double>();
    count += static_cast<double>(rows[static_cast<size_t>(b)] * 7);
  }
  // float32 sums of 8·8·8 values of order 1: relative error well under 1e-5.
  CHECK(masked == Approx(sum / count).epsilon(1e-5));
  CHECK(plain == Approx(e.mean().item<double>()).epsilon(1e-5));  // openpi's mean over every element
  CHECK(std::abs(masked - plain) > 1e-3 * plain);                   // the mask changed it
  // One mask alone: episode_end keeps every dim of the recorded rows.
  torch::Tensor e_end;
  const double end_only = step_loss(run.config("end", {"train.loss_mask=[episode_end]"}), &e_end);
  double sum_end = 0, count_end = 0;
  for (int64_t b = 0; b < 8; ++b) {
    sum_end += e[b].narrow(0, 0, rows[static_cast<size_t>(b)]).sum().item<double>();
    count_end += static_cast<double>(rows[static_cast<size_t>(b)] * 8);
  }
  CHECK(end_only == Approx(sum_end / count_end).epsilon(1e-5));
}

TEST_CASE("mixture: an HDF5 and a LeRobot video dataset with other dims train, export and infer per dataset",
          "[lerobot][integration][train]") {
  if (!test::lerobot_built()) return;
  if (!testing::apps_built({"pi0-norm-stats", "pi0-train", "pi0-export", "pi0-infer"})) return;
  testing::TempDir dir("mixture");
  data::ExampleDataOptions eo;
  eo.episodes = 4;
  eo.steps = 12;
  eo.image_size = 32;
  data::write_example_libero(dir.str("libero"), eo);  // 8-d state, 7-d actions, 2 cameras
  test::write_lerobot(dir.str("sim"), "--version v3.0 --images h264 --size 32 --state-dim 10 --action-dim 9");
  const std::string yaml = dir.str("mix.yaml");
  {
    auto cfg = YAML::LoadFile(std::string(PI0_SOURCE_DIR) + "/configs/debug.yaml");
    cfg["model"]["action_dim"] = 10;
    cfg["data"].remove("dataset");
    cfg["data"].remove("norm_stats");
    YAML::Node libero, sim;
    libero["format"] = "libero";
    libero["paths"].push_back(dir.str("libero") + "/*.hdf5");
    libero["weight"] = 2;
    libero["norm_stats"] = dir.str("libero_stats.json");
    libero["asset_id"] = "libero";
    sim["format"] = "lerobot";
    sim["paths"].push_back(dir.str("sim"));
    sim["norm_stats"] = dir.str("sim_stats.json");
    sim["asset_id"] = "sim";
    sim["validation_episodes"].push_back(1);
    cfg["data"]["datasets"].push_back(libero);
    cfg["data"]["datasets"].push_back(sim);
    cfg["data"]["tokenizer"] = std::string(PI0_SOURCE_DIR) + "/data/tokenizer/tiny_spm.model";
    cfg["data"]["validation_split"] = 0.25;
    cfg["train"]["num_steps"] = 2;
    cfg["train"]["batch_size"] = 4;
    cfg["train"]["val_samples"] = 4;
    cfg["checkpoint"]["run_dir"] = dir.str("run");
    cfg["checkpoint"]["save_interval"] = 2;
    std::ofstream(yaml) << YAML::Dump(cfg);
  }
  auto ok = [&](const char* app, const std::string& args) {
    const auto r = testing::run_app_process(app, args, dir);
    INFO(app << " " << args << "\n" << r.out << r.err);
    REQUIRE(r.code == 0);
    return r;
  };
  ok("pi0-norm-stats", "--config " + yaml);
  CHECK(data::load_norm_stats(dir.str("libero_stats.json")).keys.at("actions").mean.size() == 7);
  CHECK(data::load_norm_stats(dir.str("sim_stats.json")).keys.at("actions").mean.size() == 9);
  ok("pi0-train", "--config " + yaml);
  const auto val = metric_by_step(dir.str("run"), "val_loss");
  REQUIRE(val.size() == 1);  // at the end (step 2)
  CHECK(std::isfinite(val.begin()->second));
  ok("pi0-export", "--checkpoint " + dir.str("run") + " --out " + dir.str("bundle") + " --dtype float32");
  std::ifstream cj(dir.str("bundle") + "/config.json");
  const auto config_json = nlohmann::json::parse(cj);
  CHECK(config_json.at("asset_id") == "libero");
  CHECK(config_json.at("assets") == nlohmann::json::array({"libero", "sim"}));
  // One observation per dataset, raw state in each one's units; actions come back in each one's dims.
  for (const auto& [asset, state_dim, action_dim] :
       std::vector<std::tuple<std::string, int64_t, int64_t>>{{"", 8, 7}, {"libero", 8, 7}, {"sim", 10, 9}}) {
    INFO("--asset '" << asset << "'");
    const auto obs = dir.str("obs_" + asset + ".safetensors");
    io::save_safetensors(obs, {{"image/base_0_rgb", torch::randint(0, 256, {1, 32, 32, 3}).to(torch::kUInt8)},
                               {"state", torch::randn({1, state_dim})}});
    const auto out = dir.str("actions_" + asset + ".safetensors");
    ok("pi0-infer", "--bundle " + dir.str("bundle") + " --obs " + obs + " --prompt 'pick up' --num-steps 2 --out " +
                        out + (asset.empty() ? std::string() : " --asset " + asset));
    const auto actions = io::SafetensorsFile(out).get_copy("actions_unnormalized");
    CHECK(actions.sizes() == torch::IntArrayRef({1, 8, action_dim}));
    CHECK(torch::isfinite(actions).all().item<bool>());
    const auto bundle = io::load_bundle(dir.str("bundle"), torch::kCPU, std::nullopt, asset);
    CHECK(bundle.config.data.dataset.format == (asset == "sim" ? "lerobot" : "libero"));
    CHECK(bundle.assets == std::vector<std::string>{"libero", "sim"});
  }
  const auto bad = testing::run_app_process("pi0-infer", "--bundle " + dir.str("bundle") + " --obs " +
                                                             dir.str("obs_sim.safetensors") + " --out x --asset aloha",
                                            dir);
  CHECK(bad.code == 2);
  CHECK(bad.err.find("--asset 'aloha': not in the bundle") != std::string::npos);
  CHECK(bad.err.find("(its assets: libero, sim)") != std::string::npos);

  // Issue 49 item 5: the sim observation without --asset met the first asset's stats ("recompute the norm stats");
  // the error now names the assets, the one its dims fit, and the flag.
  const auto unpicked = testing::run_app_process(
      "pi0-infer", "--bundle " + dir.str("bundle") + " --obs " + dir.str("obs_sim.safetensors") +
                       " --prompt x --num-steps 1 --out " + dir.str("unpicked.safetensors"), dir);
  INFO(unpicked.err);
  CHECK(unpicked.code == 2);
  CHECK_THAT(unpicked.err, Contains("; the bundle holds assets libero (state 8, actions 7), sim (state 10, actions 9) "
                                    "and used 'libero' (its first): the observation's 10 state dims fit sim; pick one "
                                    "with --asset NAME"));
  CHECK(!std::filesystem::exists(dir.str("unpicked.safetensors")));
  // pi0-serve's wording (its --robot check): the robot's action dims, the assets with at least as many.
  const auto first = io::load_bundle(dir.str("bundle"));
  CHECK_THAT(io::asset_hint(first, "the robot's 9 action dims", -1, 9), Contains(": the robot's 9 action dims fit sim;"));
  CHECK_THAT(io::asset_hint(first, "the robot's 14 action dims", -1, 14), Contains("fit none of them"));
  CHECK(io::asset_hint(io::load_bundle(dir.str("bundle"), torch::kCPU, std::nullopt, "libero"), "x", 10).empty());

  // Issue 49 item 6: an observation file from any dataset the trainer reads, by episode and frame, with its prompt:
  // the HDF5 (LIBERO) entry and the LeRobot one, read by the trainer's readers; pi0-infer then runs on it as is.
  const auto cfg = config::load_config(yaml);
  for (const auto& [index, asset] : std::vector<std::pair<size_t, std::string>>{{0, "libero"}, {1, "sim"}}) {
    INFO("data.datasets[" << index << "]");
    const std::string obs = dir.str("frame_" + asset + ".safetensors");
    ok("pi0-make-example-data", "--config " + yaml + " --dataset " + std::to_string(index) +
                                    " --episode 1 --frame 3 --observation-out " + obs);
    auto d = data::dataset_options(config::for_dataset(cfg, index), config::dataset_key(cfg, index));
    data::RobotDataset ds(d);
    const auto sample = ds.get(ds.episode(1).first_index + 3);
    REQUIRE(sample.episode == 1);
    REQUIRE(sample.frame == 3);
    io::SafetensorsFile file(obs);
    CHECK(!sample.prompt.empty());
    CHECK(file.metadata().at("prompt") == sample.prompt);
    CHECK(torch::equal(file.get_copy("state"), sample.state.unsqueeze(0).to(torch::kFloat32)));
    CHECK(torch::equal(file.get_copy("image/base_0_rgb"), sample.images[0].unsqueeze(0)));
    const auto r = ok("pi0-infer", "--bundle " + dir.str("bundle") + " --obs " + obs + " --asset " + asset +
                                       " --num-steps 2 --out " + dir.str("made/by/infer/" + asset + ".safetensors"));
    CHECK(io::SafetensorsFile(dir.str("made/by/infer/" + asset + ".safetensors")).contains("actions"));  // item 4
    CHECK_THAT(r.err + r.out, Contains("prompt from " + obs + ": '" + sample.prompt + "'"));
  }
  const auto far = testing::run_app_process("pi0-make-example-data", "--config " + yaml + " --dataset 1 --episode 9 "
                                            "--observation-out " + dir.str("far.safetensors"), dir);
  CHECK(far.code == 2);
  CHECK_THAT(far.err, Contains("--episode: got 9, expected 0.."));
}
