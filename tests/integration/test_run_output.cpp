// What a run prints and writes for the person reading it (issue 27, "the first hour"): the step range it trains,
// per-step metrics for short runs, the --print-params header and the README's memory figures.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

#include "pi0/config/config.h"
#include "pi0/train/freeze.h"
#include "pi0/train/metrics.h"
#include "pi0/train/memory_plan.h"
#include "pi0/train/trainer.h"
#include "support/app_process.h"
#include "support/log_capture.h"
#include "support/tiny_run.h"

using namespace pi0;
using Catch::Contains;
using pi0::testing::read_text;
using pi0::testing::TinyRun;
namespace fs = std::filesystem;


TEST_CASE("a run names the steps it trains, records metrics at metrics_interval and logs at log_interval",
          "[integration][train]") {
  TinyRun run;
  {
    testing::LogCapture log;
    train::Trainer t(run.config("run", {"train.num_steps=3", "train.log_interval=2", "train.metrics_interval=1"}));
    t.run();
    CHECK_THAT(log.text(), Contains("training steps 1–3: global batch 8"));
    CHECK_THAT(log.text(), Contains("step 2/3 | loss") && Contains("step 3/3 | loss"));
    CHECK_THAT(log.text(), !Contains("step 1/3 | loss"));
    CHECK_THAT(log.text(), !Contains(" holds "));  // per-rank holdings: multi-process runs only
  }
  auto records = train::read_metrics(run.dir.str("run") + "/metrics.jsonl");
  REQUIRE(records.size() == 3);
  for (int i = 0; i < 3; ++i) CHECK(records[static_cast<size_t>(i)].at("step") == i + 1);
  {
    testing::LogCapture log;
    train::RunOptions resume;
    resume.resume = true;
    train::Trainer t(run.config("run", {"train.num_steps=5", "train.log_interval=2", "train.metrics_interval=1"}),
                     resume);
    t.run();
    CHECK_THAT(log.text(), Contains("training steps 4–5: "));
  }
  records = train::read_metrics(run.dir.str("run") + "/metrics.jsonl");
  REQUIRE(records.size() == 5);
  CHECK(records.back().at("step") == 5);

  // metrics_interval 0: a record per log interval, each the mean of its steps' losses.
  train::Trainer t(run.config("coarse", {"train.num_steps=4", "train.log_interval=2", "train.metrics_interval=0"}));
  t.run();
  CHECK(train::read_metrics(run.dir.str("coarse") + "/metrics.jsonl").size() == 2);
}

TEST_CASE("pi0-train --print-params: the header defines the memory total, the README's table quotes it", "[integration][app]") {
  testing::TempDir dir("pi0params_doc");
  const auto r = testing::run_app_process(
      "pi0-train", "--config " + std::string(PI0_SOURCE_DIR) + "/configs/pi05_libero_lora.yaml --print-params", dir);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Contains("memory = weights + grads + optimizer + ema + casts, held between steps; activations not "
                             "included"));
  CHECK_THAT(r.out, !Contains("--print-params adds them"));
  CHECK_THAT(r.out, Contains("\nactivations (micro-batch"));
  // README, "Memory and speed to expect": every row's figure is the `memory` total --print-params prints.
  const auto readme = read_text(std::string(PI0_SOURCE_DIR) + "/README.md");
  const std::regex row(R"(\| [^|]*\(`([a-z0-9_]+\.yaml)`\) \| [0-9.]+ B \| ([0-9.]+) GiB \|)");
  int rows = 0;
  for (auto it = std::sregex_iterator(readme.begin(), readme.end(), row); it != std::sregex_iterator(); ++it) {
    const std::string file = (*it)[1], figure = (*it)[2];
    INFO(file);
    const auto cfg = config::load_config(std::string(PI0_SOURCE_DIR) + "/configs/" + file);
    const auto total = train::plan_memory(cfg).params.total;
    char expected[32];
    std::snprintf(expected, sizeof expected, "%.1f", static_cast<double>(total.memory_bytes()) / (1ull << 30));
    CHECK(figure == expected);
    ++rows;
  }
  CHECK(rows == 3);
}

TEST_CASE("per-rank holdings read in human units and keep the exact byte counts", "[unit][train]") {
  CHECK(train::format_held_state(1, 2, 1234567, 617284, 1234567, "gradients") ==
        "rank 1 of 2 holds 1.18 MiB of AdamW state, 603 KiB of EMA and 1.18 MiB of gradients (1234567, 617284 and "
        "1234567 bytes; dist.shard=gradients)");
}
