// Inference bundles: export layout and names, EMA vs model weights, LoRA merging, and the pi0-export / pi0-infer
// apps against the in-process model (same noise → same actions; --loss → compute_loss), plus their input errors.
// Checkpoints are written in-process with the trainer's writers (nothing is trained).
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "pi0/common/check.h"
#include "pi0/config/config.h"
#include "pi0/data/norm_stats.h"
#include "pi0/data/tokenizer.h"
#include "pi0/data/transforms.h"
#include "pi0/io/bundle.h"
#include "pi0/io/manifest.h"
#include "pi0/io/model_weights.h"
#include "pi0/io/safetensors.h"
#include "pi0/model/model_config.h"
#include "pi0/model/param_layout.h"
#include "support/app_process.h"
#include "support/corrupt.h"
#include "support/log_capture.h"
#include "support/skip.h"
#include "support/test_support.h"

using namespace pi0;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

const std::string kTokenizer = std::string(PI0_SOURCE_DIR) + "/data/tokenizer/tiny_spm.model";
constexpr int64_t kStateDim = 7;  // robot dims (< action_dim 8, so padding is exercised)
constexpr int64_t kImageSize = 28;

struct FakeRun {
  std::string run_dir, checkpoint;
  config::Config cfg;
  model::Pi0 model{nullptr};
  std::map<std::string, torch::Tensor> ema;  // the subset of parameters the EMA "tracked"
};

// `expert`: the action expert's variant (a name or a YAML map of dimensions); empty = the prefix expert's.
config::Config tiny_config(const testing::TempDir& dir, bool lora, const std::string& expert = "") {
  const std::string variant = lora ? "dummy_lora" : "dummy";
  const std::string yaml = "model: {type: pi05, paligemma_variant: " + variant +
                           ", action_expert_variant: " + (expert.empty() ? variant : expert) +
                           ", siglip_variant: tiny/14, vocab_size: 1024, image_size: 28, action_dim: 8,"
                           " action_horizon: 4, max_token_len: 48}\n"
                           "data: {dataset: {format: libero, paths: [unused.hdf5]}, norm_stats: " +
                           dir.str("stats.json") + ", tokenizer: " + kTokenizer +
                           "}\n"
                           "train: {precision: float32, freeze: " + std::string(lora ? "lora" : "full") + "}\n"
                           "checkpoint: {run_dir: " + dir.str("run") + ", asset_id: tiny}\n";
  return config::parse_config(YAML::Load(yaml), "test config");
}

data::NormStats tiny_stats() {
  data::NormStats s;
  for (const char* key : {"state", "actions"}) {
    data::KeyStats k;
    for (int64_t d = 0; d < kStateDim; ++d) {
      k.mean.push_back(0.1 * d);
      k.std.push_back(0.5 + 0.1 * d);
      k.q01.push_back(-1.0 - 0.2 * d);
      k.q99.push_back(1.0 + 0.3 * d);
    }
    s.keys[key] = k;
  }
  return s;
}

