// The card-fit table of --print-params (train::plan_card_fits) under train.gradient_checkpointing=auto: each row is
// what the trainer chooses on that card (choose_checkpointed_layers, which Trainer::build_model calls), host memory
// on every row, the offload note where a card needs none, and --card-gib's sizes and errors.
#include <catch2/catch.hpp>

#include <sstream>

#include "pi0/common/check.h"
#include "pi0/config/config.h"
#include "pi0/train/memory_plan.h"
#include "support/app_process.h"
#include "support/test_support.h"

using namespace pi0;
using Catch::Matchers::Contains;

namespace {
const std::string kConfigs = std::string(PI0_SOURCE_DIR) + "/configs/";
}

TEST_CASE("card fits under gradient_checkpointing auto are the trainer's choice on each card", "[unit][train]") {
  const std::vector<int64_t> cards = {16, 24, 32, 40, 48, 80, 96, 141};
  for (const std::string name : {"pi0_libero.yaml", "pi05_libero_lora.yaml"}) {
    for (const bool offload : {false, true}) {
      CAPTURE(name, offload);
      const auto cfg =
          config::load_config(kConfigs + name, {"train.gradient_checkpointing=auto", "train.device=cuda"});
      const int64_t per_rank = cfg.train.batch_size;
      const auto rank = train::plan_rank_memory(cfg, 1, offload);
      const auto fits = train::plan_card_fits(cfg, 1, offload, cards);
      REQUIRE(fits.size() == cards.size());
      for (size_t i = 0; i < fits.size(); ++i) {
        const auto& f = fits[i];
        CAPTURE(f.card_gib);
        CHECK(f.card_gib == cards[i]);
        CHECK(f.budget_bytes == (f.card_gib << 30) - train::kCardReserveBytes);
        // The micro-batch the row reports (1 when none fits), as the trainer would run it with grad_accum_steps set.
        const int64_t m = f.micro_batch == 0 ? 1 : f.micro_batch;
        auto run = cfg;
        run.train.grad_accum_steps = per_rank / m;
        const auto chosen = train::choose_checkpointed_layers(run, 1, offload, f.card_gib << 30, nullptr);
        CHECK(f.checkpointed == chosen);
        const auto plan = train::plan_memory(run, 1, chosen);
        CHECK(f.peak_bytes == rank.peak_bytes(plan.activations));
        CHECK(f.host_runtime_bytes == plan.runtime_bytes);
        CHECK(f.host_bytes == rank.host_bytes);
        if (f.micro_batch == 0) {
          CHECK(f.peak_bytes > f.budget_bytes);
          continue;
        }
        CHECK(f.peak_bytes <= f.budget_bytes);
        CHECK(f.grad_accum_steps * f.micro_batch == per_rank);
        if (f.micro_batch < per_rank) {
          // A smaller micro-batch only where the configured one does not fit even with the trainer's choice.
          const auto at_config = train::choose_checkpointed_layers(cfg, 1, offload, f.card_gib << 30, nullptr);
          CHECK(rank.peak_bytes(train::plan_memory(cfg, 1, at_config).activations) > f.budget_bytes);
        }
      }
      // docs/memory.md's table ("What auto picks"): pi0 full at batch 32 on 80 GB recomputes 25 / 14 without offload,
      // 27 / 2 with it, and does not fit 24 GB without offload; with it, 27 / 16.
      if (name == "pi0_libero.yaml") {
        const auto& c80 = fits[5];
        const auto& c24 = fits[1];
        CHECK(c80.micro_batch == 32);
        CHECK(c80.checkpointed == (offload ? model::CheckpointedLayers{27, 2} : model::CheckpointedLayers{25, 14}));
        if (offload) {
          CHECK(c24.micro_batch == 32);
          CHECK(c24.checkpointed == model::CheckpointedLayers{27, 16});
        } else {
          CHECK(c24.micro_batch == 0);
        }
      }
    }
  }
}

