// The profiler in the product (common/profiler.h) on real training: the trainer's phases add up to its step as
// metrics.jsonl measures it, recomputation shows inside backward; pi0-train --profile-steps writes the folder where
// docs/profiling.md says; the flags of pi0-train, bench_train and bench_infer refuse bad values in one line.
#include <catch2/catch.hpp>

#include <fstream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "pi0/common/profiler.h"
#include "pi0/train/metrics.h"
#include "pi0/train/trainer.h"
#include "support/app_process.h"
#include "support/tiny_run.h"

using namespace pi0;
using Catch::Contains;
using pi0::testing::run_app_process;
using pi0::testing::TinyRun;

namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  REQUIRE(f);
  return nlohmann::json::parse(f);  // malformed JSON fails the test
}

}  // namespace

TEST_CASE("the trainer's phases add up to its step, and recomputation shows inside backward",
          "[integration][train][profile]") {
  TinyRun run;
  // Four steps: the first unrecorded (first-call allocations), the next two recorded, the last one writes the
  // final checkpoint outside the recording. Gradient checkpointing on, so backward holds recomputation.
  auto cfg = run.config("run", {"train.num_steps=4", "train.metrics_interval=1", "train.gradient_checkpointing=true"});
  train::RunOptions options;
  options.profile.emplace();
  options.profile->dir = run.dir.str("profile");
  options.profile->steps = 2;
  options.profile->wait_steps = 1;
  train::Trainer trainer(cfg, options);
  trainer.run();

  const auto j = read_json(run.dir.str("profile/profile.json"));
  CHECK(j["steps"] == 2);
  const double step_ms = j["step_ms"];
  std::map<std::string, double> top, nested;
  for (const auto& p : j["phases"]) {
    auto& m = p["parent"].get<std::string>().empty() ? top : nested;
    m[p["name"]] = p["total_ms"];
  }
  for (const char* name : {phase::kDataWait, phase::kForward, phase::kBackward, phase::kGradNormClip,
                           phase::kOptimizer, phase::kEma, phase::kMetrics}) {
    INFO(name);
    CHECK(top.count(name) == 1);
  }
  REQUIRE(nested.count(phase::kRecompute) == 1);
  CHECK(nested[phase::kRecompute] > 0);
  CHECK(nested[phase::kRecompute] < top[phase::kBackward]);
  // The phases cover the step. What is left between them is a few statements of loop bookkeeping (the learning
  // rate, the step count, the save decision): microseconds, against a step of tens of milliseconds even for this
  // tiny model. Timestamps are whole microseconds on LibTorch 1.13 (~10 ranges a step: ~10 µs of rounding), and a
  // preemption of the 2-core test machine lands in the gaps only in proportion to their share. 2 % of the step is
  // far above all of that and far below any real phase (each of forward, backward, optimizer is > 5 %).
  const double phases_ms = std::accumulate(top.begin(), top.end(), 0.0, [](double s, auto& p) { return s + p.second; });
  const double unattributed_ms = j["unattributed_ms"];
  CHECK(phases_ms + unattributed_ms == Approx(step_ms).epsilon(1e-9));
  CHECK(unattributed_ms >= -0.01);
  CHECK(unattributed_ms <= 0.02 * step_ms);
  // The profiler's step ranges against the trainer's own clock (metrics.jsonl's step_time_s of steps 2 and 3, each
  // measured from one metrics record to the next): the same loop iterations, except that the metrics' first one also
  // holds starting the profiler and the end of step 1 after its record. 5 % of the steps plus 5 ms bounds those.
  double metrics_ms = 0;
  for (const auto& r : train::read_metrics(run.dir.str("run/metrics.jsonl"))) {
    const auto step = r.at("step").get<int64_t>();
    if (step == 2 || step == 3) metrics_ms += 1e3 * r.at("step_time_s").get<double>();
  }
  INFO("profiler " << step_ms << " ms, metrics.jsonl " << metrics_ms << " ms");
  CHECK(std::abs(step_ms - metrics_ms) <= 0.05 * metrics_ms + 5.0);

  // The trace parses and holds every phase; the table lists operations with their counts.
  const auto trace = read_json(run.dir.str("profile/trace.json"));
  std::set<std::string> names;
  for (const auto& e : trace["traceEvents"]) names.insert(e.value("name", ""));
  for (const char* name : {phase::kStep, phase::kForward, phase::kBackward, phase::kRecompute, phase::kOptimizer}) {
    INFO(name);
    CHECK(names.count(name) == 1);
  }
  REQUIRE(j["ops"].size() > 10);
  CHECK(j["ops"][0]["calls"].get<int64_t>() > 0);
  const auto table = testing::read_text(run.dir.str("profile/profile.txt"));
  CHECK_THAT(table, Contains("| pi0::forward | 2 |") && Contains("of which pi0::recompute") &&
                        Contains("CPU operations") && Contains("device idle: n/a"));
}

