// Parity of the training step with openpi's own (../shared/fixtures/openpi/{pi0,pi05}/train.*: 12 updates of its
// train_step with optax AdamW, global-norm clipping, warmup-cosine LR and EMA, batches, noise and time given per
// step). The updates are replayed through Trainer::train_step — the step run() executes — and each step's loss,
// gradient norm and learning rate, then every tensor's total update and EMA, are compared.
#include <catch2/catch.hpp>

#include <cstdio>
#include <regex>
#include <sstream>

#include "pi0/config/config.h"
#include "pi0/data/dataset.h"
#include "pi0/data/example_data.h"
#include "pi0/data/norm_stats.h"
#include "pi0/io/safetensors.h"
#include "pi0/train/lr_schedule.h"
#include "pi0/train/trainer.h"
#include "support/openpi_fixture.h"
#include "support/test_support.h"
#include "support/tiny_run.h"

using namespace pi0;

namespace {

double rel(double ours, double ref) { return std::abs(ours - ref) / std::max(std::abs(ref), 1e-30); }

void check_train_parity(const std::string& name) {
  if (!testing::openpi_fixture_present(name + "/train.safetensors")) return;
  const std::string fixture = testing::openpi_fixtures_dir() + "/" + name;
  const auto settings = testing::read_json(fixture + "/train.json");
  const auto& opt = settings.at("optimizer");
  const auto& lr = settings.at("lr_schedule");
  const int64_t steps = settings.at("steps").get<int64_t>();

  // The trainer needs a data pipeline to exist; its batches are never drawn here (train_step gets the fixture's).
  testing::TempDir dir("pi0parity_train");
  const auto data_file = testing::write_unread_training_data(dir);

  const auto in = io::read_safetensors(fixture + "/inputs.safetensors");
  const auto ref = io::read_safetensors(fixture + "/train.safetensors");
  const int64_t batch = in.at("state").size(0);
  const std::string yaml =
      testing::fixture_model_yaml(fixture) +
      "data: {dataset: {format: libero, paths: [" + data_file + "]}, norm_stats: " + dir.str("stats.json") +
      ", tokenizer: " + PI0_SOURCE_DIR + "/data/tokenizer/tiny_spm.model, augment: false, num_workers: 0}\n"
      "train:\n  precision: float32\n  freeze: full\n  batch_size: " + std::to_string(batch) +
      "\n  num_steps: " + std::to_string(steps) +
      testing::openpi_optimizer_yaml(opt, lr, settings.at("ema_decay")) +
      "\ncheckpoint: {run_dir: " + dir.str("run") + ", init_weights: " + fixture + "/weights.safetensors}\n";
  const auto cfg = config::parse_config(YAML::Load(yaml), "fixture train config");
  train::Trainer trainer(cfg);
  std::map<std::string, torch::Tensor> initial;
  for (auto& p : trainer.model()->named_parameters()) initial[p.key()] = p.value().detach().clone();

  const auto obs = testing::fixture_observation(in);
  double worst_loss = 0, worst_grad_norm = 0, worst_lr = 0;
  const auto& t = cfg.train;
  for (int64_t k = 0; k < steps; ++k) {
    const std::string p = "batch/step" + std::to_string(k) + "/";
    model::Batch b;
    b.observation = obs;
    b.observation.state = ref.at(p + "state");
    b.actions = ref.at(p + "actions");
    train::StepNoise noise_time{{ref.at(p + "noise")}, {ref.at(p + "time")}};
    const double step_lr = train::warmup_cosine_lr(k, t.lr_warmup_steps, t.lr_peak, t.lr_decay_steps, t.lr_end);
    const auto result = trainer.train_step({b}, step_lr, noise_time);
    const double e_loss = rel(result.loss, ref.at("loss")[k].item<double>());
    const double e_norm = rel(result.grad_norm, ref.at("grad_norm")[k].item<double>());
    const double e_lr = rel(step_lr, ref.at("lr")[k].item<double>());
    INFO(name << " step " << k << ": loss " << result.loss << " vs " << ref.at("loss")[k].item<double>()
              << ", grad norm " << result.grad_norm << " vs " << ref.at("grad_norm")[k].item<double>());
    CHECK_FALSE(result.skipped);
    CHECK(e_loss < 1e-4);
    CHECK(e_norm < 1e-4);
    CHECK(e_lr < 1e-6);
    worst_loss = std::max(worst_loss, e_loss);
    worst_grad_norm = std::max(worst_grad_norm, e_norm);
    worst_lr = std::max(worst_lr, e_lr);
  }
  // The updates changed something: a later step's loss differs from the first.
  CHECK(ref.at("loss")[steps - 1].item<double>() != ref.at("loss")[0].item<double>());

  // Total update and EMA of every tensor. Attention key biases have a true gradient of zero (a shift shared by
  // all keys of a query cancels in the softmax), so Adam turns rounding noise into full steps on both sides: left
  // out. Tensors nothing downstream uses (openpi moves them by weight decay only) must not move here either.
  const std::regex key_bias(".*self_attn\\.k_proj\\.bias");
  const auto ema = trainer.ema()->state_dict();
  double worst_update = 0, worst_ema = 0;
  int64_t compared = 0, decay_only = 0;
  for (auto& item : trainer.model()->named_parameters()) {
    const auto& n = item.key();
    if (std::regex_match(n, key_bias)) continue;
    const auto init = initial.at(n).to(torch::kFloat64);
    const auto ref_update = ref.at("final/" + n).to(torch::kFloat64) - init;
    const auto ours_update = item.value().detach().to(torch::kFloat64) - init;
    const double ref_norm = ref_update.norm().item<double>();
    if (ref_norm <= 1e-7 * std::max(init.norm().item<double>(), 1.0)) {
      ++decay_only;
      INFO(n << ": openpi moves it by weight decay only; ours by " << ours_update.norm().item<double>());
      CHECK(ours_update.norm().item<double>() <= 1e-7 * std::max(init.norm().item<double>(), 1.0));
      continue;
    }
    ++compared;
    const double e_update = (ours_update - ref_update).norm().item<double>() / ref_norm;
    const auto ref_ema = ref.at("ema/" + n).to(torch::kFloat64) - init;
    const auto ours_ema = ema.at(n).to(torch::kFloat64) - init;
    const double e_ema = (ours_ema - ref_ema).norm().item<double>() / std::max(ref_ema.norm().item<double>(), 1e-30);
    INFO(n << ": update error " << e_update << ", EMA error " << e_ema);
    CHECK(e_update < 1e-2);
    CHECK(e_ema < 1e-2);
    worst_update = std::max(worst_update, e_update);
    worst_ema = std::max(worst_ema, e_ema);
  }
  CHECK(compared > 50);
  std::printf("train parity %s: %lld steps, loss max rel %.2e, grad norm max rel %.2e, lr max rel %.2e; %lld tensors: "
              "update max rel (Frobenius) %.2e, EMA %.2e; %lld weight-decay-only tensors unchanged\n",
              name.c_str(), static_cast<long long>(steps), worst_loss, worst_grad_norm, worst_lr,
              static_cast<long long>(compared), worst_update, worst_ema, static_cast<long long>(decay_only));
}

}  // namespace

TEST_CASE("openpi training-step parity through Trainer::train_step: pi0", "[parity][train]") {
  check_train_parity("pi0");
}

TEST_CASE("openpi training-step parity through Trainer::train_step: pi0.5", "[parity][train]") {
  check_train_parity("pi05");
}