TEST_CASE("card-fit report: host memory on every row, offload's cost named where a card fits without it",
          "[unit][train]") {
  const auto cfg = config::load_config(kConfigs + "pi0_libero.yaml",
                                       {"train.gradient_checkpointing=auto", "train.offload=auto",
                                        "train.device=cuda"});
  const std::vector<int64_t> cards = {24, 80, 141};
  const std::string text = train::format_memory_report(cfg, 1, true, cards);
  INFO(text);
  CHECK_THAT(text, Contains("train.gradient_checkpointing=auto: the layers pi0-train recomputes on that card"));
  // Two tables of three rows, each with its host memory.
  size_t rows = 0;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const bool card_row = line.rfind("    24 GB  ", 0) == 0 || line.rfind("    80 GB  ", 0) == 0 ||
                          line.rfind("   141 GB  ", 0) == 0;
    if (!card_row) continue;
    ++rows;
    CHECK_THAT(line, Contains(" host ") && Contains(" GiB"));
  }
  CHECK(rows == 6);
  CHECK_THAT(text, Contains("micro-batch 32, recomputing 25 of 27 vision, 14 of 18 language layers"));
  // 80 GB and 141 GB hold pi0 without offload; 24 GB does not.
  size_t notes = 0;
  for (size_t at = text.find("offload trades speed for memory"); at != std::string::npos;
       at = text.find("offload trades speed for memory", at + 1))
    ++notes;
  CHECK(notes == 2);
  CHECK_THAT(text, Contains("train.offload=auto picks: 24 GB optimizer · 80 GB none · 141 GB none"));
  const auto json = train::memory_report_json(cfg, 1, true, cards);
  REQUIRE(json.at("gpu_cards").size() == 6);
  const auto& c80 = json.at("gpu_cards")[1];
  CHECK(c80.at("card_gib") == 80);
  CHECK(c80.at("checkpointed_vision") == 25);
  CHECK(c80.at("checkpointed_language") == 14);
  CHECK(c80.at("host_runtime_bytes").get<int64_t>() > 0);
  CHECK(c80.at("offload_auto") == "none");
  CHECK(json.at("gpu_cards")[3].at("fits_without_offload") == false);  // 24 GB, offloaded
  CHECK(json.at("gpu_cards")[4].at("fits_without_offload") == true);   // 80 GB, offloaded
  CHECK(json.at("gpu_cards")[3].at("offload_auto") == "optimizer");
}

TEST_CASE("print-params --card-gib: sizes parsed, bad values refused in one line naming the flag", "[unit][train][app]") {
  CHECK(train::parse_card_gib("16,32,96,141") == std::vector<int64_t>{16, 32, 96, 141});
  CHECK(train::parse_card_gib("80") == std::vector<int64_t>{80});
  for (const std::string bad : {"", "16,,32", "abc", "2", "16.5", "-4", "5000", "16 ", "+16", "16,"}) {
    INFO("'" << bad << "'");
    CHECK_THROWS_WITH(train::parse_card_gib(bad),
                      Contains("--card-gib must be a comma-separated list of card sizes in whole GiB, each from 3 to "
                               "4096") &&
                          Contains("(got '" + bad + "')") && !Contains("\n"));
  }
  if (!testing::apps_built({"pi0-train"})) return;
  testing::TempDir dir("cardgib");
  const auto bad = testing::run_app_process(
      "pi0-train", "--config " + kConfigs + "pi0_libero.yaml --print-params --card-gib 16,x", dir);
  CHECK(bad.code == 2);
  CHECK(bad.out.empty());
  CHECK_THAT(bad.err, Contains("--card-gib must be") && Contains("(got '16,x')"));
  const auto good = testing::run_app_process(
      "pi0-train", "--config " + kConfigs + "pi0_libero.yaml --print-params --card-gib 16,141 --json", dir);
  REQUIRE(good.code == 0);
  const auto json = nlohmann::json::parse(good.out);
  CHECK(json.at("gpu_cards")[0].at("card_gib") == 16);
  CHECK(json.at("gpu_cards")[1].at("card_gib") == 141);
}