// A complete checkpoint at step 5 written like Trainer::save_checkpoint does (plus a newer incomplete one).
FakeRun fake_run(const testing::TempDir& dir, bool lora, bool with_ema = true, const std::string& expert = "") {
  FakeRun r;
  r.cfg = tiny_config(dir, lora, expert);
  data::save_norm_stats(tiny_stats(), r.cfg.data.norm_stats);
  torch::manual_seed(3);
  r.model = model::Pi0(model::options_from_config(r.cfg.model));
  {
    torch::NoGradGuard no_grad;
    // Perturb every parameter: at init the zero-initialized adaRMS modulation (gate 0) and SigLIP head would cut
    // the prefix and the expert layers out of the output, and these tests would compare nothing.
    // Make the LoRA product (about 6% of the base weights) large enough that forgetting to merge it would show.
    for (auto& p : r.model->named_parameters()) {
      if (p.key().find("lora_b") != std::string::npos) p.value().mul_(20.0);
      else if (p.key().find("lora_a") == std::string::npos) p.value().add_(torch::randn_like(p.value()) * 0.05);
    }
  }
  r.run_dir = dir.str("run");
  r.checkpoint = r.run_dir + "/checkpoints/5";
  fs::create_directories(r.checkpoint + "/assets/tiny");
  fs::create_directories(r.run_dir + "/checkpoints/9");  // incomplete: must be skipped
  io::SaveOptions so;
  so.openpi_layout = false;
  so.include_lora = true;
  io::save_model_weights(*r.model, r.checkpoint + "/model.safetensors", so);
  if (with_ema) {
    // EMA of "trainable" parameters: the action expert and projections (and LoRA factors), as float32.
    for (auto& p : r.model->named_parameters()) {
      const auto& n = p.key();
      if (n.find("gemma_expert") != std::string::npos || n.find("lora_") != std::string::npos ||
          n.rfind("action_", 0) == 0 || n.rfind("time_mlp", 0) == 0)
        r.ema[n] = p.value().detach().to(torch::kFloat32) + 0.05 * torch::randn(p.value().sizes());
    }
    std::vector<std::pair<std::string, torch::Tensor>> v(r.ema.begin(), r.ema.end());
    io::save_safetensors(r.checkpoint + "/ema.safetensors", v);
  }
  io::save_safetensors(r.checkpoint + "/optimizer.safetensors", {{"step", torch::zeros({1})}});
  std::ofstream(r.checkpoint + "/config.yaml") << YAML::Dump(config::to_yaml(r.cfg)) << "\n";
  fs::copy_file(r.cfg.data.norm_stats, r.checkpoint + "/assets/tiny/norm_stats.json");
  fs::copy_file(kTokenizer, r.checkpoint + "/tokenizer.model");
  std::ofstream(r.checkpoint + "/COMPLETE") << "5\n";
  return r;
}

io::ExportOptions export_options(const std::string& weights, torch::ScalarType dtype = torch::kFloat32) {
  io::ExportOptions o;
  o.weights = weights;
  o.dtype = dtype;
  return o;
}

// The built apps, run as users run them (tests/support/app_process.h).
testing::AppResult run_app(const std::string& app, const std::string& args, const testing::TempDir& dir) {
  return testing::run_app_process(app, args, dir);
}
using testing::check_user_error;

std::map<std::string, torch::Tensor> params(model::Pi0Impl& m) {
  std::map<std::string, torch::Tensor> out;
  for (auto& p : m.named_parameters()) out[p.key()] = p.value().detach();
  return out;
}

// Raw observation tensors (openpi keys): two cameras (one needing resize), raw state, B = 2.
std::map<std::string, torch::Tensor> raw_obs(int64_t batch) {
  torch::manual_seed(11);
  std::map<std::string, torch::Tensor> t;
  t["image/base_0_rgb"] = torch::randint(0, 256, {batch, kImageSize, kImageSize, 3}).to(torch::kUInt8);
  t["image/left_wrist_0_rgb"] = torch::randint(0, 256, {batch, 40, 30, 3}).to(torch::kUInt8);
  t["state"] = torch::randn({batch, kStateDim}) * 2.0;
  return t;
}

// The same observation through the training transform (SampleTransform + collate): the reference for pi0-infer.
model::Observation training_transform_obs(const io::Bundle& b, const std::map<std::string, torch::Tensor>& t,
                                          const std::string& prompt) {
  auto tok = std::make_shared<const data::Tokenizer>(b.tokenizer_path);
  data::SampleTransform transform(b.transform, b.norm_stats, tok);
  std::vector<data::ProcessedSample> samples;
  for (int64_t i = 0; i < t.at("state").size(0); ++i) {
    data::RawSample raw;
    raw.images = {t.at("image/base_0_rgb")[i], t.at("image/left_wrist_0_rgb")[i], torch::Tensor()};
    raw.image_masks = {true, true, false};
    raw.state = t.at("state")[i];
    raw.actions = torch::zeros({4, kStateDim});
    raw.prompt = prompt;
    samples.push_back(transform(raw));
  }
  return data::collate(samples).observation;
}

std::vector<std::pair<std::string, torch::Tensor>> as_vector(const std::map<std::string, torch::Tensor>& m) {
  return {m.begin(), m.end()};
}

}  // namespace

