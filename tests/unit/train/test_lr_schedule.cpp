// train.lr_schedule by name: cosine and rsqrt against openpi's own schedules at every step of the table
// tests/data/lr_schedules.py made from openpi's optimizer.py at its pinned commit (tests/data/golden/
// openpi_lr_schedules.json), constant against LeRobot's constant-with-warmup by hand, the keys' errors, and the
// trainer's LR (metrics.jsonl) following the schedule it is configured with.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "pi0/common/check.h"
#include "pi0/config/config.h"
#include "pi0/train/lr_schedule.h"
#include "pi0/train/metrics.h"
#include "pi0/train/trainer.h"
#include "support/test_support.h"
#include "support/tiny_run.h"

using namespace pi0;
using Catch::Matchers::Contains;
using nlohmann::json;

namespace {

config::TrainConfig train_config(const json& setting) {
  const auto& p = setting.at("params");
  config::TrainConfig t;
  t.lr_schedule = setting.at("schedule").get<std::string>();
  t.lr_warmup_steps = p.at("warmup_steps").get<int64_t>();
  t.lr_peak = p.at("peak_lr").get<double>();
  if (t.lr_schedule == "cosine") {
    t.lr_decay_steps = p.at("decay_steps").get<int64_t>();
    t.lr_end = p.at("decay_lr").get<double>();
  } else {
    t.lr_timescale = p.at("timescale").get<double>();
  }
  return t;
}

}  // namespace

TEST_CASE("lr_schedule cosine and rsqrt equal openpi's schedules at every step", "[unit][train][lr]") {
  const auto table = json::parse(testing::read_text(std::string(PI0_SOURCE_DIR) +
                                                    "/tests/data/golden/openpi_lr_schedules.json"));
  INFO("openpi " << table.at("openpi_commit").get<std::string>() << ", jax " << table.at("versions").at("jax")
                 << ", optax " << table.at("versions").at("optax"));
  const double u32 = std::ldexp(1.0, -24);  // float32's unit roundoff
  size_t steps = 0;
  bool rsqrt = false, cosine = false;
  for (const auto& setting : table.at("settings")) {
    const auto t = train_config(setting);
    (t.lr_schedule == "rsqrt" ? rsqrt : cosine) = true;
    const auto lr = setting.at("lr").get<std::vector<double>>();
    const auto lr32 = setting.at("lr_float32").get<std::vector<double>>();
    REQUIRE(lr.size() == lr32.size());
    REQUIRE(lr.size() > static_cast<size_t>(t.lr_warmup_steps) + 10);  // the warmup and the decay are both there
    double worst64 = 0, worst32 = 0, worst_f32 = 0;
    int64_t at64 = 0, at32 = 0, at_f32 = 0;
    for (size_t s = 0; s < lr.size(); ++s) {
      const double ours = train::scheduled_lr(t, static_cast<int64_t>(s));
      // openpi's code in float64 (jax_enable_x64): the same function, so the double agrees to rounding.
      const double r64 = lr[s] == 0 ? std::abs(ours) : std::abs(ours - lr[s]) / std::abs(lr[s]);
      if (r64 > worst64) worst64 = r64, at64 = static_cast<int64_t>(s);
      // As float32, the type openpi trains with: within 1e-7 relative (in fact the same float).
      const float ours_f = static_cast<float>(ours), ref_f = static_cast<float>(lr[s]);
      const double rf = ref_f == 0 ? std::abs(ours_f) : std::abs(double(ours_f) - double(ref_f)) / std::abs(ref_f);
      if (rf > worst_f32) worst_f32 = rf, at_f32 = static_cast<int64_t>(s);
      // openpi's float32 evaluation (jax's default) rounds its terms, all at most lr_peak: the warmup's
      // (init − peak) · frac + peak cancels to a few float32 ulps of lr_peak (1e-5 relative at its first steps).
      const double a32 = std::abs(ours - lr32[s]) / t.lr_peak;
      if (a32 > worst32) worst32 = a32, at32 = static_cast<int64_t>(s);
    }
    INFO(setting.at("name").get<std::string>() << ": worst float64 relative " << worst64 << " at step " << at64
                                               << "; as float32 " << worst_f32 << " at step " << at_f32
                                               << "; against openpi's float32 run " << worst32 / u32
                                               << " ulps of lr_peak at step " << at32);
    CHECK(worst64 <= 1e-12);
    CHECK(worst_f32 <= 1e-7);
    CHECK(worst32 <= 4 * u32);
    steps += lr.size();
  }
  CHECK(cosine);
  CHECK(rsqrt);
  CHECK(steps > 2000);
}

