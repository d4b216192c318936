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
  // A run of 1 rank, 8 batches per epoch, train.batch_size 8 (the older file records no batch size: taken as is).
  const RunGeometry one{1, 8, 8, 1};
  CHECK(resume_position(old, dir.str(), one, 0).loader == data::LoaderPosition{0, 7});
  CHECK(resume_position(old, dir.str(), one, 0).moved.empty());
  CHECK_THROWS_WITH((resume_position(old, dir.str(), {1, 7, 8, 1}, 0)),
                    Contains("'rank_loaders[0].batch_index' is 7 but an epoch now has 7 batches per rank"));
  // Another world size: fine when every rank stopped at the same global batch, refused when they differ.
  CHECK_NOTHROW(resume_position(old, dir.str(), {2, 8, 8, 1}, 1));
  auto same = s;
  same.rank_loaders = {{1, 3}, {1, 3}};
  CHECK_NOTHROW(resume_position(same, dir.str(), one, 0));
  CHECK(resume_position(s, dir.str(), {2, 8, 8, 1}, 1).loader == data::LoaderPosition{1, 4});  // its own position
  CHECK_THROWS_WITH(resume_position(s, dir.str(), one, 0),
                    Contains("written by 2 ranks whose loader positions differ") && Contains("resume it with the same"));
}

// Issue 32 item 4: the loader position counts batches of train.batch_size / grad_accum_steps samples; when that
// changes, the run continues at the same sample of the epoch, or the checkpoint is refused when no batch starts there.
TEST_CASE("trainer_state.json: another batch size continues at the same sample of the epoch", "[unit][train][checkpoint]") {
  testing::TempDir dir("pi0state");
  TrainerStateFile s;
  s.step = 30;
  s.rank_loaders = {{1, 6}};  // sample 24 of epoch 1 at 4 samples per batch
  s.global_batch_size = 4;
  s.grad_accum_steps = 1;
  std::ofstream(dir.str(kTrainerStateFile)) << to_json(s).dump(2);
  const auto back = read_trainer_state(dir.str());
  CHECK(back.global_batch_size == 4);
  CHECK(back.grad_accum_steps == 1);
  auto p = resume_position(back, dir.str(), {1, 10, 8, 1}, 0);
  CHECK(p.loader == data::LoaderPosition{1, 3});
  CHECK(p.moved == "train.batch_size changed 4 → 8: continuing at sample 24 of epoch 1 (batch 3)");
  CHECK(resume_position(back, dir.str(), {1, 10, 4, 1}, 0).moved.empty());  // unchanged
  CHECK_THROWS_WITH((resume_position(back, dir.str(), {1, 10, 16, 1}, 0)),
                    Contains(dir.str(kTrainerStateFile) + ": the run stopped at sample 24 of epoch 1") &&
                        Contains("no batch of 16 samples starts at (train.batch_size changed 4 → 16)"));
  CHECK_THROWS_WITH((resume_position(back, dir.str(), {1, 2, 8, 1}, 0)),
                    Contains("'rank_loaders[0].batch_index' is 6 (batch 3 of 8 samples now) but an epoch now has 2"));
  // Gradient accumulation: a loader batch is a micro-batch of batch_size / grad_accum_steps samples.
  auto accum = back;
  accum.global_batch_size = 8;
  accum.grad_accum_steps = 2;
  CHECK(resume_position(accum, dir.str(), {1, 10, 8, 1}, 0).moved ==
        "train.grad_accum_steps changed 2 → 1: continuing at sample 24 of epoch 1 (batch 3)");
  CHECK(resume_position(accum, dir.str(), {1, 10, 16, 4}, 0).moved.empty());  // 4 samples per micro-batch still
  // Another world size and batch size at once: every rank continues at the global sample.
  auto two = accum;
  two.world_size = 2;
  two.grad_accum_steps = 1;
  two.rank_loaders = {{0, 4}, {0, 4}};  // sample 32
  CHECK(resume_position(two, dir.str(), {1, 10, 16, 1}, 0).loader == data::LoaderPosition{0, 2});
  // Both fields or neither.
  std::ofstream(dir.str(kTrainerStateFile)) << R"({"step": 1, "loader": {"epoch": 0, "batch_index": 0}, "global_batch_size": 4})";
  CHECK_THROWS_WITH(read_trainer_state(dir.str()), Contains(": field 'grad_accum_steps' is missing"));
}