TEST_CASE("export_bundle writes openpi names, config and assets, and no training state", "[unit][io]") {
  testing::TempDir dir("pi0bundle");
  auto run = fake_run(dir, /*lora=*/false);
  const auto rep = io::export_bundle(run.checkpoint, dir.str("bundle"), {});  // defaults: ema, bf16
  CHECK(rep.weights == "ema");
  const fs::path b = dir.str("bundle");
  for (const char* f : {"model.safetensors", "config.json", "config.yaml", "assets/tiny/norm_stats.json", "tokenizer.model"})
    CHECK(fs::exists(b / f));
  for (const char* f : {"optimizer.safetensors", "ema.safetensors", "lora.safetensors", "COMPLETE", "trainer_state.json"})
    CHECK(!fs::exists(b / f));
  CHECK(!fs::exists(dir.str("bundle.tmp_" + std::to_string(::getpid()))));

  io::SafetensorsFile f((b / "model.safetensors").string());
  CHECK(f.contains(io::kLmHeadName));
  CHECK(!f.contains(model::kEmbeddingName));
  CHECK(f.metadata().at(model::kEmbeddingName) == io::kLmHeadName);
  CHECK(f.contains(io::kExpertLmHeadName));
  std::set<std::string> expected;
  for (const auto& spec : io::export_layout(run.model->options())) {
    expected.insert(spec.name);
    CHECK(f.info(spec.name).shape == spec.shape);
  }
  CHECK(std::set<std::string>(f.names().begin(), f.names().end()) == expected);
  for (const auto& n : f.names()) {
    CHECK(n.find("lora_") == std::string::npos);
    CHECK(f.info(n).dtype == "BF16");
  }

  std::ifstream cj(b / "config.json");
  const auto j = nlohmann::json::parse(cj);
  CHECK(j.at("action_dim") == 8);
  CHECK(j.at("action_horizon") == 4);
  CHECK(j.at("paligemma_variant") == "dummy");
  CHECK(j.at("action_expert_variant") == "dummy");
  CHECK(j.at("precision") == "bfloat16");
  CHECK(j.at("pi05") == true);
  const auto cfg = config::load_config((b / "config.yaml").string());
  CHECK(cfg.data.norm_stats == "assets/tiny/norm_stats.json");
  CHECK(cfg.data.tokenizer == "tokenizer.model");

  // A bundle loads back (bf16 weights into the float32 model) and re-exporting over it replaces it.
  auto bundle = io::load_bundle(b.string());
  CHECK(!bundle.model->is_training());
  CHECK(static_cast<int64_t>(bundle.norm_stats.at("state").q99.size()) == kStateDim);
  CHECK(io::export_bundle(run.checkpoint, b.string(), export_options("model")).weights == "model");
  CHECK_THROWS_WITH(io::export_bundle(run.checkpoint, dir.str("run"), {}), Contains("is not an inference bundle"));
  CHECK_THROWS_WITH(io::export_bundle(run.run_dir + "/checkpoints/9", dir.str("b2"), {}), Contains("COMPLETE"));
}

TEST_CASE("bundles carry a manifest: loading refuses a changed file or a relabelled dtype, export refuses a "
          "damaged checkpoint", "[unit][io]") {
  testing::TempDir dir("pi0bundle");
  auto run = fake_run(dir, /*lora=*/false);
  io::export_bundle(run.checkpoint, dir.str("bundle"), {});  // bf16
  const auto m = io::read_manifest(dir.str("bundle"));
  REQUIRE(m);
  CHECK(m->files.count("model.safetensors"));
  CHECK(m->files.count("config.json"));
  CHECK(m->files.count("assets/tiny/norm_stats.json"));
  const auto model = dir.str("bundle/model.safetensors");
  SECTION("flipped bit") {
    testing::flip_data_bit(model, io::kLmHeadName);
    CHECK_THROWS_WITH(io::load_bundle(dir.str("bundle")), Contains(model) && Contains("contents differ"));
  }
  SECTION("BF16 relabelled as F16") {
    testing::relabel_dtype(model, "action_in_proj.weight", "BF16", "F16");
    CHECK_THROWS_WITH(io::load_bundle(dir.str("bundle")), Contains(model) && Contains("contents differ"));
    // A bundle from before manifests: the dtype rule alone catches it.
    fs::remove(dir.str("bundle/manifest.json"));
    CHECK_THROWS_WITH(io::load_bundle(dir.str("bundle")),
                      Contains(model) && Contains("'action_in_proj.weight'") && Contains("F16") &&
                          Contains("expected BF16"));
  }
  SECTION("NaN in a bundle from before manifests") {
    fs::remove(dir.str("bundle/manifest.json"));
    testing::write_nan(model, "action_out_proj.weight");
    CHECK_THROWS_WITH(io::load_bundle(dir.str("bundle")),
                      Contains(model) && Contains("'action_out_proj.weight'") && Contains("non-finite"));
  }
  SECTION("assets/<id> linked to a folder outside the bundle is followed: a bundle is trusted input") {
    // docs/formats.md: the manifest guards against accidents, not against whoever wrote the directory; the linked
    // stats are still checked against it, so a different file there is refused.
    const auto stats = io::load_bundle(dir.str("bundle")).norm_stats.at("state").mean;
    fs::rename(dir.str("bundle/assets/tiny"), dir.str("outside"));
    fs::create_directory_symlink(dir.str("outside"), dir.str("bundle/assets/tiny"));
    CHECK(io::load_bundle(dir.str("bundle")).norm_stats.at("state").mean == stats);
    std::ofstream(dir.str("outside/norm_stats.json"), std::ios::app) << " ";
    CHECK_THROWS_WITH(io::load_bundle(dir.str("bundle")), Contains("norm_stats.json"));
  }
  SECTION("export verifies the checkpoint") {
    io::write_manifest(run.checkpoint, std::nullopt);
    CHECK_NOTHROW(io::export_bundle(run.checkpoint, dir.str("b2"), {}));
    testing::flip_data_bit(run.checkpoint + "/ema.safetensors", run.ema.begin()->first);
    CHECK_THROWS_WITH(io::export_bundle(run.checkpoint, dir.str("b3"), {}),
                      Contains(run.checkpoint + "/ema.safetensors") && Contains("contents differ"));
    CHECK(!fs::exists(dir.str("b3")));
  }
}