TEST_CASE("lr_schedule constant is LeRobot's constant-with-warmup", "[unit][train][lr]") {
  config::TrainConfig t;
  t.lr_schedule = "constant";
  t.lr_warmup_steps = 4;
  t.lr_peak = 1e-4;
  // diffusers' get_constant_schedule_with_warmup: step / max(1, warmup) of the peak, then the peak.
  const double expected[] = {0.0, 0.25e-4, 0.5e-4, 0.75e-4, 1e-4, 1e-4, 1e-4};
  for (int64_t s = 0; s < 7; ++s) CHECK(train::scheduled_lr(t, s) == Approx(expected[s]).epsilon(1e-15));
  CHECK(train::scheduled_lr(t, 1000000) == 1e-4);
  t.lr_warmup_steps = 0;
  CHECK(train::scheduled_lr(t, 0) == 1e-4);
  // rsqrt by the formula at chosen points: peak at the warmup's end, peak / 2 three timescales later.
  t.lr_schedule = "rsqrt";
  t.lr_warmup_steps = 100;
  t.lr_timescale = 1000;
  CHECK(train::scheduled_lr(t, 0) == Approx(1e-4 / 101).epsilon(1e-14));
  CHECK(train::scheduled_lr(t, 100) == Approx(1e-4).epsilon(1e-14));
  CHECK(train::scheduled_lr(t, 3100) == Approx(0.5e-4).epsilon(1e-14));
}

TEST_CASE("lr_schedule: bad names and keys are refused naming the key", "[unit][train][lr][config]") {
  auto parse = [](const std::vector<std::string>& o) { return config::parse_config(YAML::Load(""), "run.yaml", o); };
  CHECK(parse({"train.lr_schedule=rsqrt"}).train.lr_schedule == "rsqrt");
  CHECK(parse({}).train.lr_schedule == "cosine");  // today's schedule stays the default
  CHECK_THROWS_WITH(parse({"train.lr_schedule=linear"}),
                    Contains("train.lr_schedule must be cosine, rsqrt or constant (got 'linear')") && !Contains("\n"));
  CHECK_THROWS_WITH(parse({"train.lr_schedule=rsqrt", "train.lr_timescale=0"}),
                    Contains("train.lr_timescale must be > 0 (steps) (got 0)") && !Contains("\n"));
  CHECK_THROWS_WITH(parse({"train.lr_timescale=-5"}), Contains("train.lr_timescale must be > 0"));
  CHECK_THROWS_WITH(parse({"train.lr_timescale=.inf"}), Contains("train.lr_timescale must be a finite number"));
  // lr_decay_steps is the cosine's: a warmup longer than it is refused there only.
  CHECK_THROWS_WITH(parse({"train.lr_warmup_steps=50000"}),
                    Contains("train.lr_decay_steps must be >= train.lr_warmup_steps (50000) with "
                             "train.lr_schedule=cosine (got 30000)"));
  CHECK(parse({"train.lr_warmup_steps=50000", "train.lr_schedule=rsqrt"}).train.lr_warmup_steps == 50000);
  config::TrainConfig t;
  t.lr_schedule = "Cosine";
  CHECK_THROWS_WITH(train::scheduled_lr(t, 0), Contains("train.lr_schedule must be cosine, rsqrt or constant"));
  CHECK_THROWS_WITH(train::warmup_rsqrt_lr(0, 0, 1.0, 0.0), Contains("lr_timescale must be a finite number > 0"));
}

TEST_CASE("lr_schedule: the trainer's LR is the configured schedule's", "[integration][train][lr]") {
  testing::TinyRun run;
  for (const std::string schedule : {"rsqrt", "constant"}) {
    INFO(schedule);
    auto cfg = run.config("lr_" + schedule, {"train.num_steps=4", "train.lr_schedule=" + schedule,
                                             "train.lr_warmup_steps=2", "train.lr_timescale=3",
                                             "checkpoint.save_interval=100"});
    train::Trainer(cfg).run();
    const auto records = train::read_metrics(cfg.checkpoint.run_dir + "/metrics.jsonl");
    REQUIRE(records.size() == 4);
    for (size_t i = 0; i < records.size(); ++i) {
      // A record's step counts the updates done; the LR was the one of update index step − 1.
      const auto step = records[i].at("step").get<int64_t>();
      CHECK(step == static_cast<int64_t>(i) + 1);
      CHECK(records[i].at("lr").get<double>() == Approx(train::scheduled_lr(cfg.train, step - 1)).epsilon(1e-12));
    }
    // Not the cosine's: the two differ after the warmup.
    CHECK(records[3].at("lr").get<double>() != Approx(train::warmup_cosine_lr(3, 2, cfg.train.lr_peak,
                                                                              cfg.train.lr_decay_steps,
                                                                              cfg.train.lr_end)));
  }
}
