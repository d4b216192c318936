// The config as text: shortest round-trip numbers in config.yaml and --config-reference, and the compact form
// pi0-train logs at start (config::to_compact_text).
#include <catch2/catch.hpp>

#include <algorithm>

#include "pi0/config/config.h"

using namespace pi0;
using Catch::Contains;

TEST_CASE("config text: shortest round-trip numbers, compact, parses back to the same config", "[unit][config]") {
  auto cfg = config::load_config(std::string(PI0_SOURCE_DIR) + "/configs/debug.yaml",
                                 {"train.adam_b2=0.95", "train.lr_peak=2.5e-5", "data.dataset.prompt=pick up, then place"});
  const auto yaml = YAML::Dump(config::to_yaml(cfg));
  CHECK_THAT(yaml, Contains("adam_b2: 0.95\n") && Contains("lr_peak: 2.5e-05\n") && Contains("clip_grad_norm: 1.0\n"));
  CHECK_THAT(yaml, !Contains("0.9499999"));
  const auto text = config::to_compact_text(cfg);
  INFO(text);
  CHECK_THAT(text, Contains("train: {num_steps: 300, batch_size: 16,") && Contains("adam_b2: 0.95,"));
  size_t lines = 1, longest = 0, start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == '\n') {
      longest = std::max(longest, i - start);
      lines += i < text.size();
      start = i + 1;
    }
  }
  CHECK(longest <= 118);
  CHECK(lines <= 24);  // grows with the keys (model.type pi0_fast and train.subtask added four lines)
  CHECK(text.back() != '\n');
  // Valid YAML for the same config (a comma inside a quoted prompt does not split it).
  const auto again = config::parse_config(YAML::Load(text), "compact");
  CHECK(YAML::Dump(config::to_yaml(again)) == yaml);
  CHECK(again.data.dataset.prompt == "pick up, then place");
}

TEST_CASE("data.dataset.flip_images is a config key: auto, true or false", "[unit][config]") {
  const std::string debug = std::string(PI0_SOURCE_DIR) + "/configs/debug.yaml";
  CHECK(config::load_config(debug).data.dataset.flip_images == "auto");
  CHECK(config::load_config(debug, {"data.dataset.flip_images=false"}).data.dataset.flip_images == "false");
  REQUIRE_THROWS_WITH(config::load_config(debug, {"data.dataset.flip_images=up"}),
                      Contains("data.dataset.flip_images must be auto, true or false (got 'up')"));
}