TEST_CASE("export_bundle: EMA weights overlay the trainable parameters, model weights are the raw ones", "[unit][io]") {
  testing::TempDir dir("pi0bundle");
  auto run = fake_run(dir, /*lora=*/false);
  io::export_bundle(run.checkpoint, dir.str("ema"), export_options("ema"));
  io::export_bundle(run.checkpoint, dir.str("model"), export_options("model"));
  auto with_ema = params(*io::load_bundle(dir.str("ema")).model);
  auto with_model = params(*io::load_bundle(dir.str("model")).model);
  const auto original = params(*run.model);
  int64_t overlaid = 0;
  for (const auto& [name, value] : original) {
    INFO(name);
    CHECK(torch::equal(with_model.at(name), value));
    auto it = run.ema.find(name);
    if (it != run.ema.end()) {
      CHECK(torch::equal(with_ema.at(name), it->second));
      CHECK(!torch::equal(with_ema.at(name), value));
      ++overlaid;
    } else {
      CHECK(torch::equal(with_ema.at(name), value));  // not tracked by the EMA: from model.safetensors
    }
  }
  CHECK(overlaid > 0);
  CHECK(overlaid < static_cast<int64_t>(original.size()));
}

TEST_CASE("export_bundle without EMA: auto picks model, ema is refused", "[unit][io]") {
  testing::TempDir dir("pi0bundle");
  auto run = fake_run(dir, /*lora=*/false, /*with_ema=*/false);
  CHECK(io::export_bundle(run.checkpoint, dir.str("b"), export_options("")).weights == "model");
  CHECK_THROWS_WITH(io::export_bundle(run.checkpoint, dir.str("c"), export_options("ema")),
                    Contains("ema.safetensors: missing"));
  CHECK(!fs::exists(dir.str("c")));
}

TEST_CASE("export_bundle merges LoRA: the bundle computes what the LoRA model computes", "[unit][io]") {
  testing::TempDir dir("pi0bundle");
  auto run = fake_run(dir, /*lora=*/true);
  const auto rep = io::export_bundle(run.checkpoint, dir.str("bundle"), export_options("model"));
  CHECK(rep.lora_layers_merged > 0);
  auto bundle = io::load_bundle(dir.str("bundle"));
  CHECK(bundle.config.model.paligemma_variant.variant == "dummy");
  for (auto& p : bundle.model->named_parameters()) CHECK(p.key().find("lora_") == std::string::npos);

  run.model->eval();
  auto obs = testing::random_observation(run.model->options(), 2, 3, 2);
  auto noise = torch::randn({2, 4, 8});
  auto expected = run.model->sample_actions(obs, noise, 5);
  auto got = bundle.model->sample_actions(obs, noise, 5);
  CHECK(testing::max_rel_error(got, expected) < 1e-5);

  // Dropping the LoRA product instead of merging it changes the result (so the check above means something).
  auto base_only = params(*run.model);
  auto nolora = io::load_bundle(dir.str("bundle"));
  {
    torch::NoGradGuard no_grad;
    for (auto& p : nolora.model->named_parameters()) p.value().copy_(base_only.at(p.key()));
  }
  CHECK(testing::max_rel_error(nolora.model->sample_actions(obs, noise, 5), expected) > 1e-3);
}

