// Freezing presets: trainable counts on the tiny model (instantiated model and layout agree), exact full-size
// counts through the layout path, include/exclude regexes, memory model, error messages.
#include <catch2/catch.hpp>

#include <map>

#include "pi0/common/check.h"
#include "pi0/common/strings.h"
#include "pi0/model/param_layout.h"
#include "pi0/model/pi0.h"
#include "pi0/common/strings.h"
#include "pi0/train/freeze.h"
#include "pi0/train/placement.h"

using namespace pi0;
using namespace pi0::train;
using Catch::Matchers::Contains;

namespace {
model::Pi0Options lora_options(bool pi05) {
  auto o = model::dummy_options(pi05);
  o.paligemma.lora_rank = 2, o.paligemma.lora_alpha = 2;
  o.action_expert.lora_rank = 3, o.action_expert.lora_alpha = 3;
  return o;
}
std::map<std::string, int64_t> component_totals(const std::vector<model::ParamSpec>& layout) {
  std::map<std::string, int64_t> t;
  for (const auto& p : layout) t[model::component_of(p.name)] += p.numel();
  return t;
}
int64_t trainable_count(const std::vector<model::ParamSpec>& layout, const std::string& preset) {
  return breakdown(layout, trainable_mask(names_of(layout), preset), "float32", false).total.trainable;
}
}  // namespace

TEST_CASE("freeze presets: instantiated model and layout agree, counts per component", "[unit][train]") {
  for (bool pi05 : {false, true}) {
    auto o = lora_options(pi05);
    model::Pi0 net(o);
    const auto layout = model::parameter_layout(o);
    auto c = component_totals(layout);
    const int64_t all = c["vision"] + c["language"] + c["embedding"] + c["action_expert"] + c["projections"] + c["lora"];
    // LoRA factors adapting each expert, so the expected counts below can include them where the preset does.
    int64_t lora_lang = 0, lora_expert = 0;
    for (const auto& p : layout)
      if (model::component_of(p.name) == "lora")
        (p.name.rfind(model::kExpertPrefix, 0) == 0 ? lora_expert : lora_lang) += p.numel();
    REQUIRE(lora_lang > 0);
    REQUIRE(lora_expert > 0);
    const std::map<std::string, int64_t> expected = {
        {"full", all},
        {"projection-only", c["projections"]},
        {"+vision", c["projections"] + c["vision"]},
        {"+language", c["projections"] + c["language"] + c["embedding"] + lora_lang},
        {"action-expert-only", c["projections"] + c["action_expert"] + lora_expert},
        {"freeze-vision", all - c["vision"]},
        {"lora", c["lora"] + c["vision"] + c["projections"]},
        {"lora-only", c["lora"]},
    };
    for (const auto& preset : freeze_presets()) {
      INFO("pi05=" << pi05 << " preset " << preset);
      apply_freeze(*net, preset);
      int64_t model_trainable = 0;
      for (const auto& p : net->parameters())
        if (p.requires_grad()) model_trainable += p.numel();
      CHECK(model_trainable == expected.at(preset));
      CHECK(trainable_count(layout, preset) == expected.at(preset));
    }
  }
}

TEST_CASE("full-size counts through the layout path", "[unit][train]") {
  const auto pi0 = model::parameter_layout(model::pi0_options(false));
  const auto pi05 = model::parameter_layout(model::pi0_options(true));
  auto b = breakdown(pi0, trainable_mask(names_of(pi0), "full"), "float32", false);
  CHECK(b.total.total == 3238048528LL);
  CHECK(b.total.trainable == 3238048528LL);
  CHECK(breakdown(pi05, trainable_mask(names_of(pi05), "full"), "float32", false).total.total == 3353433872LL);
  CHECK(trainable_count(pi0, "projection-only") == 3248160);
  CHECK(trainable_count(pi05, "projection-only") == 2165792);
  CHECK(trainable_count(pi0, "+vision") == 3248160 + 414803696);
  CHECK(trainable_count(pi0, "action-expert-only") == 3248160 + 311464960);
  CHECK(trainable_count(pi05, "action-expert-only") == 2165792 + 427932672);
  CHECK(trainable_count(pi0, "+language") == 3248160 + 2508531712);
  CHECK(trainable_count(pi0, "freeze-vision") == 3238048528LL - 414803696);

  const auto text = format_breakdown(b);
  CHECK_THAT(text, Contains("3,238,048,528"));
  CHECK_THAT(text, Contains("vision"));
  const auto j = breakdown_json(b);
  CHECK(j["total"]["total"].get<int64_t>() == 3238048528LL);
  CHECK(j["vision"]["total"].get<int64_t>() == 414803696);
  CHECK(j["lora"]["total"].get<int64_t>() == 0);
}

