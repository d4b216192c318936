// Issue 47 item 3: the memory plan counts what a frozen part no longer keeps (model::GradientReach), checked against
// the allocation of real training runs the way test_startup_memory.cpp checks the full fine-tune: LoRA, and the action
// expert alone (SigLIP and the prefix expert frozen: neither keeps anything), with and without checkpointing.
#include <catch2/catch.hpp>

#include "pi0/model/model_config.h"
#include "pi0/train/memory_plan.h"
#include "pi0/train/trainer.h"
#include "support/counting_allocator.h"
#include "support/tiny_run.h"

using namespace pi0;
using pi0::testing::TinyRun;

TEST_CASE("memory plan: frozen parts keep nothing and the predicted peak stays within 10 percent of the allocation",
          "[integration][train]") {
  TinyRun run;
  struct Case {
    const char* freeze;
    bool checkpointing;
  };
  for (const Case c : {Case{"lora", false}, Case{"lora-only", true}, Case{"action-expert-only", false},
                       Case{"action-expert-only", true}}) {
    const std::string name = std::string("frozen_") + c.freeze + (c.checkpointing ? "_ckpt" : "");
    // test_startup_memory's sizes, with LoRA factors on both experts.
    const auto cfg = run.config(name, {"model.paligemma_variant={width: 512, depth: 3, mlp_dim: 2048, num_heads: 8, "
                                       "num_kv_heads: 1, head_dim: 64, lora_rank: 8, lora_alpha: 8}",
                                       "model.action_expert_variant={width: 256, depth: 3, mlp_dim: 1024, num_heads: 8, "
                                       "num_kv_heads: 1, head_dim: 64, lora_rank: 8, lora_alpha: 8}",
                                       "model.siglip_variant={width: 256, depth: 2, mlp_dim: 1024, num_heads: 4, "
                                       "patch_size: 14}",
                                       "model.image_size=112", "train.precision=bf16-mixed",
                                       std::string("train.freeze=") + c.freeze,
                                       std::string("train.gradient_checkpointing=") + (c.checkpointing ? "true" : "false"),
                                       "train.batch_size=4", "train.num_steps=2", "train.ema_decay=0",
                                       "checkpoint.save_interval=1000", "data.prefetch=1"});
    const auto plan = train::plan_memory(cfg);
    // The same plan as if every part were reached: what the frozen parts no longer keep.
    const auto reach = train::gradient_reach(cfg);
    const auto everything = model::activation_memory(model::options_from_config(cfg.model), plan.micro_batch,
                                                     plan.num_cameras, 2, plan.checkpointed);
    int64_t measured = 0;
    {
      testing::PeakAllocation peak;
      train::Trainer t(cfg);
      t.run();
      measured = peak.peak();
    }
    const double predicted = static_cast<double>(plan.peak_bytes());
    INFO(name << ": measured " << measured / 1e6 << " MB, predicted " << predicted / 1e6 << " MB (persistent "
              << plan.params.total.memory_bytes() / 1e6 << " MB, activations " << plan.activations.saved / 1e6 << " + "
              << plan.activations.transient / 1e6 << " MB; " << everything.saved / 1e6
              << " MB kept if every part were reached)");
    CHECK(reach.vision == (std::string(c.freeze) == "lora"));
    CHECK(reach.prefix == (std::string(c.freeze) != "action-expert-only"));  // LoRA factors train in the prefix
    if (!reach.vision || !reach.prefix) CHECK(plan.activations.saved < everything.saved);
    CHECK(std::abs(predicted - static_cast<double>(measured)) <= 0.10 * static_cast<double>(measured));
    WARN(name << ": measured " << measured / 1e6 << " MB, predicted " << predicted / 1e6 << " MB, "
              << everything.saved / 1e6 << " MB of activations if every part were reached against "
              << plan.activations.saved / 1e6);
  }
}