TEST_CASE("SampleTiming records the prefix pass and every step without changing the result", "[unit][io]") {
  auto o = model::dummy_options(true);
  torch::manual_seed(1);
  model::Pi0 m(o);
  auto obs = testing::random_observation(o, 2);
  auto noise = torch::randn({2, o.action_horizon, o.action_dim});
  model::SampleTiming timing;
  auto a = m->sample_actions(obs, noise, 4, true, &timing);
  auto b = m->sample_actions(obs, noise, 4, true);
  CHECK(torch::equal(a, b));
  CHECK(timing.step_ms.size() == 4);
  CHECK(timing.prefix_ms > 0.0);
  CHECK(timing.total_ms() >= timing.prefix_ms);
}

TEST_CASE("export_bundle: an action expert given by explicit dimensions, with LoRA merged", "[unit][io]") {
  testing::TempDir dir("pi0bundle");
  const std::string expert =
      "{width: 40, depth: 4, mlp_dim: 88, num_heads: 8, num_kv_heads: 1, head_dim: 16, lora_rank: 4, lora_alpha: 8}";
  auto run = fake_run(dir, /*lora=*/true, /*with_ema=*/false, expert);
  CHECK(run.model->options().action_expert.width == 40);
  io::export_bundle(run.checkpoint, dir.str("bundle"), export_options("model"));
  std::ifstream cj(dir.str("bundle/config.json"));
  const auto j = nlohmann::json::parse(cj);
  CHECK(j.at("action_expert_variant").at("mlp_dim") == 88);
  CHECK(!j.at("action_expert_variant").contains("lora_rank"));
  auto bundle = io::load_bundle(dir.str("bundle"));
  const auto& spec = bundle.config.model.action_expert_variant;
  CHECK(!spec.is_named());
  CHECK(spec.width == 40);
  CHECK(spec.lora_rank == 0);  // merged
  for (auto& p : bundle.model->named_parameters()) CHECK(p.key().find("lora_") == std::string::npos);
  run.model->eval();
  auto obs = testing::random_observation(run.model->options(), 2, 3, 2);
  auto noise = torch::randn({2, 4, 8});
  CHECK(testing::max_rel_error(bundle.model->sample_actions(obs, noise, 5), run.model->sample_actions(obs, noise, 5)) <
        1e-5);
}