TEST_CASE("trainer_state.json records the held-out set, and a change names the first key that differs", "[unit][train]") {
  testing::TempDir dir("pi0state");
  TrainerStateFile s;
  s.rank_loaders = {{0, 0}};
  s.validation_set = ValidationSetId{0.25, 7, 16, "0123456789abcdef"};
  std::ofstream(dir.str(kTrainerStateFile)) << to_json(s).dump(2);
  const auto back = read_trainer_state(dir.str()).validation_set;
  REQUIRE(back.has_value());
  CHECK(back->validation_split == 0.25);
  CHECK(back->seed == 7);
  CHECK(back->val_samples == 16);
  CHECK(back->digest == "0123456789abcdef");
  // Older files have none: nothing to compare.
  std::ofstream(dir.str(kTrainerStateFile)) << R"({"step": 7, "loader": {"epoch": 0, "batch_index": 7}})";
  CHECK_FALSE(read_trainer_state(dir.str()).validation_set.has_value());

  const ValidationSetId was = *s.validation_set;
  const std::string when = " when checkpoint ck/3 was written";
  CHECK(validation_set_change(was, was, "ck/3").empty());
  auto now = was;
  now.seed = 8;  // the same digest: the same set, whatever the keys say (a seed chooses nothing without held-out data)
  CHECK(validation_set_change(was, now, "ck/3").empty());
  now.digest = "fedcba9876543210";
  CHECK(validation_set_change(was, now, "ck/3") == "train.seed is 8 but was 7" + when);
  now.validation_split = 0.5;  // the first key that differs is named
  CHECK(validation_set_change(was, now, "ck/3") == "data.validation_split is 0.5 but was 0.25" + when);
  now = was;
  now.val_samples = 4;
  now.digest = "fedcba9876543210";
  CHECK(validation_set_change(was, now, "ck/3") == "train.val_samples is 4 but was 16" + when);
  now.val_samples = 16;
  CHECK_THAT(validation_set_change(was, now, "ck/3"),
             Contains("the held-out validation set differs from the one checkpoint ck/3 was written with, though "
                      "data.validation_split, train.seed and train.val_samples are the same"));
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
      {R"({"step": 1, "loader": {"epoch": 0, "batch_index": 0}, "validation_set": 3})",
       ": field 'validation_set' must be an object {validation_split, seed, val_samples, digest} (got 3)"},
      {R"({"step": 1, "loader": {"epoch": 0, "batch_index": 0}, "validation_set": {"seed": 7, "val_samples": 4,
           "digest": "ab"}})", ": field 'validation_set.validation_split' must be a number (got null)"},
      {R"({"step": 1, "loader": {"epoch": 0, "batch_index": 0}, "validation_set": {"validation_split": 0.1,
           "seed": "7", "val_samples": 4, "digest": "ab"}})", ": field 'validation_set.seed' must be an integer (got \"7\")"},
      {R"({"step": 1, "loader": {"epoch": 0, "batch_index": 0}, "validation_set": {"validation_split": 0.1,
           "seed": 7, "val_samples": -1, "digest": "ab"}})",
       ": field 'validation_set.val_samples' must be an integer >= 0 (got -1)"},
      {R"({"step": 1, "loader": {"epoch": 0, "batch_index": 0}, "validation_set": {"validation_split": 0.1,
           "seed": 7, "val_samples": 4, "digest": 12}})", ": field 'validation_set.digest' must be a string (got 12)"},
  };
  for (const auto& c : cases) {
    INFO(c.json);
    std::ofstream(file) << c.json;
    CHECK_THROWS_AS(read_trainer_state(dir.str()), UserError);
    CHECK_THROWS_WITH(read_trainer_state(dir.str()), Contains(file + c.expected));
  }
}
