// A frozen prefix expert (train.freeze=action-expert-only: SigLIP, the projector, the embedding and PaliGemma's layers
// frozen) records no graph (PaliGemmaWithExpertImpl::layer_forward cuts the prefix rows of the joint attention's
// output from it), so the step keeps what the plan says (model::GradientReach{vision: false, prefix: false}), and the
// gradients of what trains are bit-identical to those of a full fine-tune of the same weights.
#include <catch2/catch.hpp>

#include "pi0/config/config.h"
#include "pi0/model/activation_memory.h"
#include "pi0/model/model_config.h"
#include "pi0/train/freeze.h"
#include "support/counting_allocator.h"
#include "support/test_support.h"

using namespace pi0;

TEST_CASE("frozen prefix expert: nothing of the prefix is kept for backward and the expert gradients are bit-identical",
          "[unit][model]") {
  for (const std::string type : {"pi05", "pi0"}) {
    for (const bool checkpointing : {false, true}) {
      INFO(type << (checkpointing ? " checkpointed" : ""));
      const auto cfg = config::load_config(std::string(PI0_SOURCE_DIR) + "/configs/debug.yaml", {"model.type=" + type});
      const auto o = model::options_from_config(cfg.model);
      constexpr int64_t kBatch = 3, kCameras = 3;
      torch::manual_seed(5);
      const auto obs = testing::random_observation(o, kBatch, kCameras, /*pad=*/3);
      const auto actions = torch::randn({kBatch, o.action_horizon, o.action_dim});
      const auto noise = torch::randn_like(actions);
      const auto time = torch::rand({kBatch}) * 0.9 + 0.05;
      struct Step {
        int64_t held = 0;  // bytes kept for backward at the end of the forward pass
        std::map<std::string, torch::Tensor> grads;
      };
      const auto step = [&](const std::string& preset) {
        torch::manual_seed(9);
        model::Pi0 net(o);
        train::apply_freeze(*net, preset);
        if (checkpointing) net->set_gradient_checkpointing(true);
        Step s;
        torch::Tensor loss;
        {
          testing::PeakAllocation counted;
          loss = net->compute_loss(obs, actions, noise, time).mean();
          s.held = counted.held();
        }
        loss.backward();
        for (const auto& p : net->named_parameters())
          if (p.value().grad().defined()) s.grads[p.key()] = p.value().grad();
        return s;
      };
      const auto full = step("full"), frozen = step("action-expert-only");
      // What trains gets the full fine-tune's gradients, bit for bit; nothing else gets one.
      REQUIRE(!frozen.grads.empty());
      for (const auto& [name, g] : frozen.grads) {
        INFO(name);
        CHECK(name.find("language_model") == std::string::npos);
        CHECK(name.find("vision_tower") == std::string::npos);
        CHECK(torch::equal(g, full.grads.at(name)));
      }
      // The forward pass keeps what the plan says it saves: SigLIP's and the prefix expert's tensors (the difference
      // of the two plans against that of the two allocations). Without checkpointing only: with it the plan's figure
      // is a moment of backward (a layer recomputed), not the end of the forward pass.
      if (checkpointing) continue;
      const auto all = model::activation_memory(o, kBatch, kCameras, 4, checkpointing);
      const auto planned = model::activation_memory(o, kBatch, kCameras, 4, checkpointing, {}, {false, false});
      const double saved_planned = static_cast<double>(all.saved - planned.saved);
      const double saved_measured = static_cast<double>(full.held - frozen.held);
      INFO("kept: full " << full.held / 1e6 << " MB, frozen prefix " << frozen.held / 1e6 << " MB; saved "
                         << saved_measured / 1e6 << " MB measured, " << saved_planned / 1e6 << " MB planned");
      CHECK(std::abs(saved_measured - saved_planned) <= 0.15 * saved_planned);
    }
  }
}