TEST_CASE("pi0-export + pi0-infer match the in-process model (actions, unnormalized actions, loss)", "[unit][io]") {
  testing::TempDir dir("pi0infer");
  auto run = fake_run(dir, /*lora=*/false);
  // A run directory exports its newest complete checkpoint (step 9 is incomplete).
  auto ex = run_app("pi0-export", "--checkpoint " + run.run_dir + " --out " + dir.str("bundle") + " --dtype float32", dir);
  INFO(ex.err);
  REQUIRE(ex.code == 0);
  CHECK_THAT(ex.out, Contains("checkpoints/5"));
  auto bundle = io::load_bundle(dir.str("bundle"));
  const std::string prompt = "reach the red blob";

  auto obs_tensors = raw_obs(2);
  auto noise = torch::randn({2, 4, 8});
  obs_tensors["noise"] = noise;
  io::save_safetensors(dir.str("obs.safetensors"), as_vector(obs_tensors));
  auto r = run_app("pi0-infer", "--bundle " + dir.str("bundle") + " --obs " + dir.str("obs.safetensors") + " --out " +
                                    dir.str("actions.safetensors") + " --num-steps 6 --prompt '" + prompt + "'",
                   dir);
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Contains("prefix pass: "));
  CHECK_THAT(r.out, Contains("denoise step 6/6: "));

  auto ref_obs = training_transform_obs(bundle, obs_tensors, prompt);
  auto expected = bundle.model->sample_actions(ref_obs, noise, 6);
  io::SafetensorsFile out(dir.str("actions.safetensors"));
  auto actions = out.get_copy("actions");
  REQUIRE(actions.sizes() == expected.sizes());
  CHECK((actions - expected).abs().max().item<double>() < 1e-5);
  auto unnorm = out.get_copy("actions_unnormalized");
  CHECK(unnorm.sizes().vec() == std::vector<int64_t>{2, 4, kStateDim});
  auto expected_unnorm =
      data::unnormalize(expected.narrow(-1, 0, kStateDim), bundle.norm_stats.at("actions"), data::NormMode::kQuantile);
  CHECK((unnorm - expected_unnorm).abs().max().item<double>() < 1e-4);

  // The inputs matter (so the equality above is not vacuous): another prompt or image changes the actions.
  auto other = obs_tensors;
  other["image/left_wrist_0_rgb"] = torch::zeros_like(other["image/left_wrist_0_rgb"]);
  CHECK((bundle.model->sample_actions(training_transform_obs(bundle, other, prompt), noise, 6) - expected)
            .abs().max().item<double>() > 1e-4);
  CHECK((bundle.model->sample_actions(training_transform_obs(bundle, obs_tensors, "open the drawer"), noise, 6) - expected)
            .abs().max().item<double>() > 1e-4);

  // Pre-tokenized prompt and a separate --noise file give the same actions.
  auto tokenized = obs_tensors;
  tokenized.erase("noise");
  tokenized["tokenized_prompt"] = ref_obs.tokenized_prompt.to(torch::kInt32);
  tokenized["tokenized_prompt_mask"] = ref_obs.tokenized_prompt_mask;
  io::save_safetensors(dir.str("obs_tok.safetensors"), as_vector(tokenized));
  io::save_safetensors(dir.str("noise.safetensors"), {{"noise", noise}});
  r = run_app("pi0-infer", "--bundle " + dir.str("bundle") + " --obs " + dir.str("obs_tok.safetensors") + " --out " +
                               dir.str("actions2.safetensors") + " --num-steps 6 --noise " + dir.str("noise.safetensors"),
              dir);
  REQUIRE(r.code == 0);
  CHECK((io::SafetensorsFile(dir.str("actions2.safetensors")).get_copy("actions") - expected).abs().max().item<double>() <
        1e-5);

  // --loss: per-element flow-matching loss equals compute_loss.
  auto loss_tensors = tokenized;
  auto target = torch::randn({2, 4, 8});
  auto time = torch::tensor({0.3f, 0.9f});
  loss_tensors["actions"] = target;
  loss_tensors["noise"] = noise;
  loss_tensors["time"] = time;
  io::save_safetensors(dir.str("loss_in.safetensors"), as_vector(loss_tensors));
  r = run_app("pi0-infer", "--bundle " + dir.str("bundle") + " --obs " + dir.str("loss_in.safetensors") + " --out " +
                               dir.str("loss.safetensors") + " --loss",
              dir);
  REQUIRE(r.code == 0);
  torch::Tensor expected_loss;
  {
    torch::NoGradGuard no_grad;
    expected_loss = bundle.model->compute_loss(ref_obs, target, noise, time);
  }
  auto loss = io::SafetensorsFile(dir.str("loss.safetensors")).get_copy("loss");
  REQUIRE(loss.sizes() == expected_loss.sizes());
  CHECK((loss - expected_loss).abs().max().item<double>() < 1e-5);
}

TEST_CASE("pi0-infer: NaN or infinite inputs and misspelled keys exit 2 naming the key", "[unit][io][inputs]") {
  testing::TempDir dir("pi0infer_inputs");
  auto run = fake_run(dir, /*lora=*/false);
  io::export_bundle(run.checkpoint, dir.str("bundle"), export_options("model"));
  auto infer = [&](const std::map<std::string, torch::Tensor>& obs) {
    io::save_safetensors(dir.str("obs.safetensors"), as_vector(obs));
    return run_app("pi0-infer", "--bundle " + dir.str("bundle") + " --obs " + dir.str("obs.safetensors") + " --out " +
                       dir.str("o.safetensors") + " --prompt go",
                   dir);
  };
  auto nan_state = raw_obs(1);
  nan_state["state"][0][3] = NAN;
  check_user_error(infer(nan_state), "pi0-infer", "'state' holds NaN at [0, 3], expected finite values");
  auto inf_state = raw_obs(1);
  inf_state["state"][0][0] = INFINITY;
  check_user_error(infer(inf_state), "pi0-infer", "'state' holds +Inf at [0, 0]");
  auto nan_image = raw_obs(1);
  nan_image["image/base_0_rgb"] = torch::zeros({1, kImageSize, kImageSize, 3});
  nan_image["image/base_0_rgb"][0][1][2][0] = NAN;
  check_user_error(infer(nan_image), "pi0-infer", "'image/base_0_rgb' holds NaN at [0, 1, 2, 0]");
  auto typo = raw_obs(1);
  typo["image_mazk/base_0_rgb"] = torch::zeros({1}, torch::kBool);
  check_user_error(infer(typo), "pi0-infer",
                   "unknown key 'image_mazk/base_0_rgb' (did you mean 'image_mask/base_0_rgb'?)");
  CHECK(!fs::exists(dir.str("o.safetensors")));
  auto good = infer(raw_obs(1));
  INFO(good.err);
  CHECK(good.code == 0);
}

