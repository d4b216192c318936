// Subtask prediction in the trainer (train.subtask, docs/subtask.md): the block in the batches from the example
// data's per-frame subtask_index, --dump-batches, the config and data errors naming train.subtask.*, bit-exact resume
// with knowledge insulation and subtasks on (A16), pi0-infer printing the decoded subtask, and a smoke run where
// ce_subtask falls.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pi0/common/check.h"
#include "pi0/common/threads.h"
#include "pi0/data/tokenizer.h"
#include "pi0/io/safetensors.h"
#include "pi0/train/data_setup.h"
#include "pi0/train/metrics.h"
#include "pi0/train/sample_dump.h"
#include "pi0/train/trainer.h"
#include "support/app_process.h"
#include "support/tiny_run.h"
#include "unit/data/data_test_util.h"
#include "unit/data/lerobot_test_util.h"

using namespace pi0;
using Catch::Contains;
using pi0::testing::kTestFastTokenizer;
using pi0::testing::metrics_column;
using pi0::testing::TinyRun;

namespace {

std::vector<std::string> subtask_on(const std::vector<std::string>& more = {}) {
  return testing::with({"train.subtask.enabled=true", "train.subtask.key=subtask_index",
                        "train.subtask.max_tokens=48"},
                       more);
}

}  // namespace

TEST_CASE("train.subtask: batches carry the block of each frame's subtask text", "[integration][train][subtask]") {
  TinyRun run;
  const auto cfg = run.config("run", subtask_on());
  auto pipe = train::make_data_pipeline(cfg, 4, 0, 1);
  const auto batch = pipe.loader->next();
  REQUIRE(batch.subtask_tokens.defined());
  CHECK(batch.subtask_tokens.sizes() == torch::IntArrayRef({4, 48}));
  const data::Tokenizer tok(cfg.data.tokenizer);
  const auto cue = tok.encode("Subtask: ");
  const auto& ds = *pipe.sources.at(0).dataset;
  for (int64_t b = 0; b < 4; ++b) {
    INFO("example " << b);
    // Valid tokens first, then padding; the targets are the valid ones after the cue, and the block ends with EOS.
    const int64_t n = batch.subtask_mask[b].sum().item<int64_t>();
    REQUIRE(n > static_cast<int64_t>(cue.size()) + 1);
    CHECK(batch.subtask_mask[b].narrow(0, 0, n).all().item<bool>());
    CHECK(batch.subtask_targets[b].sum().item<int64_t>() == n - static_cast<int64_t>(cue.size()));
    CHECK(batch.subtask_tokens[b][n - 1].item<int64_t>() == tok.eos_id());
    for (size_t i = 0; i < cue.size(); ++i) CHECK(batch.subtask_tokens[b][static_cast<int64_t>(i)].item<int64_t>() == cue[i]);
    std::vector<int> text;
    for (int64_t i = static_cast<int64_t>(cue.size()); i < n - 1; ++i)
      text.push_back(static_cast<int>(batch.subtask_tokens[b][i].item<int64_t>()));
    const std::string decoded = tok.decode(text);
    CHECK((decoded == "move to the red blob" || decoded == "close the gripper on the blob"));
  }
  // The dataset reads each frame's text from data/demo_N/subtask_index and the list in data's attribute.
  bool saw[2] = {false, false};
  for (int64_t i = 0; i < ds.size(); ++i) {
    const auto s = ds.get(i).subtask;
    saw[0] |= s == "move to the red blob";
    saw[1] |= s == "close the gripper on the blob";
  }
  CHECK((saw[0] && saw[1]));
}

TEST_CASE("train.subtask: --dump-batches shows the subtask text and the block", "[integration][train][subtask]") {
  TinyRun run;
  const auto out = run.dir.str("dump");
  train::dump_samples(run.config("run", subtask_on()), 2, out);
  std::ifstream in(out + "/sample_000/sample.json");
  REQUIRE(in);
  const auto j = nlohmann::json::parse(in);
  const std::string subtask = j.at("subtask").get<std::string>();
  CHECK((subtask == "move to the red blob" || subtask == "close the gripper on the blob"));
  CHECK(j.at("subtask_text").get<std::string>() == "Subtask: " + subtask);
  CHECK(j.at("subtask_target_text").get<std::string>() == subtask);
  CHECK(j.at("subtask_tokens").size() > 3);
}

