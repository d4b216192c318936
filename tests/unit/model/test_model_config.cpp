// model.*_variant as a name or as explicit dimensions: parsing, round trip, the model it builds, --print-params
// counts, and one-line errors for missing, unknown or inconsistent dimensions.
#include <catch2/catch.hpp>

#include "pi0/common/check.h"
#include "pi0/config/config.h"
#include "pi0/model/model_config.h"
#include "pi0/model/param_layout.h"
#include "pi0/train/memory_plan.h"

using namespace pi0;
using Catch::Contains;

namespace {

const char* kExplicit = R"(
model:
  type: pi05
  paligemma_variant: dummy
  action_expert_variant: {width: 40, depth: 4, mlp_dim: 88, num_heads: 8, num_kv_heads: 1, head_dim: 16}
  siglip_variant: {width: 48, depth: 2, mlp_dim: 96, num_heads: 4, patch_size: 14}
  vocab_size: 1024
  image_size: 28
  action_dim: 8
  action_horizon: 4
  max_token_len: 6
)";

config::Config parse(const std::string& yaml, std::vector<std::string> overrides = {}) {
  return config::parse_config(YAML::Load(yaml), "run.yaml", overrides);
}

}  // namespace

TEST_CASE("explicit model dimensions build that model and round-trip", "[unit][config][model]") {
  const auto cfg = parse(kExplicit);
  CHECK(cfg.model.paligemma_variant.variant == "dummy");
  CHECK_FALSE(cfg.model.action_expert_variant.is_named());
  CHECK(cfg.model.action_expert_variant.mlp_dim == 88);
  const auto o = model::options_from_config(cfg.model);
  CHECK(o.action_expert.width == 40);
  CHECK(o.action_expert.mlp_dim == 88);
  CHECK(o.siglip.width == 48);
  CHECK(o.siglip.num_heads == 4);
  CHECK(o.siglip.image_size == 28);

  model::Pi0 m(o);
  int64_t instantiated = 0;
  for (const auto& p : m->parameters()) instantiated += p.numel();
  // --print-params counts from shapes, and agrees with the instantiated model.
  const auto b = train::planned_breakdown(cfg);
  CHECK(b.total.total == instantiated);
  bool found = false;
  for (const auto& p : m->named_parameters())
    if (p.key() == "paligemma_with_expert.gemma_expert.model.layers.0.mlp.up_proj.weight")
      found = p.value().sizes() == torch::IntArrayRef({88, 40});
  CHECK(found);

  // The resolved config keeps the map and reads back to the same model.
  const auto again = config::parse_config(config::to_yaml(cfg), "dump");
  CHECK(YAML::Dump(config::to_yaml(again)) == YAML::Dump(config::to_yaml(cfg)));
  CHECK(model::options_from_config(again.model).action_expert.mlp_dim == 88);
  // --set works on the map form too.
  CHECK(parse(kExplicit, {"model.action_expert_variant.mlp_dim=96"}).model.action_expert_variant.mlp_dim == 96);
  CHECK(parse(kExplicit, {"model.action_expert_variant=dummy"}).model.action_expert_variant.variant == "dummy");
}

TEST_CASE("explicit model dimensions: one-line errors naming the key", "[unit][config][model]") {
  REQUIRE_THROWS_WITH(parse(kExplicit, {"model.action_expert_variant.widht=40"}),
                      Contains("unknown key 'model.action_expert_variant.widht' (did you mean "
                               "'model.action_expert_variant.width'?)"));
  REQUIRE_THROWS_WITH(parse("model: {action_expert_variant: {width: 40, depth: 4}}"),
                      Contains("run.yaml: model.action_expert_variant.mlp_dim is missing (explicit dimensions need all "
                               "of width, depth, mlp_dim, num_heads, num_kv_heads, head_dim)"));
  REQUIRE_THROWS_WITH(parse(kExplicit, {"model.action_expert_variant.mlp_dim=0"}),
                      Contains("model.action_expert_variant.mlp_dim must be > 0 (got 0)"));
  REQUIRE_THROWS_WITH(parse(kExplicit, {"model.action_expert_variant.num_heads=6", "model.action_expert_variant.num_kv_heads=4"}),
                      Contains("model.action_expert_variant.num_heads must be a multiple of num_kv_heads (4) (got 6)"));
  REQUIRE_THROWS_WITH(parse(kExplicit, {"model.siglip_variant.num_heads=5"}),
                      Contains("model.siglip_variant.width must be a multiple of num_heads (5) (got 48)"));
  REQUIRE_THROWS_WITH(parse(kExplicit, {"model.siglip_variant.width=big"}),
                      Contains("model.siglip_variant.width must be an integer (got 'big')"));
  REQUIRE_THROWS_WITH(parse("model: {siglip_variant: [1, 2]}"),
                      Contains("model.siglip_variant must be a variant name or a map of dimensions (got '[1, 2]')"));
  // Joint attention: depth, heads, kv heads and head_dim must match the prefix expert.
  const auto deeper = parse(kExplicit, {"model.action_expert_variant.depth=6"});
  REQUIRE_THROWS_WITH(model::options_from_config(deeper.model),
                      Contains("model.action_expert_variant {width: 40, depth: 6, mlp_dim: 88, num_heads: 8, "
                               "num_kv_heads: 1, head_dim: 16} must have the depth of "
                               "model.paligemma_variant dummy (got 6, expected 4"));
  const auto heads = parse(kExplicit, {"model.action_expert_variant.head_dim=32"});
  REQUIRE_THROWS_WITH(model::options_from_config(heads.model), Contains("must have the head_dim of"));
  REQUIRE_THROWS_AS(model::options_from_config(heads.model), UserError);
  REQUIRE_THROWS_WITH(model::options_from_config(parse("model: {action_expert_variant: gemma_9b}").model),
                      Contains("model.action_expert_variant: unknown Gemma variant 'gemma_9b'"));
}

TEST_CASE("explicit dimensions with LoRA", "[unit][config][model]") {
  const auto cfg = parse(kExplicit, {"model.action_expert_variant.lora_rank=4", "model.action_expert_variant.lora_alpha=8"});
  const auto o = model::options_from_config(cfg.model);
  CHECK(o.action_expert.lora_rank == 4);
  CHECK(o.action_expert.lora_alpha == 8.0);
  REQUIRE_THROWS_WITH(parse(kExplicit, {"model.action_expert_variant.lora_rank=4"}),
                      Contains("model.action_expert_variant.lora_alpha must be > 0 when lora_rank > 0 (got 0)"));
}