TEST_CASE("pi0-export and pi0-infer reject bad inputs with one line and exit code 2", "[unit][io]") {
  testing::TempDir dir("pi0infer");
  auto run = fake_run(dir, /*lora=*/false);
  io::export_bundle(run.checkpoint, dir.str("bundle"), export_options("model"));
  const std::string bundle = " --bundle " + dir.str("bundle");
  const std::string out = " --out " + dir.str("o.safetensors");
  auto good = raw_obs(1);
  io::save_safetensors(dir.str("good.safetensors"), as_vector(good));
  auto infer = [&](const std::string& args) { return run_app("pi0-infer", args, dir); };

  check_user_error(run_app("pi0-export", "--checkpoint " + dir.str("nope") + " --out " + dir.str("x"), dir),
                   "pi0-export", "nope");
  check_user_error(run_app("pi0-export", "--checkpoint " + run.checkpoint + " --out " + dir.str("x") + " --dtype f16", dir),
                   "pi0-export", "--dtype");

  check_user_error(infer("--bundle " + dir.str("missing") + " --obs " + dir.str("good.safetensors") + out + " --prompt go"),
                   "pi0-infer", "missing");
  fs::copy(dir.str("bundle"), dir.str("broken"), fs::copy_options::recursive);
  fs::remove(dir.str("broken/model.safetensors"));
  check_user_error(infer("--bundle " + dir.str("broken") + " --obs " + dir.str("good.safetensors") + out + " --prompt go"),
                   "pi0-infer", "broken/model.safetensors: missing");

  auto no_state = good;
  no_state.erase("state");
  io::save_safetensors(dir.str("no_state.safetensors"), as_vector(no_state));
  check_user_error(infer(bundle + " --obs " + dir.str("no_state.safetensors") + out + " --prompt go"), "pi0-infer",
                   "missing tensor 'state'");

  auto four = good;
  four["image/base_0_rgb"] = torch::zeros({1, kImageSize, kImageSize, 4}, torch::kUInt8);
  io::save_safetensors(dir.str("four.safetensors"), as_vector(four));
  check_user_error(infer(bundle + " --obs " + dir.str("four.safetensors") + out + " --prompt go"), "pi0-infer",
                   "'image/base_0_rgb' has shape [1, 28, 28, 4], expected [B,H,W,3]");

  io::save_safetensors(dir.str("bad_noise.safetensors"), {{"noise", torch::zeros({1, 4, 7})}});
  check_user_error(infer(bundle + " --obs " + dir.str("good.safetensors") + out + " --prompt go --noise " +
                         dir.str("bad_noise.safetensors")),
                   "pi0-infer", "'noise' has shape [1, 4, 7] and dtype Float, expected float [B,H,A] = [1, 4, 8]");

  check_user_error(infer(bundle + " --obs " + dir.str("good.safetensors") + out), "pi0-infer",
                   "missing 'tokenized_prompt'");
  check_user_error(infer(bundle + " --obs " + dir.str("good.safetensors") + out + " --prompt go --loss"), "pi0-infer",
                   "missing tensor 'actions'");
  check_user_error(infer(bundle + " --obs " + dir.str("good.safetensors") + out + " --num-steps 0 --prompt go"),
                   "pi0-infer", "--num-steps");
  CHECK(!fs::exists(dir.str("o.safetensors")));
}

