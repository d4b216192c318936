// pi0-infer --prev-actions: one real-time-chunking request from the shell (the quickstart's), the previous answer's
// file instead of keys written into the observation file; the same request either way.
#include <catch2/catch.hpp>

#include <filesystem>

#include "pi0/io/safetensors.h"
#include "pi0/train/trainer.h"
#include "support/app_process.h"
#include "support/tiny_run.h"

using namespace pi0;
using Catch::Contains;

namespace {

// One training step of the tiny run exported as a float32 bundle (run.dir/bundle), with an observation
// (obs.safetensors, returned) and a noise file (noise.safetensors) drawn from `seed`.
std::map<std::string, torch::Tensor> export_tiny_bundle(testing::TinyRun& run, uint64_t seed) {
  train::Trainer(run.config("run", {"train.num_steps=1", "checkpoint.save_interval=1"})).run();
  REQUIRE(testing::run_app_process("pi0-export", "--checkpoint " + run.dir.str("run") + " --out " +
                                                     run.dir.str("bundle") + " --dtype float32", run.dir)
              .code == 0);
  torch::manual_seed(seed);
  const std::map<std::string, torch::Tensor> obs = {
      {"image/base_0_rgb", torch::randint(0, 256, {1, 32, 32, 3}).to(torch::kUInt8)}, {"state", torch::randn({1, 8})}};
  io::save_safetensors(run.dir.str("obs.safetensors"), {obs.begin(), obs.end()});
  io::save_safetensors(run.dir.str("noise.safetensors"), {{"noise", torch::randn({1, 8, 8})}});
  return obs;
}

}  // namespace

TEST_CASE("pi0-infer --prev-actions with --prev-executed and --inference-delay is the request with the keys in the "
          "observation file", "[integration][infer]") {
  if (!testing::apps_built({"pi0-export", "pi0-infer"})) return;
  testing::TinyRun run;
  const auto obs = export_tiny_bundle(run, 5);
  auto app = [&](const char* name, const std::string& args) { return testing::run_app_process(name, args, run.dir); };
  const std::string common = "--bundle " + run.dir.str("bundle") + " --prompt 'reach' --num-steps 3 --noise " +
                             run.dir.str("noise.safetensors");
  REQUIRE(app("pi0-infer", common + " --obs " + run.dir.str("obs.safetensors") + " --out " + run.dir.str("a.st"))
              .code == 0);
  const auto first = io::SafetensorsFile(run.dir.str("a.st")).get_copy("actions_unnormalized");
  REQUIRE(first.sizes() == torch::IntArrayRef({1, 8, 7}));

  const auto by_flags = app("pi0-infer", common + " --obs " + run.dir.str("obs.safetensors") + " --out " +
                                             run.dir.str("b.st") + " --prev-actions " + run.dir.str("a.st") +
                                             " --prev-executed 3 --inference-delay 2");
  INFO(by_flags.out << by_flags.err);
  REQUIRE(by_flags.code == 0);
  CHECK_THAT(by_flags.out, Contains("real-time chunking: guided, inference_delay 2"));
  // The same request with the keys in the observation file: rows 3.. of the answer, delay 2.
  auto with_keys = obs;
  with_keys["prev_action_chunk"] = first.narrow(1, 3, 5).contiguous();
  with_keys["inference_delay"] = torch::tensor(int64_t{2});
  io::save_safetensors(run.dir.str("obs_rtc.safetensors"), {with_keys.begin(), with_keys.end()});
  REQUIRE(app("pi0-infer", common + " --obs " + run.dir.str("obs_rtc.safetensors") + " --out " + run.dir.str("c.st"))
              .code == 0);
  const auto b = io::SafetensorsFile(run.dir.str("b.st")).get_copy("actions_unnormalized");
  const auto c = io::SafetensorsFile(run.dir.str("c.st")).get_copy("actions_unnormalized");
  CHECK(torch::equal(b, c));
  CHECK_FALSE(torch::equal(b, first));  // guided by the previous rows: not the plain answer

  // Bad input: one line naming the flag, exit 2, nothing written.
  const auto beyond = app("pi0-infer", common + " --obs " + run.dir.str("obs.safetensors") + " --out " +
                                           run.dir.str("x.st") + " --prev-actions " + run.dir.str("a.st") +
                                           " --prev-executed 8");
  CHECK(beyond.code == 2);
  CHECK_THAT(beyond.err, Contains("--prev-executed: got 8, but " + run.dir.str("a.st") + " holds 8 rows; expected "
                                  "0..7"));
  const auto alone = app("pi0-infer", common + " --obs " + run.dir.str("obs.safetensors") + " --out " +
                                          run.dir.str("x.st") + " --inference-delay 2");
  CHECK(alone.code == 2);
  CHECK_THAT(alone.err, Contains("--inference-delay: needs --prev-actions FILE"));
  const auto both = app("pi0-infer", common + " --obs " + run.dir.str("obs_rtc.safetensors") + " --out " +
                                         run.dir.str("x.st") + " --prev-actions " + run.dir.str("a.st"));
  CHECK(both.code == 2);
  CHECK_THAT(both.err, Contains("--prev-actions: " + run.dir.str("obs_rtc.safetensors") + " already holds "
                                "prev_action_chunk or inference_delay"));
  CHECK_FALSE(std::filesystem::exists(run.dir.str("x.st")));
}

TEST_CASE("pi0-infer --simulate-fp8 moves the actions by FP8's rounding and says so", "[integration][infer][fp8]") {
  if (!testing::apps_built({"pi0-export", "pi0-infer"})) return;
  testing::TinyRun run;
  export_tiny_bundle(run, 6);
  auto app = [&](const char* name, const std::string& args) { return testing::run_app_process(name, args, run.dir); };
  const std::string common = "--bundle " + run.dir.str("bundle") + " --prompt 'reach' --num-steps 3 --noise " +
                             run.dir.str("noise.safetensors") + " --obs " + run.dir.str("obs.safetensors");
  REQUIRE(app("pi0-infer", common + " --out " + run.dir.str("a.st")).code == 0);
  const auto fp8 = app("pi0-infer", common + " --out " + run.dir.str("b.st") + " --simulate-fp8");
  INFO(fp8.out << fp8.err);
  REQUIRE(fp8.code == 0);
  CHECK_THAT(fp8.out, Contains("FP8 simulated in the prefix's Gemma GEMMs"));
  const auto a = io::SafetensorsFile(run.dir.str("a.st")).get_copy("actions_unnormalized");
  const auto b = io::SafetensorsFile(run.dir.str("b.st")).get_copy("actions_unnormalized");
  CHECK(torch::isfinite(b).all().item<bool>());
  CHECK_FALSE(torch::equal(a, b));
}

