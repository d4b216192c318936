// trainer_state.json: round trip, older single-process files, and one-line errors naming the file and the field.
#include <catch2/catch.hpp>

#include <fstream>

#include "pi0/common/check.h"
#include "pi0/train/trainer_state.h"
#include "support/test_support.h"

using namespace pi0;
using namespace pi0::train;
using Catch::Contains;

TEST_CASE("trainer_state.json round-trips and reads older single-process files", "[unit][train]") {
  testing::TempDir dir("pi0state");
  TrainerStateFile s;
  s.step = 40;
  s.world_size = 2;
  s.nonfinite_skips = 1;
  s.rank_loaders = {{1, 3}, {1, 4}};
  std::ofstream(dir.str(kTrainerStateFile)) << to_json(s).dump(2);
  const auto back = read_trainer_state(dir.str());
  CHECK(back.step == 40);
  CHECK(back.world_size == 2);
  CHECK(back.nonfinite_skips == 1);
  CHECK((back.rank_loaders == s.rank_loaders));
  std::ofstream(dir.str(kTrainerStateFile)) << R"({"step": 7, "loader": {"epoch": 0, "batch_index": 7}})";
  const auto old = read_trainer_state(dir.str());
  CHECK(old.world_size == 1);
  CHECK(old.nonfinite_skips == 0);
  CHECK((old.rank_loaders == std::vector<data::LoaderPosition>{{0, 7}}));
  CHECK_NOTHROW(check_resumable(old, dir.str(), 1, 8));
  CHECK_THROWS_WITH(check_resumable(old, dir.str(), 1, 7),
                    Contains("'rank_loaders[0].batch_index' is 7 but an epoch now has 7 batches per rank"));
  // Another world size: fine when every rank stopped at the same global batch, refused when they differ.
  CHECK_NOTHROW(check_resumable(old, dir.str(), 2, 8));
  auto same = s;
  same.rank_loaders = {{1, 3}, {1, 3}};
  CHECK_NOTHROW(check_resumable(same, dir.str(), 1, 8));
  CHECK_NOTHROW(check_resumable(s, dir.str(), 2, 8));
  CHECK_THROWS_WITH(check_resumable(s, dir.str(), 1, 8),
                    Contains("written by 2 ranks whose loader positions differ") && Contains("resume it with the same"));
}

TEST_CASE("malformed trainer_state.json fields are errors naming the file and the field", "[unit][train]") {
  testing::TempDir dir("pi0state");
  const auto file = dir.str(kTrainerStateFile);
  CHECK_THROWS_WITH(read_trainer_state(dir.str()), Contains(file + ": cannot be read (No such file or directory)"));
  struct Case {
    std::string json, expected;
  };
  const std::vector<Case> cases = {
      {"{\"step\": ", ": not valid JSON"},
      {"[1, 2]", ": expected a JSON object (got array)"},
      {R"({"loader": {"epoch": 0, "batch_index": 0}})", ": field 'step' is missing"},
      {R"({"step": -1, "loader": {"epoch": 0, "batch_index": 0}})", ": field 'step' must be an integer >= 0 (got -1)"},
      {R"({"step": 3.5, "loader": {"epoch": 0, "batch_index": 0}})", ": field 'step' must be an integer >= 0 (got 3.5)"},
      {R"({"step": 1, "world_size": "2", "rank_loaders": []})", ": field 'world_size' must be an integer >= 1"},
      {R"({"step": 1, "nonfinite_skips": -2, "loader": {"epoch": 0, "batch_index": 0}})",
       ": field 'nonfinite_skips' must be an integer >= 0 (got -2)"},
      {R"({"step": 1, "loader": {"epoch": 0, "batch_index": -3}})",
       ": field 'loader.batch_index' must be an integer >= 0 (got -3)"},
      {R"({"step": 1, "loader": {"epoch": 0}})", ": field 'loader.batch_index' is missing"},
      {R"({"step": 1, "loader": 5})", ": field 'loader' must be an object {epoch, batch_index} (got 5)"},
      {R"({"step": 1, "world_size": 2, "rank_loaders": [{"epoch": 0, "batch_index": 0}]})",
       ": field 'rank_loaders' must be a list of 2 loader positions"},
      {R"({"step": 1, "rank_loaders": [{"epoch": "x", "batch_index": 0}]})",
       ": field 'rank_loaders[0].epoch' must be an integer >= 0 (got \"x\")"},
      {R"({"step": 1, "world_size": 2, "loader": {"epoch": 0, "batch_index": 0}})", ": field 'rank_loaders' is missing"},
  };
  for (const auto& c : cases) {
    INFO(c.json);
    std::ofstream(file) << c.json;
    CHECK_THROWS_AS(read_trainer_state(dir.str()), UserError);
    CHECK_THROWS_WITH(read_trainer_state(dir.str()), Contains(file + c.expected));
  }
}
