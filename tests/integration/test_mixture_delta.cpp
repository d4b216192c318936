// Per-dataset delta masks in a mixture (data.datasets[i].delta_action_mask): a LIBERO-layout and an ALOHA-layout
// entry, each with its robot's mask, train on their own deltas (each source's transform is the single-dataset run's),
// and the bundle's assets give each robot's actions exactly as a bundle of that dataset alone does.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include <yaml-cpp/yaml.h>

#include "pi0/config/config.h"
#include "pi0/data/aloha.h"
#include "pi0/data/config_options.h"
#include "pi0/data/dataset.h"
#include "pi0/data/example_data.h"
#include "pi0/data/norm_stats.h"
#include "pi0/infer/inference.h"
#include "pi0/io/bundle.h"
#include "pi0/train/data_setup.h"
#include "pi0/train/trainer.h"
#include "support/app_process.h"
#include "support/test_support.h"

using namespace pi0;
using Catch::Matchers::Contains;

namespace {

struct Entry {
  std::string format, asset, data_glob;
  std::vector<bool> mask;
};

// configs/debug.yaml training on `entries` (a mixture, or one entry as data.dataset with the global mask).
std::string write_config(const testing::TempDir& dir, const std::string& name, const std::vector<Entry>& entries) {
  auto cfg = YAML::LoadFile(std::string(PI0_SOURCE_DIR) + "/configs/debug.yaml");
  cfg["model"]["action_dim"] = 14;  // ALOHA's 14 state and action dims
  cfg["data"].remove("dataset");
  cfg["data"].remove("norm_stats");
  auto yaml_entry = [&](const Entry& e) {
    YAML::Node n;
    n["format"] = e.format;
    n["paths"].push_back(e.data_glob);
    if (e.format == "aloha") n["prompt"] = "fold the towel";  // ALOHA files store no instruction
    return n;
  };
  if (entries.size() == 1) {
    cfg["data"]["dataset"] = yaml_entry(entries[0]);
    cfg["data"]["norm_stats"] = dir.str(entries[0].asset + "_stats.json");
    for (const bool b : entries[0].mask) cfg["data"]["delta_action_mask"].push_back(b);
    cfg["checkpoint"]["asset_id"] = entries[0].asset;
  } else {
    for (const auto& e : entries) {
      auto n = yaml_entry(e);
      n["norm_stats"] = dir.str(e.asset + "_stats.json");
      n["asset_id"] = e.asset;
      for (const bool b : e.mask) n["delta_action_mask"].push_back(b);
      cfg["data"]["datasets"].push_back(n);
    }
  }
  cfg["data"]["tokenizer"] = std::string(PI0_SOURCE_DIR) + "/data/tokenizer/tiny_spm.model";
  cfg["data"]["num_workers"] = 0;
  cfg["train"]["num_steps"] = 2;
  cfg["train"]["batch_size"] = 4;
  cfg["checkpoint"]["run_dir"] = dir.str("run_" + name);
  cfg["checkpoint"]["save_interval"] = 2;
  const auto path = dir.str(name + ".yaml");
  std::ofstream(path) << YAML::Dump(cfg);
  return path;
}

std::vector<bool> mask(std::initializer_list<int> runs) {  // openpi's make_bool_mask: 6, -1 → 6 true, 1 false
  std::vector<bool> m;
  for (const int r : runs) m.insert(m.end(), static_cast<size_t>(std::abs(r)), r > 0);
  return m;
}

}  // namespace

