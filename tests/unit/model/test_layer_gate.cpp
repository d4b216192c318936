// The model's layer gate (model/layer_gate.h): train.offload's next forward waits there for each layer's weights, so
// it must be called once per layer, in the forward's order, before the layer runs — and never by a recomputation in
// backward, when the weights have long been in place (a wait there would be for the *next* update: a deadlock).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "pi0/model/pi0.h"
#include "support/test_support.h"

using namespace pi0;
using namespace pi0::model;

TEST_CASE("the layer gate is called once per layer in the forward's order, not in recomputation",
          "[unit][model]") {
  for (const bool checkpointing : {false, true}) {
    auto o = dummy_options(/*pi05=*/true);
    Pi0 model(o);
    model->set_gradient_checkpointing(checkpointing);
    std::vector<std::string> calls;
    auto name = [](LayerStack stack, int64_t layer) {
      return (stack == LayerStack::kVision ? "vision " : "joint ") + std::to_string(layer);
    };
    model->set_layer_gate([&](LayerStack stack, int64_t layer) { calls.push_back(name(stack, layer)); });
    auto obs = testing::random_observation(o, 2);
    auto actions = torch::randn({2, o.action_horizon, o.action_dim});
    auto noise = torch::randn_like(actions);
    auto time = torch::tensor({0.3f, 0.7f});
    model->compute_loss(obs, actions, noise, time).mean().backward();
    INFO("checkpointing " << checkpointing);
    std::vector<std::string> expected;
    for (int64_t l = 0; l < o.siglip.depth; ++l) expected.push_back(name(LayerStack::kVision, l));
    for (int64_t l = 0; l < o.paligemma.depth; ++l) expected.push_back(name(LayerStack::kJoint, l));
    // One image per camera goes through SigLIP in one batch, so each vision layer is gated once per forward.
    CHECK(calls == expected);

    // Sampling (the prefix pass, then the suffix-only denoising passes with the cache) gates every pass's layers.
    calls.clear();
    {
      torch::NoGradGuard no_grad;
      model->sample_actions(obs, std::nullopt, 2);
    }
    CHECK(calls.size() == static_cast<size_t>(o.siglip.depth + 3 * o.paligemma.depth));

    // Cleared: no calls.
    model->set_layer_gate({});
    calls.clear();
    model->compute_loss(obs, actions, noise, time);
    CHECK(calls.empty());
  }
}

TEST_CASE("a layer gate that changes the layer's weights changes that forward", "[unit][model]") {
  // What train.offload relies on: whatever the gate waits for (the weights landing) happens before the layer reads
  // them. Here the gate itself writes the weights of the layer it is called for.
  auto o = dummy_options(/*pi05=*/false);
  Pi0 model(o);
  auto obs = testing::random_observation(o, 2);
  auto actions = torch::randn({2, o.action_horizon, o.action_dim});
  auto noise = torch::randn_like(actions);
  auto time = torch::tensor({0.3f, 0.7f});
  torch::NoGradGuard no_grad;
  const auto before = model->compute_loss(obs, actions, noise, time);
  auto& last = model->paligemma_with_expert->expert->layers[static_cast<size_t>(o.action_expert.depth - 1)];
  model->set_layer_gate([&](LayerStack stack, int64_t layer) {
    if (stack == LayerStack::kJoint && layer + 1 == o.action_expert.depth)
      for (auto& p : last->parameters()) p.mul_(0.5);
  });
  const auto gated = model->compute_loss(obs, actions, noise, time);
  model->set_layer_gate({});
  const auto after = model->compute_loss(obs, actions, noise, time);
  CHECK_FALSE(torch::equal(before, gated));
  CHECK(torch::equal(gated, after));  // the gate's change is what the gated forward read
}
