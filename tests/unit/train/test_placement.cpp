// The placement table (placement.h): the rule per precision, and that a model built from the table holds exactly
// the bytes the memory plan counts from it (weights, AdamW moments, EMA), parameter by parameter.
#include <catch2/catch.hpp>

#include <map>

#include "pi0/common/check.h"
#include "pi0/model/param_layout.h"
#include "pi0/model/pi0.h"
#include "pi0/train/ema.h"
#include "pi0/train/freeze.h"
#include "pi0/train/optimizer.h"
#include "pi0/train/placement.h"

using namespace pi0;
using namespace pi0::train;

namespace {

model::Pi0Options lora_options(bool pi05) {
  auto o = model::dummy_options(pi05);
  o.paligemma.lora_rank = 2, o.paligemma.lora_alpha = 2;
  o.action_expert.lora_rank = 2, o.action_expert.lora_alpha = 2;
  return o;
}

int64_t state_bytes(const std::map<std::string, torch::Tensor>& state) {
  int64_t n = 0;
  for (const auto& [key, t] : state)
    if (t.dim() > 0) n += t.numel() * static_cast<int64_t>(t.element_size());  // not AdamW's step count
  return n;
}

}  // namespace

TEST_CASE("placement: the rule per precision", "[unit][train]") {
  const auto layout = model::parameter_layout(lora_options(false));
  const auto mask = trainable_mask(names_of(layout), "lora");
  struct Expect {
    std::string precision;
    torch::ScalarType trainable, frozen, compute;
  };
  for (const auto& e : {Expect{"float32", torch::kFloat32, torch::kFloat32, torch::kFloat32},
                        Expect{"bf16-mixed", torch::kFloat32, torch::kBFloat16, torch::kBFloat16},
                        Expect{"bf16", torch::kBFloat16, torch::kBFloat16, torch::kBFloat16}}) {
    for (bool cache : {false, true}) {
      CAPTURE(e.precision, cache);
      const auto table = make_placement(layout, mask, e.precision, true, cache);
      REQUIRE(table.params.size() == layout.size());
      CHECK(table.compute == e.compute);
      CHECK(table.buffers == (e.precision == "bf16" ? torch::kBFloat16 : torch::kFloat32));
      CHECK(table.trainable_mask() == mask);
      int64_t cached = 0;
      for (size_t i = 0; i < layout.size(); ++i) {
        const auto& p = table.params[i];
        CHECK(p.name == layout[i].name);
        CHECK(p.numel == layout[i].numel());
        CHECK(p.storage == (mask[i] ? e.trainable : e.frozen));
        // The projections, time MLPs and adaRMS modulation run in float32 whatever the precision.
        const bool f32_layer = p.name.rfind("action_", 0) == 0 || p.name.rfind("state_proj", 0) == 0 ||
                               p.name.rfind("time_mlp", 0) == 0 || p.name.find("norm.dense.") != std::string::npos;
        CHECK(p.compute == (f32_layer ? torch::kFloat32 : e.compute));
        CHECK(p.residence == Residence::kDevice);
        // A cached cast only where a weight that trains is read in another dtype, and never for norm scales.
        if (p.cast_cached) {
          ++cached;
          CHECK(mask[i]);
          CHECK(p.storage != p.compute);
          CHECK(p.name.find("norm") == std::string::npos);
        }
      }
      // bf16-mixed: float32 weights feeding bf16 layers; bf16: bf16 weights of the layers kept in float32.
      CHECK((cached > 0) == (cache && e.precision != "float32"));
    }
  }
  CHECK_THROWS_WITH(make_placement(layout, mask, "bf16_mixed", false, true),
                    Catch::Matchers::Contains("did you mean 'bf16-mixed'"));
}

TEST_CASE("placement: a model built from the table holds the bytes the plan counts from it", "[unit][train]") {
  for (bool pi05 : {false, true}) {
    for (const std::string precision : {"float32", "bf16-mixed", "bf16"}) {
      for (const std::string preset : {"full", "lora", "projection-only"}) {
        CAPTURE(pi05, precision, preset);
        const auto opts = lora_options(pi05);
        const auto layout = model::parameter_layout(opts);
        const auto table = make_placement(layout, trainable_mask(names_of(layout), preset), precision, true, true);
        torch::manual_seed(0);
        model::Pi0 net(opts);
        // LoRA factors are drawn even when the rest comes from a file: their values must survive (converted).
        std::map<std::string, torch::Tensor> lora_before;
        for (const auto& item : net->named_parameters())
          if (item.key().find(".lora_") != std::string::npos) lora_before[item.key()] = item.value().detach().clone();
        apply_placement(*net, table, /*weights_from_file=*/true);
        CHECK(net->compute_dtype() == table.compute);

        std::map<std::string, int64_t> measured_weights;
        NamedTensors trainable;
        size_t i = 0;
        for (const auto& item : net->named_parameters()) {
          const auto& place = table.params[i++];
          const auto& p = item.value();
          CHECK(p.scalar_type() == place.storage);
          CHECK(p.requires_grad() == place.trainable);
          measured_weights[model::component_of(item.key())] += p.numel() * static_cast<int64_t>(p.element_size());
          if (place.trainable) trainable.emplace_back(item.key(), p);
          if (lora_before.count(item.key()))
            CHECK(torch::equal(p.detach(), lora_before.at(item.key()).to(place.storage)));
        }
        const auto planned = breakdown(table);
        int64_t measured_total = 0;
        for (const auto& c : planned.components) {
          CHECK(measured_weights[c.name] == c.weight_bytes);
          measured_total += measured_weights[c.name];
        }
        CHECK(measured_total == planned.total.weight_bytes);
        // The optimizer and EMA the trainer builds over the trainable parameters.
        AdamW adamw(trainable);
        Ema ema(trainable, 0.99);
        CHECK(state_bytes(adamw.state_dict()) == planned.total.optimizer_bytes);
        CHECK(state_bytes(ema.state_dict()) == planned.total.ema_bytes);
        int64_t grads = 0;
        for (const auto& [name, p] : trainable) grads += p.numel() * static_cast<int64_t>(p.element_size());
        CHECK(grads == planned.total.grad_bytes);
        // The same counts through the old four-argument form (cast cache on).
        const auto again = breakdown(layout, table.trainable_mask(), precision, true);
        CHECK(again.total.memory_bytes() == planned.total.memory_bytes());
      }
    }
  }
}

TEST_CASE("placement: a table of another model is refused", "[unit][train]") {
  const auto other = model::parameter_layout(lora_options(true));
  const auto table = make_placement(other, trainable_mask(names_of(other), "full"), "float32", false, true);
  model::Pi0 net(lora_options(false));
  CHECK_THROWS_WITH(apply_placement(*net, table, false), Catch::Matchers::Contains("apply_placement"));
}