TEST_CASE("full-size LoRA preset trains LoRA + SigLIP + projections (openpi) and lora-only just LoRA",
          "[unit][train]") {
  auto o = model::pi0_options(false);
  o.paligemma = model::gemma_variant("gemma_2b_lora");
  o.action_expert = model::gemma_variant("gemma_300m_lora");
  o.action_expert.vocab_size = 0;
  const auto layout = model::parameter_layout(o);
  auto c = component_totals(layout);
  REQUIRE(c["lora"] > 0);
  CHECK(trainable_count(layout, "lora") == c["lora"] + 414803696 + 3248160);
  CHECK(trainable_count(layout, "lora-only") == c["lora"]);
}

TEST_CASE("memory model per precision and EMA", "[unit][train]") {
  const std::vector<model::ParamSpec> layout = {{model::kVisionPrefix + "w", {10}}, {"action_in_proj.weight", {6}}};
  const std::vector<bool> mask = {false, true};
  auto f32 = breakdown(layout, mask, "float32", false).total;
  CHECK(f32.weight_bytes == 16 * 4);
  CHECK(f32.grad_bytes == 6 * 4);
  CHECK(f32.optimizer_bytes == 6 * 8);
  CHECK(f32.ema_bytes == 0);
  auto mixed = breakdown(layout, mask, "bf16-mixed", true).total;
  CHECK(mixed.weight_bytes == 6 * 4 + 10 * 2);
  CHECK(mixed.grad_bytes == 6 * 4);
  CHECK(mixed.optimizer_bytes == 6 * 8);
  CHECK(mixed.ema_bytes == 6 * 4);
  auto bf16 = breakdown(layout, mask, "bf16", false);
  CHECK(bf16.total.weight_bytes == 16 * 2);
  CHECK(bf16.total.optimizer_bytes == 6 * 4);
  CHECK(bf16.components[0].name == "vision");
  CHECK(bf16.components[0].frozen == 10);
  CHECK(bf16.components[4].trainable == 6);
  CHECK(bf16.components[4].trainable_percent() == Approx(100.0));
  CHECK_THROWS_WITH(breakdown(layout, mask, "bf16_mixed", false),
                    Contains("precision 'bf16_mixed' is unknown; valid: float32, bf16-mixed, bf16 (did you mean "
                             "'bf16-mixed'?)"));
}

TEST_CASE("include/exclude regexes on top of a preset", "[unit][train]") {
  const auto layout = model::parameter_layout(model::dummy_options(false));
  const auto names = names_of(layout);
  auto base = trainable_mask(names, "projection-only");
  auto more = trainable_mask(names, "projection-only", {".*vision_tower.*layers\\.0\\..*"}, {"action_out_proj\\..*"});
  for (size_t i = 0; i < names.size(); ++i) {
    INFO(names[i]);
    const bool layer0 = names[i].find("vision_tower.vision_model.encoder.layers.0.") != std::string::npos;
    const bool out_proj = names[i].rfind("action_out_proj.", 0) == 0;
    CHECK(more[i] == ((base[i] || layer0) && !out_proj));
  }
  // Exclude wins over include.
  auto both = trainable_mask(names, "full", {"action_in_proj\\.weight"}, {"action_in_proj\\..*"});
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i].rfind("action_in_proj.", 0) == 0) CHECK_FALSE(both[i]);
  // Full match: a substring is not enough.
  CHECK_THROWS_WITH(trainable_mask(names, "full", {}, {"vision_tower"}),
                    Contains("freeze exclude regex 'vision_tower' matches no parameter name"));
  CHECK_THROWS_WITH(trainable_mask(names, "full", {"(unclosed"}),
                    Contains("freeze include regex '(unclosed' is not a valid regular expression"));
}

TEST_CASE("freeze preset errors", "[unit][train]") {
  const auto names = names_of(model::parameter_layout(model::dummy_options(false)));
  CHECK_THROWS_WITH(trainable_mask(names, "lora_only"),
                    Contains("freeze preset 'lora_only' is unknown; valid presets: full, projection-only, +vision, "
                             "+language, action-expert-only, freeze-vision, lora, lora-only (did you mean "
                             "'lora-only'?)"));
  CHECK_THROWS_WITH(trainable_mask(names, "vision"), Contains("(did you mean '+vision'?)"));
  CHECK_THROWS_WITH(trainable_mask(names, "zzzzzzzzzzzzzzzzzzzz"), !Contains("did you mean"));
  CHECK_THROWS_WITH(trainable_mask(names, "lora"), Contains("freeze preset 'lora' needs LoRA factors"));
  CHECK(pi0::edit_distance("kitten", "sitting") == 3);
  CHECK(with_thousands(3353433872LL) == "3,353,433,872");
  CHECK(with_thousands(999) == "999");
  CHECK(with_thousands(1000) == "1,000");
}
