// data.datasets (weighted mixtures), the validation keys and train.loss_mask: parsing, resolution of each entry's
// norm stats and asset id, the round trip of the resolved config, and one-line errors naming the key.
#include <catch2/catch.hpp>

#include "pi0/common/check.h"
#include "pi0/config/config.h"

using namespace pi0::config;
using Catch::Contains;

namespace {
Config parse(const std::string& yaml, std::vector<std::string> overrides = {}) {
  return parse_config(YAML::Load(yaml), "run.yaml", overrides);
}

const char* kMixture = R"(
data:
  datasets:
    - {format: libero, paths: [libero/*.hdf5], weight: 3, norm_stats: libero_stats.json}
    - format: lerobot
      paths: [/data/aloha_sim]
      cameras: {base_0_rgb: observation.images.top}
      norm_stats: aloha_stats.json
      asset_id: aloha
      validation_episodes: [4, 1]
  norm_stats: shared.json
  validation_split: 0.1
checkpoint: {asset_id: libero}
train: {loss_mask: [episode_end, action_padding], val_interval: 50, val_samples: 16}
)";
}  // namespace

TEST_CASE("data.datasets: entries with data.dataset's keys, weights and their own stats and asset ids",
          "[unit][config]") {
  const auto c = parse(kMixture);
  REQUIRE(c.data.datasets.size() == 2);
  CHECK(c.data.datasets[0].weight == 3.0);
  CHECK(c.data.datasets[1].weight == 1.0);  // default
  CHECK(c.data.datasets[1].cameras.at("base_0_rgb") == "observation.images.top");
  CHECK(c.data.datasets[1].validation_episodes == std::vector<int64_t>{4, 1});
  const auto entries = dataset_entries(c);
  REQUIRE(entries.size() == 2);
  CHECK(entries[0].asset_id == "libero");  // checkpoint.asset_id for the first entry
  CHECK(entries[1].asset_id == "aloha");
  CHECK(entries[0].norm_stats == "libero_stats.json");
  CHECK(dataset_key(c, 1) == "data.datasets[1]");
  const auto one = for_dataset(c, 1);
  CHECK(one.data.datasets.empty());
  CHECK(one.data.dataset.format == "lerobot");
  CHECK(one.data.dataset.paths == std::vector<std::string>{"/data/aloha_sim"});
  CHECK(one.data.norm_stats == "aloha_stats.json");
  CHECK(one.checkpoint.asset_id == "aloha");
  CHECK(validation_enabled(c));
  CHECK(val_interval(c) == 50);
  CHECK(loss_mask(c.train).episode_end);
  CHECK(loss_mask(c.train).action_padding);
}

TEST_CASE("data.datasets: empty stats and asset ids fall back to data.norm_stats and <asset_id>_<i>", "[unit][config]") {
  const auto c = parse("data:\n  datasets: [{paths: [a.hdf5]}, {paths: [b.hdf5]}, {paths: [c.hdf5], asset_id: c}]\n"
                       "  norm_stats: shared.json\n");
  const auto entries = dataset_entries(c);
  REQUIRE(entries.size() == 3);
  CHECK(entries[0].asset_id == "default");
  CHECK(entries[1].asset_id == "default_1");
  CHECK(entries[2].asset_id == "c");
  for (const auto& e : entries) CHECK(e.norm_stats == "shared.json");
}

TEST_CASE("a single data.dataset is the one entry: weight 1, data.norm_stats, checkpoint.asset_id", "[unit][config]") {
  const auto c = parse("data: {dataset: {format: aloha, paths: [x/*.hdf5]}, norm_stats: n.json}\n"
                       "checkpoint: {asset_id: trossen}\n");
  const auto entries = dataset_entries(c);
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].format == "aloha");
  CHECK(entries[0].weight == 1.0);
  CHECK(entries[0].norm_stats == "n.json");
  CHECK(entries[0].asset_id == "trossen");
  CHECK(dataset_key(c, 0) == "data.dataset");
  CHECK_FALSE(validation_enabled(c));
  CHECK(val_interval(c) == c.checkpoint.save_interval);  // 0 = save_interval
  CHECK_FALSE(loss_mask(c.train).any());                 // openpi's loss by default
}

TEST_CASE("a mixture's resolved config round-trips, as YAML and as the compact log text", "[unit][config]") {
  const auto c = parse(kMixture);
  const auto yaml = to_yaml(c);
  CHECK_FALSE(yaml["data"]["dataset"]);  // data.dataset's defaults beside data.datasets would read back as both set
  for (const auto& again : {parse_config(YAML::Load(YAML::Dump(yaml)), "resolved"),
                            parse_config(YAML::Load(to_compact_text(c)), "compact")}) {
    REQUIRE(again.data.datasets.size() == 2);
    CHECK(again.data.datasets[0].weight == 3.0);
    CHECK(again.data.datasets[1].asset_id == "aloha");
    CHECK(again.data.datasets[1].validation_episodes == std::vector<int64_t>{4, 1});
    CHECK(again.data.datasets[1].cameras == c.data.datasets[1].cameras);
    CHECK(again.train.loss_mask == c.train.loss_mask);
    CHECK(YAML::Dump(to_yaml(again)) == YAML::Dump(yaml));
  }
}

TEST_CASE("data.datasets refuses bad entries with one line naming the key", "[unit][config]") {
  const std::string two = "data: {datasets: [{paths: [a.hdf5], asset_id: a}, {paths: [b.hdf5], asset_id: b}]}\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"data: {dataset: {paths: [a.hdf5]}, datasets: [{paths: [b.hdf5]}]}\n", "data.dataset and data.datasets are both set"},
      {"data: {datasets: [{paths: [a.hdf5], weight: 0}]}\n", "data.datasets[0].weight must be > 0 (got 0)"},
      {"data: {datasets: [{paths: [a.hdf5], weight: -2}]}\n", "data.datasets[0].weight must be > 0 (got -2)"},
      {"data: {datasets: [{paths: [a.hdf5], weight: .inf}]}\n", "data.datasets[0].weight must be a finite number"},
      {"data: {datasets: [{paths: [a.hdf5], format: rlds}]}\n", "data.datasets[0].format must be libero, aloha or lerobot"},
      {"data: {datasets: [{paths: [a.hdf5], wieght: 2}]}\n", "unknown key 'data.datasets[0].wieght' (did you mean 'data.datasets[0].weight'?)"},
      {"data: {datasets: [{paths: [a.hdf5], asset_id: x}, {paths: [b.hdf5], asset_id: x}]}\n",
       "data.datasets[1].asset_id must be unique among data.datasets"},
      {"data: {datasets: [{paths: [a.hdf5], asset_id: ../up}]}\n", "data.datasets[0].asset_id must be a plain folder name"},
      {"data: {datasets: [{paths: [a.hdf5], asset_id: " + std::string(256, 'x') + "}]}\n",
       "data.datasets[0].asset_id must be a folder name of at most 255 bytes (got 256 bytes: 'xxx"},
      // Each weight is finite but their sum is not: every sample would come from the last entry.
      {"data: {datasets: [{paths: [a.hdf5], asset_id: a, weight: 1.0e+308}, {paths: [b.hdf5], asset_id: b, weight: "
       "1.0e+308}]}\n",
       "data.datasets[].weight must be weights with a finite sum (only their ratios count: scale them down) (got "
       "1e+308 + 1e+308 = inf)"},
      {"data: {datasets: [{paths: [a.hdf5], validation_episodes: [-1]}]}\n",
       "data.datasets[0].validation_episodes must be episode indices >= 0 (got -1)"},
      {"data: {datasets: [a.hdf5]}\n", "data.datasets[0] must be a mapping"},
      {"data: {validation_split: 1}\n", "data.validation_split must be in [0, 1)"},
      {"train: {loss_mask: [padding]}\n", "train.loss_mask[0] must be episode_end or action_padding (got 'padding')"},
      {"train: {val_samples: -1}\n", "train.val_samples must be >= 0"},
      {"checkpoint: {keep_best: 2}\n", "checkpoint.keep_best must be 0 without a validation split"},
  };
  for (const auto& [yaml, message] : cases) {
    INFO(yaml);
    CHECK_THROWS_WITH(parse(yaml), Contains(message) && !Contains("\n"));
  }
  // --set on data.dataset of a mixture config is the same mistake.
  CHECK_THROWS_WITH(parse(two, {"data.dataset.paths=[c.hdf5]"}), Contains("data.dataset and data.datasets are both set"));
  CHECK_NOTHROW(parse(two, {"checkpoint.keep_best=1", "data.validation_split=0.2"}));
}

// Issue 49 item 7: --set reaches a mixture entry, addressed as the messages name it (data.datasets[1]); it used to
// be refused as an unknown key. An index past the list is refused naming the entries there are.
TEST_CASE("config overrides reach a mixture entry by its index and an index past the list is refused", "[unit][config]") {
  const auto c = parse(kMixture, {"data.datasets[1].prompt=fold the towel", "data.datasets[0].weight=5",
                                  "data.datasets[1].cameras.left_wrist_0_rgb=observation.images.wrist"});
  REQUIRE(c.data.datasets.size() == 2);
  CHECK(c.data.datasets[1].prompt == "fold the towel");
  CHECK(c.data.datasets[0].prompt.empty());
  CHECK(c.data.datasets[0].weight == 5.0);
  CHECK(c.data.datasets[1].cameras.at("left_wrist_0_rgb") == "observation.images.wrist");
  CHECK(c.data.datasets[1].cameras.at("base_0_rgb") == "observation.images.top");  // the rest of the entry stays
  // A whole entry, as YAML.
  const auto whole = parse(kMixture, {"data.datasets[0]={paths: [x.hdf5], norm_stats: x.json}"});
  CHECK(whole.data.datasets[0].paths == std::vector<std::string>{"x.hdf5"});
  CHECK(whole.data.datasets[0].weight == 1.0);
  // Keys inside an entry are checked as the file's are.
  CHECK_THROWS_WITH(parse(kMixture, {"data.datasets[1].promt=x"}), Contains("unknown key 'data.datasets[1].promt'") &&
                                                                      Contains("did you mean 'data.datasets[1].prompt'"));
  CHECK_THROWS_WITH(parse(kMixture, {"data.datasets[2].prompt=x"}),
                    "--set data.datasets[2].prompt: data.datasets has 2 entries (data.datasets[0]..data.datasets[1]), "
                    "so there is no data.datasets[2]; give the whole list to add one (data.datasets=[...])");
  CHECK_THROWS_WITH(parse("data: {dataset: {paths: [a.hdf5]}}\n", {"data.datasets[0].prompt=x"}),
                    Contains("data.datasets has 0 entries, so there is no data.datasets[0]"));
  CHECK_THROWS_WITH(parse(kMixture, {"data.datasets[x].prompt=x"}),
                    Contains("'datasets[x]' is not a key or an entry of a list"));
  CHECK_THROWS_WITH(parse(kMixture, {"data.datasets.prompt=x"}),
                    Contains("'datasets' is not a section but a list (address an entry as data.datasets[0])"));
}

// Issue 49 item 11: a scalar where a list is expected says the list form of what was written.
TEST_CASE("train.loss_mask given as one value suggests the list of one", "[unit][config]") {
  CHECK_THROWS_WITH(parse("train: {loss_mask: []}\n", {"train.loss_mask=action_padding"}),
                    "run.yaml: train.loss_mask must be a list (got 'action_padding'); write [action_padding] for a "
                    "list of one");
  CHECK(loss_mask(parse("train: {loss_mask: []}\n", {"train.loss_mask=[action_padding]"}).train).action_padding);
}