TEST_CASE("mixture: each entry's delta_action_mask is its transform's, its norm stats' and its asset's",
          "[integration][train][data]") {
  testing::TempDir dir("mixdelta");
  data::ExampleDataOptions eo;
  eo.episodes = 3;
  eo.steps = 12;
  eo.image_size = 32;
  data::write_example_libero(dir.str("libero"), eo);  // 8-d state, 7-d actions
  data::write_example_aloha(dir.str("aloha"), eo);    // 14-d state and actions
  const std::vector<Entry> entries = {
      {"libero", "libero", dir.str("libero") + "/*.hdf5", mask({6, -1})},
      {"aloha", "trossen", dir.str("aloha") + "/*.hdf5", mask({6, -1, 6, -1})}};
  const auto mix_yaml = write_config(dir, "mix", entries);
  const auto cfg = config::load_config(mix_yaml);
  // Each entry's stats over its own deltas, as pi0-norm-stats --config writes them.
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto one = config::for_dataset(cfg, i);
    CHECK(one.data.delta_action_mask == entries[i].mask);
    data::NormStatsOptions so;
    so.delta_action_mask = one.data.delta_action_mask;
    data::save_norm_stats(data::compute_norm_stats(data::RobotDataset(data::dataset_options(one, "x")), so),
                          one.data.norm_stats);
  }
  if (testing::apps_built({"pi0-norm-stats"})) {
    // The app writes the same files from the mixture's config.
    for (const auto& e : entries) std::filesystem::rename(dir.str(e.asset + "_stats.json"), dir.str(e.asset + "_ref.json"));
    const auto r = testing::run_app_process("pi0-norm-stats", "--config " + mix_yaml, dir);
    INFO(r.out << r.err);
    REQUIRE(r.code == 0);
    for (const auto& e : entries) {
      const auto got = data::load_norm_stats(dir.str(e.asset + "_stats.json"));
      const auto want = data::load_norm_stats(dir.str(e.asset + "_ref.json"));
      CHECK(got.at("actions").mean == want.at("actions").mean);
      CHECK(got.at("actions").q01 == want.at("actions").q01);
    }
  }

  // Training: each source's transform is the single-dataset run's, mask included.
  std::vector<std::string> single_yaml;
  for (const auto& e : entries) single_yaml.push_back(write_config(dir, e.asset, {e}));
  const auto mix = train::make_data_pipeline(cfg, 4, 0, 1, {});
  REQUIRE(mix.sources.size() == 2);
  for (size_t i = 0; i < entries.size(); ++i) {
    INFO(entries[i].asset);
    const auto single = train::make_data_pipeline(config::load_config(single_yaml[i]), 4, 0, 1, {});
    const auto& s = mix.sources[i];
    CHECK(s.transform->options().delta_action_mask == entries[i].mask);
    CHECK(single.sources[0].transform->options().delta_action_mask == entries[i].mask);
    for (const int64_t index : {0, 7, 20}) {
      const auto raw = s.dataset->get(index);
      const auto ours = (*s.transform)(raw, std::nullopt).actions;
      CHECK(torch::equal(ours, (*single.sources[0].transform)(raw, std::nullopt).actions));
    }
  }

  // Train and export the mixture and each dataset alone; each asset's robot actions equal the single bundle's.
  train::Trainer(cfg).run();
  io::ExportOptions xo;
  xo.dtype = torch::kFloat32;
  io::export_run(cfg.checkpoint.run_dir, dir.str("bundle_mix"), xo);
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    INFO(e.asset);
    const auto single_cfg = config::load_config(single_yaml[i]);
    train::Trainer(single_cfg).run();
    io::export_run(single_cfg.checkpoint.run_dir, dir.str("bundle_" + e.asset), xo);
    const auto mixed = io::load_bundle(dir.str("bundle_mix"), torch::kCPU, std::nullopt, e.asset);
    const auto alone = io::load_bundle(dir.str("bundle_" + e.asset), torch::kCPU, std::nullopt, "");
    CHECK(mixed.transform.delta_action_mask == e.mask);
    CHECK(alone.transform.delta_action_mask == e.mask);
    // The model-space chunk the training transform made from a recorded sample, and that sample's state.
    const auto& s = mix.sources[i];
    const auto raw = s.dataset->get(5);
    const auto model_space = (*s.transform)(raw, std::nullopt).actions.unsqueeze(0);
    const auto state = raw.state.unsqueeze(0);
    const auto ours = infer::robot_actions(mixed, model_space, state);
    CHECK(torch::equal(ours, infer::robot_actions(alone, model_space, state)));
    // And they are the recorded actions again (in the file's convention: ALOHA's, for adapt_to_pi): the deltas were
    // taken from this robot's own dims and are undone on them.
    torch::Tensor recorded = raw.actions.unsqueeze(0);
    if (mixed.config.data.dataset.adapt_to_pi_enabled()) recorded = data::aloha_actions_from_pi(recorded, "test");
    CHECK(ours.sizes() == recorded.sizes());
    CHECK(torch::allclose(ours, recorded, 1e-4, 1e-4));
  }
}

TEST_CASE("mixture: an entry's delta_action_mask longer than its dims is refused at start naming the key",
          "[integration][train][data]") {
  testing::TempDir dir("mixdeltabad");
  data::ExampleDataOptions eo;
  eo.episodes = 2;
  eo.steps = 10;
  eo.image_size = 32;
  data::write_example_libero(dir.str("libero"), eo);
  data::write_example_aloha(dir.str("aloha"), eo);
  // ALOHA's 14-entry mask on the LIBERO entry (7 action dims).
  const std::vector<Entry> entries = {
      {"libero", "libero", dir.str("libero") + "/*.hdf5", mask({6, -1, 6, -1})},
      {"aloha", "trossen", dir.str("aloha") + "/*.hdf5", mask({6, -1, 6, -1})}};
  const auto cfg = config::load_config(write_config(dir, "mix", entries));
  for (size_t i = 0; i < entries.size(); ++i) {
    auto one = config::for_dataset(cfg, i);
    one.data.delta_action_mask.clear();  // stats without deltas: only the dims matter here
    data::save_norm_stats(data::compute_norm_stats(data::RobotDataset(data::dataset_options(one, "x"))),
                          one.data.norm_stats);
  }
  CHECK_THROWS_WITH(train::make_data_pipeline(cfg, 4, 0, 1, {}),
                    Contains("data.datasets[0].delta_action_mask: 14 entries, expected at most 7 (the state dim 8 "
                             "and action dim 7 of data.datasets[0])") && !Contains("\n"));
  CHECK(config::delta_action_mask_key(cfg, 1) == "data.datasets[1].delta_action_mask");
  auto global = cfg;
  global.data.datasets[1].delta_action_mask.clear();
  global.data.delta_action_mask = mask({6, -1});
  CHECK(config::delta_action_mask_key(global, 1) == "data.delta_action_mask");
  CHECK(config::for_dataset(global, 1).data.delta_action_mask == mask({6, -1}));  // empty = the global mask
  CHECK(config::for_dataset(global, 0).data.delta_action_mask == mask({6, -1, 6, -1}));
}