TEST_CASE("pi0-train --profile-steps writes trace.json, profile.txt and profile.json under the run dir",
          "[integration][app][profile]") {
  if (!testing::apps_built({"pi0-train"})) return;
  TinyRun run;
  const auto config = run.write_config("run.yaml", "run", {"train.num_steps=2"});
  const auto r = run_app_process("pi0-train", "--config " + config + " --profile-steps 1", run.dir);
  INFO(r.err);
  REQUIRE(r.code == 0);
  for (const char* f : {"trace.json", "profile.txt", "profile.json"}) {
    INFO(f);
    CHECK(pi0::posix_fs::exists(run.dir.str("run/profile/") + f));
  }
  CHECK_THAT(r.out + r.err, Contains("profile written to " + run.dir.str("run/profile")));
  CHECK(read_json(run.dir.str("run/profile/profile.json"))["steps"] == 1);
}

TEST_CASE("bad --profile values are one-line errors naming the flag and the value, exit 2", "[integration][app][profile]") {
  if (!testing::apps_built({"pi0-train", "bench_train", "bench_infer"})) return;
  TinyRun run;
  const auto config = run.write_config("run.yaml", "run", {"train.num_steps=2"});
  const std::string file = run.dir.str("a_file");
  std::ofstream(file) << "x";
  using testing::check_user_error;
  check_user_error(run_app_process("pi0-train", "--config " + config + " --profile-steps 0", run.dir), "pi0-train",
                   "--profile-steps: got '0', expected an integer >= 1");
  check_user_error(run_app_process("pi0-train", "--config " + config + " --profile-steps many", run.dir), "pi0-train",
                   "--profile-steps: got 'many', expected an integer >= 1");
  check_user_error(run_app_process("pi0-train", "--config " + config + " --profile-dir " + run.dir.str("p"), run.dir),
                   "pi0-train", "--profile-dir requires --profile-steps");
  check_user_error(run_app_process("pi0-train", "--config " + config + " --profile-steps 1 --profile-dir ''", run.dir),
                   "pi0-train", "--profile-dir: got '', expected a value");
  const auto in_the_way = run_app_process("pi0-train", "--config " + config + " --profile-steps 1 --profile-dir " +
                                                           file + "/profile", run.dir);
  check_user_error(in_the_way, "pi0-train", "--profile-dir: got '" + file + "/profile', which cannot be made a folder");
  CHECK_THAT(in_the_way.out + in_the_way.err, !Contains("building the model"));

  check_user_error(run_app_process("bench_train", "--profile ''", run.dir), "bench_train",
                   "--profile: got '', expected a value");
  check_user_error(run_app_process("bench_train", "--profile " + run.dir.str("p") + " --profile-steps 0", run.dir),
                   "bench_train", "--profile-steps: got '0', expected an integer >= 1");
  check_user_error(run_app_process("bench_train", "--profile-steps 2", run.dir), "bench_train",
                   "--profile-steps requires --profile");
  check_user_error(run_app_process("bench_train", "--profile " + file, run.dir), "bench_train",
                   "--profile: got '" + file + "', which cannot be made a folder");
  check_user_error(run_app_process("bench_infer", "--profile " + file, run.dir), "bench_infer",
                   "--profile: got '" + file + "', which cannot be made a folder");
  check_user_error(run_app_process("bench_infer", "--profile " + run.dir.str("p") + " --profile-calls -1", run.dir),
                   "bench_infer", "--profile-calls: got '-1', expected an integer >= 1");
}