TEST_CASE("train.subtask: config and data errors are one line naming the key", "[integration][train][subtask]") {
  TinyRun run;
  const auto err = [&](std::vector<std::string> o) -> std::string {
    try {
      train::make_data_pipeline(run.config("run", std::move(o)), 2, 0, 1);
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  };
  CHECK_THAT(err({"train.subtask.enabled=true"}), Contains("train.subtask.key"));
  CHECK_THAT(err(subtask_on({"model.type=pi0"})), Contains("train.subtask.enabled") && Contains("pi05"));
  CHECK_THAT(err(subtask_on({"train.subtask.max_tokens=1"})), Contains("train.subtask.max_tokens") && Contains(">= 2"));
  CHECK_THAT(err(subtask_on({"train.subtask.weight=-1"})), Contains("train.subtask.weight"));
  CHECK_THAT(err(subtask_on({"train.subtask.max_tokens=3"})),
             Contains("train.subtask.max_tokens: got 3, expected >= ") && Contains("(the cue's"));
  CHECK_THAT(err(subtask_on({"train.subtask.cue=''"})), Contains("train.subtask.cue: '' has no tokens"));
  const auto missing = err(subtask_on({"train.subtask.key=no_such_key"}));
  CHECK_THAT(missing, Contains("train.subtask.key 'no_such_key'") && Contains("neither a dataset nor a string attribute"));
  CHECK(missing.find('\n') == std::string::npos);
}

TEST_CASE("train.subtask: resume is bit-exact with insulation and subtasks on and metrics.jsonl has ce_subtask",
          "[integration][train][subtask]") {
  TinyRun run;
  const auto cfg = [&](const std::string& name, int64_t steps) {
    return run.config(name, subtask_on({"train.num_steps=" + std::to_string(steps), "checkpoint.save_interval=2",
                                        "train.ki.enabled=true", "train.ki.fast_tokenizer=" + kTestFastTokenizer,
                                        "train.ki.max_fast_tokens=48", "train.subtask.weight=0.5"}));
  };
  {
    train::Trainer t(cfg("straight", 4));
    CHECK(t.run() == 4);
  }
  {
    train::Trainer t(cfg("resumed", 2));
    CHECK(t.run() == 2);
  }
  train::RunOptions resume;
  resume.resume = true;
  {
    train::Trainer t(cfg("resumed", 4), resume);
    CHECK(t.run() == 4);
  }
  for (const char* key : {"loss", "ce_fast", "flow_loss", "ce_subtask", "subtask_acc"}) {
    INFO(key);
    const auto a = metrics_column(run.dir.str("straight"), key), b = metrics_column(run.dir.str("resumed"), key);
    REQUIRE(a.size() == 4);
    CHECK(a == b);  // exact
  }
  // loss = ce_weight·ce_fast + weight·ce_subtask + flow_weight·flow_loss (1, 0.5, 10).
  const auto loss = metrics_column(run.dir.str("straight"), "loss"),
             ce = metrics_column(run.dir.str("straight"), "ce_fast"),
             sub = metrics_column(run.dir.str("straight"), "ce_subtask"),
             flow = metrics_column(run.dir.str("straight"), "flow_loss");
  for (size_t i = 0; i < loss.size(); ++i) CHECK(loss[i] == Approx(ce[i] + 0.5 * sub[i] + 10 * flow[i]).epsilon(1e-6));
  const auto ck_a = run.dir.str("straight") + "/checkpoints/4/", ck_b = run.dir.str("resumed") + "/checkpoints/4/";
  const auto wa = io::read_safetensors(ck_a + "model.safetensors"), wb = io::read_safetensors(ck_b + "model.safetensors");
  REQUIRE(wa.size() == wb.size());
  for (const auto& [k, v] : wa) CHECK(torch::equal(v, wb.at(k)));
}

TEST_CASE("train.subtask smoke: the tiny pi0.5 learns the subtask and ce_subtask falls on held-out episodes too",
          "[integration][train][subtask][slow]") {
  TinyRun run;
  const int threads_before = pi0::thread_counts().aten;
  pi0::set_num_threads(1);
  train::Trainer t(run.config("smoke", subtask_on({"model.image_size=28", "model.max_token_len=48",
                                                   "train.num_steps=100", "train.batch_size=16",
                                                   "train.log_interval=10", "train.metrics_interval=0",
                                                   "checkpoint.save_interval=1000", "data.validation_split=0.2",
                                                   "train.val_interval=50", "train.val_samples=16"})));
  t.run();
  pi0::set_num_threads(threads_before);
  const auto ce = metrics_column(run.dir.str("smoke"), "ce_subtask"),
             acc = metrics_column(run.dir.str("smoke"), "subtask_acc"),
             loss = metrics_column(run.dir.str("smoke"), "loss");
  REQUIRE(ce.size() == 10);
  std::printf("subtask smoke: ce_subtask %.3f -> %.3f, subtask_acc %.3f -> %.3f, loss %.3f -> %.3f\n", ce.front(),
              ce.back(), acc.front(), acc.back(), loss.front(), loss.back());
  CHECK(ce.back() * 4 < ce.front());
  CHECK(acc.back() > 0.8);
  // Validation reads the block as training does (val_loss: the flow loss after the recorded subtask; its
  // cross-entropy and accuracy) and samples after the model's own decoded subtask (val_action_mse), at steps 50 and
  // 100 on the held-out episode.
  const auto val_ce = metrics_column(run.dir.str("smoke"), "val_ce_subtask"),
             val_acc = metrics_column(run.dir.str("smoke"), "val_subtask_acc"),
             val_mse = metrics_column(run.dir.str("smoke"), "val_action_mse");
  REQUIRE(val_ce.size() == 2);
  REQUIRE(val_acc.size() == 2);
  REQUIRE(val_mse.size() == 2);
  std::printf("subtask smoke, held out: val_ce_subtask %.3f -> %.3f, val_subtask_acc %.3f -> %.3f\n", val_ce.front(),
              val_ce.back(), val_acc.front(), val_acc.back());
  CHECK(val_ce.back() * 4 < ce.front());  // far below the untrained model's cross-entropy
  CHECK(val_acc.back() > 0.5);
  CHECK(std::isfinite(val_mse.back()));
}

TEST_CASE("train.subtask: a LeRobot per-frame integer column indexes meta/tasks, other columns are refused",
          "[integration][lerobot][subtask]") {
  if (!test::lerobot_built()) return;
  test::TempDir dir;
  for (const std::string version : {"v2.1", "v3.0"}) {
    INFO(version);
    const std::string root = dir.file("ds_" + version);
    test::write_lerobot(root, "--version " + version + " --images png");
    data::DatasetOptions o;
    o.format = "lerobot";
    o.paths = {root};
    o.action_horizon = 4;
    // write_lerobot.py's task_index column (episode e: "pick up object {e % 2}") read as the subtask.
    o.subtask_key = "task_index";
    const data::RobotDataset ds(o);
    for (int64_t i = 0; i < ds.size(); ++i) {
      const auto s = ds.get(i);
      CHECK(s.subtask == "pick up object " + std::to_string(s.episode % 2));
    }
    o.subtask_key = "state";  // 8 values per frame
    CHECK_THROWS_WITH(data::RobotDataset(o), Contains("feature 'state' has 8 values per frame, expected 1") &&
                                                 Contains("train.subtask.key"));
    o.subtask_key = "no_such_column";
    CHECK_THROWS_WITH(data::RobotDataset(o), Contains("train.subtask.key: 'no_such_column' is not a feature"));
  }
}

TEST_CASE("train.subtask: pi0-infer on the exported bundle prints the decoded subtask and stores it with the actions",
          "[integration][train][subtask]") {
  TinyRun run;
  train::Trainer(run.config("run", subtask_on({"train.num_steps=2", "checkpoint.save_interval=2"}))).run();
  const std::string bundle = run.dir.str("bundle"), obs = run.dir.str("obs.safetensors"),
                    out = run.dir.str("actions.safetensors");
  const auto ex = testing::run_app_process(
      "pi0-export", "--checkpoint " + run.dir.str("run") + " --out " + bundle + " --dtype float32", run.dir);
  INFO(ex.err);
  REQUIRE(ex.code == 0);
  const auto mk = testing::run_app_process(
      "pi0-make-example-data", "--observation-out " + obs + " --out " + run.dir.str("data"), run.dir);
  INFO(mk.err);
  REQUIRE(mk.code == 0);
  const auto r = testing::run_app_process(
      "pi0-infer", "--bundle " + bundle + " --obs " + obs + " --prompt 'reach the red blob' --out " + out, run.dir);
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Contains("subtask[0]: "));
  CHECK_THAT(r.out, Contains("subtask decoding and sampling"));
  // The decoded text travels with the actions: a JSON list, one entry per example.
  const auto meta = io::SafetensorsFile(out).metadata();
  REQUIRE(meta.count("subtask") == 1);
  const auto texts = nlohmann::json::parse(meta.at("subtask"));
  REQUIRE(texts.is_array());
  CHECK(texts.size() == 1);
  CHECK_THAT(r.out, Contains("subtask[0]: " + texts[0].get<std::string>()));
  CHECK(io::read_safetensors(out).at("actions").size(0) == 1);
}