// Issue 23 item 1: --out was renamed over whatever it was (a character device became a 712-byte regular file, exit 0).
TEST_CASE("pi0-infer --out a character device exits 2 and leaves the device as it was", "[unit][io]") {
  testing::TempDir dir("pi0infer");
  auto run = fake_run(dir, /*lora=*/false);
  io::export_bundle(run.checkpoint, dir.str("bundle"), export_options("model"));
  io::save_safetensors(dir.str("good.safetensors"), as_vector(raw_obs(1)));
  const std::string args = "--bundle " + dir.str("bundle") + " --obs " + dir.str("good.safetensors") + " --prompt go";
  const auto device = dir.str("null_device");  // like /dev/null (1, 3)
  if (::mknod(device.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0) {
    testing::skip("mknod of a character device is not permitted here");
    return;
  }
  check_user_error(run_app("pi0-infer", args + " --out " + device, dir), "pi0-infer",
                   device + ": exists and is a character device, not a regular file");
  struct stat st {};
  REQUIRE(::lstat(device.c_str(), &st) == 0);
  CHECK(S_ISCHR(st.st_mode));
  // The same command with a file as --out succeeds: only the destination was refused.
  const auto ok = run_app("pi0-infer", args + " --out " + dir.str("actions.safetensors"), dir);
  INFO(ok.err);
  CHECK(ok.code == 0);
}

TEST_CASE("pi0-export falls back past a newest checkpoint that does not verify, with --resume's warning",
          "[unit][io]") {
  testing::TempDir dir("pi0export");
  auto run = fake_run(dir, /*lora=*/false);
  // Step 7: a copy of step 5 with a NaN in its weights (newest, complete, damaged).
  const std::string bad = run.run_dir + "/checkpoints/7";
  fs::copy(run.checkpoint, bad, fs::copy_options::recursive);
  testing::write_nan(bad + "/model.safetensors", "action_out_proj.weight");
  const auto bad_bytes = testing::read_bytes(bad + "/model.safetensors");
  {
    testing::LogCapture log;
    const auto rep = io::export_run(run.run_dir, dir.str("bundle"), export_options("model"));
    CHECK(rep.checkpoint_dir == run.checkpoint);
    CHECK_THAT(log.text(), Contains("checkpoint " + bad + " does not verify and is skipped (left untouched): " + bad +
                                    "/model.safetensors") &&
                               Contains("non-finite") && Contains("falling back to " + run.checkpoint));
    CHECK_THAT(log.text(), !Contains("cannot be read"));  // the incomplete checkpoints/9 is no unreadable one
  }
  CHECK(testing::read_bytes(bad + "/model.safetensors") == bad_bytes);
  // The app says the same and exits 0.
  const auto app = run_app("pi0-export", "--checkpoint " + run.run_dir + " --out " + dir.str("bundle2"), dir);
  CHECK(app.code == 0);
  CHECK_THAT(app.out + app.err, Contains("does not verify and is skipped") && Contains("falling back to"));
  // None verifies: one error naming the newest reason and how to export one checkpoint.
  testing::write_nan(run.checkpoint + "/model.safetensors", "action_out_proj.weight");
  CHECK_THROWS_WITH(io::export_run(run.run_dir, dir.str("bundle3"), export_options("model")),
                    Contains("none of its 2 complete checkpoints verifies (newest: " + bad + "/model.safetensors") &&
                        Contains("--checkpoint " + run.run_dir + "/checkpoints/<step>"));
  CHECK(!fs::exists(dir.str("bundle3")));
  // A checkpoint given by its own path is refused, never replaced by another.
  CHECK_THROWS_AS(io::export_run(bad, dir.str("bundle3"), export_options("model")), io::CheckpointRejected);
}

TEST_CASE("pi0-export errors name --out, never its temporary folder (issue 23 item 8)", "[unit][io]") {
  testing::TempDir dir("pi0export");
  auto run = fake_run(dir, /*lora=*/false);
  std::ofstream(dir.str("a_file")) << "x";
  const std::string out = dir.str("a_file/bundle");
  try {
    io::export_run(run.checkpoint, out, export_options("model"));
    FAIL("exported under a regular file");
  } catch (const std::exception& e) {
    CHECK_THAT(e.what(), Contains("--out '" + out + "'") && Contains("cannot create directories ('" +
                                                                         dir.str("a_file") + "' is a regular file)"));
    CHECK_THAT(e.what(), !Contains(".tmp_"));
  }
  check_user_error(run_app("pi0-export", "--checkpoint " + run.checkpoint + " --out " + out, dir), "pi0-export",
                   "--out '" + out + "'");
}
