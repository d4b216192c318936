// openpi parity through the command line: a checkpoint of the fixture model (explicit dimensions in its config)
// exported with pi0-export, then pi0-infer on an observation file holding the fixture inputs (tokenized prompt
// given) reproduces openpi's sampled_actions (--noise) and elementwise loss (--loss).
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <filesystem>
#include <fstream>

#include "pi0/config/config.h"
#include "pi0/data/norm_stats.h"
#include "pi0/io/model_weights.h"
#include "pi0/io/safetensors.h"
#include "pi0/model/model_config.h"
#include "support/openpi_fixture.h"
#include "support/app_process.h"
#include "support/test_support.h"

using namespace pi0;
namespace fs = std::filesystem;

namespace {

int run_app(const std::string& app, const std::string& args, const testing::TempDir& dir, std::string* err) {
  const std::string err_path = dir.str("stderr.txt");
  const std::string cmd = testing::app_dir() + "/" + app + " " + args + " > " + dir.str("stdout.txt") + " 2> " +
                          err_path;
  const int status = std::system(cmd.c_str());
  std::ifstream in(err_path);
  *err = std::string((std::istreambuf_iterator<char>(in)), {});
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Norm stats that leave the fixture's (already normalized) state unchanged up to the 1e-6 the formulas add.
data::NormStats identity_stats(int64_t dim) {
  data::NormStats s;
  for (const char* key : {"state", "actions"}) {
    data::KeyStats k;
    k.mean.assign(static_cast<size_t>(dim), 0.0);
    k.std.assign(static_cast<size_t>(dim), 1.0);
    k.q01.assign(static_cast<size_t>(dim), -1.0);
    k.q99.assign(static_cast<size_t>(dim), 1.0);
    s.keys[key] = k;
  }
  return s;
}

void check_cli_parity(const std::string& name) {
  if (!testing::openpi_fixture_present(name + "/outputs.safetensors")) return;
  const std::string fixture = testing::openpi_fixtures_dir() + "/" + name;
  const std::string tokenizer = std::string(PI0_SOURCE_DIR) + "/data/tokenizer/tiny_spm.model";
  testing::TempDir dir("pi0parity_cli");
  const std::string ckpt = dir.str("run/checkpoints/12");
  fs::create_directories(ckpt + "/assets/fixture");
  const std::string yaml = testing::fixture_model_yaml(fixture) +
                           "data: {dataset: {format: libero, paths: [unused.hdf5]}, norm_stats: " +
                           dir.str("stats.json") + ", tokenizer: " + tokenizer + "}\n"
                           "train: {precision: float32}\n"
                           "checkpoint: {run_dir: " + dir.str("run") + ", asset_id: fixture}\n";
  const auto cfg = config::parse_config(YAML::Load(yaml), "fixture config");
  // A checkpoint as the trainer writes it, holding openpi's weights.
  model::Pi0 m(model::options_from_config(cfg.model));
  io::load_model_weights(*m, fixture + "/weights.safetensors");
  io::SaveOptions so;
  so.openpi_layout = false;
  io::save_model_weights(*m, ckpt + "/model.safetensors", so);
  std::ofstream(ckpt + "/config.yaml") << YAML::Dump(config::to_yaml(cfg)) << "\n";
  data::save_norm_stats(identity_stats(cfg.model.action_dim), ckpt + "/assets/fixture/norm_stats.json");
  fs::copy_file(tokenizer, ckpt + "/tokenizer.model");
  std::ofstream(ckpt + "/COMPLETE") << "12\n";

  std::string err;
  REQUIRE(run_app("pi0-export", "--checkpoint " + ckpt + " --out " + dir.str("bundle") + " --dtype float32", dir, &err) == 0);
  INFO(err);
  // The bundle describes the model by its dimensions.
  const auto cj = testing::read_json(dir.str("bundle/config.json"));
  CHECK(cj.at("action_expert_variant").at("width") == cfg.model.action_expert_variant.width);

  const auto in = io::read_safetensors(fixture + "/inputs.safetensors");
  const auto ref = io::read_safetensors(fixture + "/outputs.safetensors");
  std::vector<std::pair<std::string, torch::Tensor>> obs;
  for (const auto& [k, v] : in)
    if (k != "actions" && k != "noise" && k != "time") obs.emplace_back(k, v);
  io::save_safetensors(dir.str("obs.safetensors"), obs);
  io::save_safetensors(dir.str("noise.safetensors"), {{"noise", in.at("noise")}});
  REQUIRE(run_app("pi0-infer", "--bundle " + dir.str("bundle") + " --obs " + dir.str("obs.safetensors") + " --noise " +
                                   dir.str("noise.safetensors") + " --num-steps 10 --out " + dir.str("actions.safetensors"),
                  dir, &err) == 0);
  const auto actions = io::SafetensorsFile(dir.str("actions.safetensors")).get_copy("actions");
  const double actions_err = testing::masked_rel_error(actions, ref.at("sampled_actions"));
  std::printf("parity %s pi0-infer sampled_actions max rel error %.2e\n", name.c_str(), actions_err);
  CHECK(actions_err < 1e-4);

  obs.emplace_back("actions", in.at("actions"));
  obs.emplace_back("noise", in.at("noise"));
  obs.emplace_back("time", in.at("time"));
  io::save_safetensors(dir.str("loss_in.safetensors"), obs);
  REQUIRE(run_app("pi0-infer", "--bundle " + dir.str("bundle") + " --obs " + dir.str("loss_in.safetensors") +
                                   " --loss --out " + dir.str("loss.safetensors"),
                  dir, &err) == 0);
  const auto loss = io::SafetensorsFile(dir.str("loss.safetensors")).get_copy("loss");
  const double loss_err = testing::masked_rel_error(loss, ref.at("loss"));
  std::printf("parity %s pi0-infer --loss max rel error %.2e\n", name.c_str(), loss_err);
  CHECK(loss_err < 1e-4);
}

}  // namespace

TEST_CASE("openpi parity through pi0-export and pi0-infer: pi0", "[parity][io]") { check_cli_parity("pi0"); }

TEST_CASE("openpi parity through pi0-export and pi0-infer: pi0.5", "[parity][io]") { check_cli_parity("pi05"); }
