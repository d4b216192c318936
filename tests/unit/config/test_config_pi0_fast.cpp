// model.type pi0_fast in the config: its keys (model.fast_tokenizer, max_decoding_steps, temperature), the 250-token
// default, and the settings that belong to the flow-matching models refused in one line naming key and value.
#include <catch2/catch.hpp>

#include "pi0/config/config.h"
#include "pi0/model/model_config.h"

using namespace pi0::config;
using Catch::Contains;

namespace {
Config parse(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), {"model.type=pi0_fast", "model.fast_tokenizer=fast/"});
  return parse_config(YAML::Load(""), "run.yaml", overrides);
}
}  // namespace

TEST_CASE("config pi0_fast: its keys, defaults and the model options they make", "[unit][config][fast]") {
  const auto c = parse({});
  CHECK(c.model.max_decoding_steps == 256);
  CHECK(c.model.temperature == 0.0);
  const auto o = pi0::model::options_from_config(c.model);
  CHECK(o.fast);
  CHECK_FALSE(o.pi05);
  CHECK(o.max_token_len == 250);  // openpi's Pi0FASTConfig
  // The action expert is not built: a variant that joint attention would refuse is ignored.
  CHECK(pi0::model::options_from_config(parse({"model.action_expert_variant=gemma_300m",
                                               "model.paligemma_variant=dummy"}).model).fast);
  CHECK(parse_config(to_yaml(c), "dump").model.fast_tokenizer == "fast/");
}

TEST_CASE("config pi0_fast: what it needs and what it cannot use, one line each", "[unit][config][fast]") {
  const std::pair<std::vector<std::string>, std::string> bad[] = {
      {{"model.fast_tokenizer=''"}, "model.fast_tokenizer must be a FAST tokenizer folder"},
      {{"model.max_decoding_steps=0"}, "model.max_decoding_steps must be > 0 (got 0)"},
      {{"model.temperature=-1"}, "model.temperature must be >= 0 (0 = greedy) (got -1)"},
      {{"train.freeze=action-expert-only"}, "train.freeze must be full, +vision, +language, freeze-vision, lora or "
                                            "lora-only with model.type pi0_fast"},
      {{"train.freeze=projection-only"}, "(got 'projection-only')"},
      {{"train.rtc_max_delay=2"}, "train.rtc_max_delay must be 0 with model.type pi0_fast"},
      {{"train.loss_mask=[episode_end]"}, "train.loss_mask must be [] with model.type pi0_fast"},
      {{"train.offload=optimizer"}, "train.offload must be none with model.type pi0_fast"},
      {{"train.gradient_checkpointing=auto"}, "train.gradient_checkpointing must be true or false with model.type "
                                              "pi0_fast"},
      {{"train.ki.enabled=true", "train.ki.fast_tokenizer=fast/"}, "train.ki.enabled must be model.type pi05"},
  };
  for (const auto& [overrides, message] : bad) {
    INFO(overrides.front());
    CHECK_THROWS_WITH(parse(overrides), Contains(message) && !Contains("\n"));
  }
  // Validation runs (its cross-entropy and greedy decoding, docs/pi0_fast.md).
  CHECK(parse({"data.validation_split=0.1"}).data.validation_split == 0.1);
  // The other model types take no model.fast_tokenizer.
  CHECK_THROWS_WITH(parse_config(YAML::Load(""), "run.yaml", {"model.fast_tokenizer=fast/"}),
                    Contains("model.fast_tokenizer must be empty with model.type pi0") && !Contains("\n"));
  CHECK_THROWS_WITH(parse_config(YAML::Load(""), "run.yaml", {"model.type=pi0fast"}),
                    Contains("model.type must be pi0, pi05 or pi0_fast (got 'pi0fast')"));
}
