// The training job end to end on the tiny debug config and generated data: bit-exact resume, SIGTERM handling,
// checkpointing equivalence, divergence detection, bad-run messages, and a learning test.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "pi0/common/check.h"
#include "pi0/config/config.h"
#include "pi0/data/dataset.h"
#include "pi0/data/example_data.h"
#include "pi0/data/norm_stats.h"
#include "pi0/io/safetensors.h"
#include "pi0/train/checkpoint_dir.h"
#include "pi0/train/metrics.h"
#include "pi0/train/trainer.h"
#include "support/test_support.h"
#include "support/tiny_run.h"

using namespace pi0;
using Catch::Contains;
using pi0::testing::TinyRun;
namespace fs = std::filesystem;

namespace {

std::vector<double> losses(const std::string& run_dir) {
  std::vector<double> out;
  for (const auto& r : train::read_metrics(run_dir + "/metrics.jsonl")) out.push_back(r.at("loss").get<double>());
  return out;
}

std::map<std::string, torch::Tensor> weights(train::Trainer& t) {
  std::map<std::string, torch::Tensor> out;
  for (auto& p : t.model()->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

bool equal_maps(const std::map<std::string, torch::Tensor>& a, const std::map<std::string, torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [k, v] : a)
    if (!b.count(k) || !torch::equal(v, b.at(k))) return false;
  return true;
}

}  // namespace

TEST_CASE("resume continues bit-identically (losses, weights, EMA, optimizer)", "[integration][train]") {
  TinyRun run;
  std::map<std::string, torch::Tensor> straight_w;
  {
    train::Trainer t(run.config("straight", {"train.num_steps=6", "checkpoint.save_interval=3"}));
    CHECK(t.run() == 6);
    straight_w = weights(t);
  }
  {
    train::Trainer t(run.config("resumed", {"train.num_steps=3", "checkpoint.save_interval=3"}));
    CHECK(t.run() == 3);
  }
  train::RunOptions resume;
  resume.resume = true;
  train::Trainer t(run.config("resumed", {"train.num_steps=6", "checkpoint.save_interval=3"}), resume);
  CHECK(t.run() == 6);
  const auto a = losses(run.dir.str("straight")), b = losses(run.dir.str("resumed"));
  REQUIRE(a.size() == 6);
  CHECK(a == b);  // exact
  CHECK(equal_maps(straight_w, weights(t)));
  const auto ck_a = run.dir.str("straight") + "/checkpoints/6/", ck_b = run.dir.str("resumed") + "/checkpoints/6/";
  CHECK(equal_maps(io::read_safetensors(ck_a + "ema.safetensors"), io::read_safetensors(ck_b + "ema.safetensors")));
  CHECK(equal_maps(io::read_safetensors(ck_a + "optimizer.safetensors"), io::read_safetensors(ck_b + "optimizer.safetensors")));
  CHECK(a.front() != a.back());  // training did something
}

TEST_CASE("SIGTERM finishes the step, saves, exits 0, and the run resumes", "[integration][train]") {
  TinyRun run;
  const std::string exe = std::string(PI0_BINARY_DIR) + "/pi0-train";
  REQUIRE(fs::exists(exe));
  auto cfg = run.config("run", {"train.num_steps=100000", "checkpoint.save_interval=100000"});
  const auto cfg_path = run.dir.str("run.yaml");
  std::ofstream(cfg_path) << YAML::Dump(config::to_yaml(cfg));
  const pid_t pid = fork();
  if (pid == 0) {
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    execl(exe.c_str(), exe.c_str(), "--config", cfg_path.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Wait until a few steps are logged, then ask it to stop as a cluster scheduler would.
  const auto metrics = run.dir.str("run") + "/metrics.jsonl";
  for (int i = 0; i < 600 && (!fs::exists(metrics) || train::read_metrics(metrics).size() < 3); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(kill(pid, SIGTERM) == 0);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  auto newest = train::newest_complete_checkpoint(run.dir.str("run"));
  REQUIRE(newest);
  const int64_t stopped_at = newest->first;
  CHECK(stopped_at >= 3);
  CHECK(static_cast<int64_t>(train::read_metrics(metrics).size()) == stopped_at);
  train::RunOptions resume;
  resume.resume = true;
  train::Trainer t(run.config("run", {"train.num_steps=" + std::to_string(stopped_at + 2)}), resume);
  CHECK(t.run() == stopped_at + 2);
}

TEST_CASE("gradient checkpointing does not change the training losses", "[integration][train]") {
  TinyRun run;
  train::Trainer a(run.config("plain", {"train.num_steps=3"}));
  a.run();
  train::Trainer b(run.config("ckpt", {"train.num_steps=3", "train.gradient_checkpointing=true"}));
  b.run();
  const auto la = losses(run.dir.str("plain")), lb = losses(run.dir.str("ckpt"));
  REQUIRE(la.size() == 3);
  for (size_t i = 0; i < la.size(); ++i) CHECK(lb[i] == Approx(la[i]).epsilon(1e-5));
}

TEST_CASE("a diverging run stops before the optimizer step, naming the step and rank", "[integration][train]") {
  TinyRun run;
  train::Trainer t(run.config("diverge", {"train.num_steps=50", "train.lr_peak=1.0e+30", "train.lr_end=1.0e+30",
                                          "train.lr_warmup_steps=0", "train.clip_grad_norm=0"}));
  REQUIRE_THROWS_AS(t.run(), train::TrainingError);
  train::Trainer t2(run.config("diverge2", {"train.num_steps=50", "train.lr_peak=1.0e+30", "train.lr_end=1.0e+30",
                                            "train.lr_warmup_steps=0", "train.clip_grad_norm=0"}));
  REQUIRE_THROWS_WITH(t2.run(), Contains("non-finite") && Contains("on rank 0") && Contains("before the optimizer step"));
}

TEST_CASE("bad runs give one-line errors and lose nothing", "[integration][train]") {
  TinyRun run;
  REQUIRE_THROWS_WITH(train::Trainer(run.config("x", {"data.norm_stats=" + run.dir.str("nope.json")})),
                      Contains("data.norm_stats: file '" + run.dir.str("nope.json") + "' does not exist"));
  REQUIRE_THROWS_WITH(train::Trainer(run.config("x", {"data.tokenizer=/nope.model"})),
                      Contains("data.tokenizer: file '/nope.model' does not exist"));
  REQUIRE_THROWS_WITH(train::Trainer(run.config("x", {"train.freeze=ful"})), Contains("full"));
  REQUIRE_THROWS_WITH(train::Trainer(run.config("x", {"train.batch_size=6", "train.grad_accum_steps=4"})),
                      Contains("train.batch_size must be a multiple of train.grad_accum_steps"));
  {
    train::Trainer t(run.config("existing", {"train.num_steps=2"}));
    t.run();
  }
  const auto before = train::complete_checkpoints(run.dir.str("existing"));
  // Refused in the constructor, before any model is built.
  REQUIRE_THROWS_WITH(train::Trainer(run.config("existing", {"train.num_steps=4"})),
                      Contains("already holds checkpoints (newest: step 2); pass --resume"));
  CHECK(train::complete_checkpoints(run.dir.str("existing")) == before);
  REQUIRE_THROWS_WITH(train::Trainer(run.config("y", {"checkpoint.init_weights=" + run.dir.str("nope.safetensors")})),
                      Contains("checkpoint.init_weights '" + run.dir.str("nope.safetensors") + "': file not found"));
}

TEST_CASE("learning: the tiny pi0.5 lowers its loss 5x and its sampled actions approach the data", "[integration][train][slow]") {
  TinyRun run;
  train::Trainer t(run.config("learn", {"train.num_steps=300", "train.batch_size=16", "train.log_interval=10",
                                        "checkpoint.save_interval=1000"}));
  t.run();
  const auto l = losses(run.dir.str("learn"));
  REQUIRE(l.size() == 30);
  INFO("first interval loss " << l.front() << ", last " << l.back());
  CHECK(l.back() * 5 < l.front());

  // Sampled actions vs the dataset's (normalized space) on the training frames, against predicting the mean (0).
  auto cfg = run.config("learn");
  auto pipe = train::make_data_pipeline(cfg, 32, 0, 1);
  auto batch = pipe.loader->next();
  t.model()->eval();
  torch::manual_seed(0);
  auto sampled = t.model()->sample_actions(batch.observation, std::nullopt, 10);
  // The robot's 7 action dims (dim 8 is zero padding).
  const auto target = batch.actions.narrow(2, 0, 7);
  const double err = (sampled.narrow(2, 0, 7) - target).pow(2).mean().item<double>();
  const double baseline = target.pow(2).mean().item<double>();
  INFO("sampled-action MSE " << err << " vs mean-prediction MSE " << baseline);
  CHECK(err < 0.5 * baseline);
}
