// pi0-train --print-params --world-size N: the per-rank plan a user reads (text and --json) is the library's
// train::plan_rank_memory for the same config, N comes from the flag or else from the launcher's WORLD_SIZE, and a
// bad N is a one-line error.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "pi0/config/config.h"
#include "pi0/train/memory_plan.h"
#include "support/app_process.h"

using namespace pi0;
using Catch::Contains;
using pi0::testing::run_app_process;

namespace {
const std::string kConfig = std::string(PI0_SOURCE_DIR) + "/configs/debug.yaml";
}

TEST_CASE("pi0-train --print-params --world-size: per-rank plan as text and JSON", "[integration][app]") {
  testing::TempDir dir("pi0params");
  for (const std::string shard : {"none", "optimizer", "gradients"}) {
    INFO(shard);
    // A global batch of 24 splits over 3 ranks (debug.yaml's 16 would not: see below).
    const auto cfg = config::load_config(kConfig, {"dist.shard=" + shard, "train.batch_size=24"});
    const auto expected = train::rank_memory_json(train::plan_rank_memory(cfg, 3));
    const auto r = run_app_process(
        "pi0-train", "--config " + kConfig + " --print-params --world-size 3 --json --set train.batch_size=24 --set dist.shard=" + shard,
        dir);
    REQUIRE(r.code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j.at("per_rank") == expected);
    CHECK(j.at("micro_batch") == cfg.train.batch_size / 3 / cfg.train.grad_accum_steps);
    const auto text =
        run_app_process("pi0-train", "--config " + kConfig + " --print-params --world-size 3 --set train.batch_size=24 " +
                        "--set dist.shard=" + shard, dir);
    REQUIRE(text.code == 0);
    CHECK_THAT(text.out, Contains("per rank (world size 3, dist.shard=" + shard));
    CHECK_THAT(text.out, Contains("predicted training peak per rank: "));
  }
  // A split that training would refuse is refused when planning it too.
  const auto uneven = run_app_process("pi0-train", "--config " + kConfig + " --print-params --world-size 3", dir);
  CHECK(uneven.code == 2);
  CHECK_THAT(uneven.err, Contains("train.batch_size must be divisible by world size (3)"));
  // Without the flag: the job this process was launched into.
  const auto launched = run_app_process("pi0-train", "--config " + kConfig + " --print-params --json", dir,
                                        "WORLD_SIZE=2 RANK=0 ");
  REQUIRE(launched.code == 0);
  CHECK(nlohmann::json::parse(launched.out).at("per_rank").at("world_size") == 2);
  const auto alone = run_app_process("pi0-train", "--config " + kConfig + " --print-params --json", dir,
                                     "env -u WORLD_SIZE -u RANK -u SLURM_NTASKS -u SLURM_PROCID ");
  REQUIRE(alone.code == 0);
  CHECK(nlohmann::json::parse(alone.out).at("per_rank").at("world_size") == 1);

  testing::check_user_error(run_app_process("pi0-train", "--config " + kConfig + " --print-params --world-size 0", dir),
                            "pi0-train", "--world-size: got '0', expected an integer >= 1");
  testing::check_user_error(run_app_process("pi0-train", "--config " + kConfig + " --world-size 2", dir), "pi0-train",
                            "--print-params");
}
