// Issue 47 item 3 from shapes alone: which parts of the model backward reaches under each freeze preset
// (train::gradient_reach), the activations a frozen part no longer keeps, and gradient_checkpointing: auto spending
// what that leaves on recomputing fewer layers, never a frozen one.
#include <catch2/catch.hpp>

#include "pi0/config/config.h"
#include "pi0/model/model_config.h"
#include "pi0/train/memory_plan.h"

using namespace pi0;

namespace {
config::Config lora_config(const std::string& freeze, std::vector<std::string> extra = {}) {
  extra.push_back("train.freeze=" + freeze);
  return config::load_config(std::string(PI0_SOURCE_DIR) + "/configs/pi05_libero_lora.yaml", extra);
}
}  // namespace

TEST_CASE("gradient reach per freeze preset: a frozen SigLIP and a frozen prefix expert keep no activations",
          "[unit][train]") {
  struct Expect {
    const char* preset;
    bool vision, prefix;
  };
  for (const Expect e : {Expect{"full", true, true}, Expect{"lora", true, true}, Expect{"lora-only", false, true},
                         Expect{"freeze-vision", false, true}, Expect{"+vision", true, true},
                         Expect{"action-expert-only", false, false}, Expect{"projection-only", false, false}}) {
    INFO(e.preset);
    const auto cfg = lora_config(e.preset, {"train.batch_size=32"});
    const auto reach = train::gradient_reach(cfg);
    CHECK(reach.vision == e.vision);
    CHECK(reach.prefix == e.prefix);
    // The plan counts that: less kept than the same run with every part reached, exactly as much when all are.
    for (const bool ckpt : {false, true}) {
      auto c = cfg;
      c.train.gradient_checkpointing = ckpt ? "true" : "false";
      const auto plan = train::plan_memory(c);
      const auto everything = model::activation_memory(model::options_from_config(c.model), plan.micro_batch,
                                                       plan.num_cameras, 2, plan.checkpointed);
      if (e.vision && e.prefix) CHECK(plan.activations.saved == everything.saved);
      else CHECK(plan.activations.saved < everything.saved);
    }
  }
  // An include regex reaching into SigLIP makes it reached again.
  CHECK(train::gradient_reach(lora_config("lora-only", {"train.trainable_include=[\".*vision_tower.*layers[.]3[.].*\"]"}))
            .vision);
}

TEST_CASE("gradient_checkpointing auto: a frozen SigLIP is never recomputed and its memory buys fewer recomputed layers",
          "[unit][train]") {
  for (const int64_t card_gib : {24, 40, 80}) {
    CAPTURE(card_gib);
    const auto lora = lora_config("lora", {"train.gradient_checkpointing=auto"});
    const auto lora_only = lora_config("lora-only", {"train.gradient_checkpointing=auto"});
    const auto chosen = train::choose_checkpointed_layers(lora_only, 1, false, card_gib << 30, nullptr);
    const auto with_vision = train::choose_checkpointed_layers(lora, 1, false, card_gib << 30, nullptr);
    CHECK(chosen.vision == 0);
    // Training less keeps less: lora-only recomputes no more joint layers than lora on the same card.
    CHECK(chosen.language <= with_vision.language);
    const auto all = model::all_layers(model::options_from_config(lora_only.model));
    if (chosen.language < all.language) {
      const auto peak = train::plan_rank_memory(lora_only, 1, false)
                            .peak_bytes(train::plan_memory(lora_only, 1, chosen).activations);
      CHECK(peak <= (card_gib << 30) - train::kCardReserveBytes);
    }
  }
}
