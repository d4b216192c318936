// Sampling on the simplified weights (model/fused_inference.h) against the modules' own forward, the reference
// path: pi0 and pi0.5, float32 and bf16, batch 2 with a masked camera and padded prompt tokens, LoRA, real-time
// chunking's trained and guided modes, the copy remade when the weights change, and fewer dispatched operations.
// Tolerances: float32 1e-5 relative (the folds reorder float32 products: ~1e-7 per operation, over a few layers and
// 10 steps); bf16 3e-2 (the folds move where bf16 roundings happen: 2^-8 relative each, the same bound as the
// CUDA-against-CPU comparison in test_cuda.cpp).
#include <catch2/catch.hpp>

#include "pi0/common/op_count.h"
#include "pi0/model/fused_inference.h"
#include "pi0/model/pi0.h"
#include "support/perturbed_model.h"
#include "support/test_support.h"

using namespace pi0;
using namespace pi0::model;
using pi0::testing::max_rel_error;

namespace {
struct Case {
  Pi0Options o;
  Pi0 model;
  Observation obs;
  torch::Tensor noise;
  Case(bool pi05, bool lora)
      : o([&] {
          auto o = dummy_options(pi05);
          if (lora) o.paligemma.lora_rank = 2, o.action_expert.lora_rank = 3, o.action_expert.lora_alpha = 6;
          return o;
        }()),
        model(testing::perturbed_model(o)),
        obs(testing::random_observation(o, 2, 3, /*pad=*/2)),
        noise(torch::randn({2, o.action_horizon, o.action_dim})) {
    obs.image_masks[2][1] = false;
  }
  torch::Tensor sample(bool fused, int64_t steps = 10, const RtcRequest* rtc = nullptr) {
    model->set_fused_inference(fused);
    return model->sample_actions(obs, noise, steps, true, nullptr, rtc);
  }
};
}  // namespace

TEST_CASE("simplified weights sample as the modules do: pi0 and pi0.5, float32 and bf16, LoRA",
          "[unit][model][fused]") {
  for (bool pi05 : {false, true}) {
    for (bool lora : {false, true}) {
      torch::manual_seed(11);
      Case c(pi05, lora);
      INFO("pi05=" << pi05 << " lora=" << lora);
      const auto reference = c.sample(false);
      const auto fused = c.sample(true);
      CHECK(max_rel_error(fused, reference) < 1e-5);
      CHECK(max_rel_error(fused, c.noise) > 1e-2);  // the test can fail: sampling moved away from the noise
      c.model->set_compute_dtype(torch::kBFloat16);
      const auto reference_bf16 = c.sample(false);
      const auto fused_bf16 = c.sample(true);
      CHECK(fused_bf16.scalar_type() == torch::kFloat32);
      CHECK(max_rel_error(fused_bf16, reference_bf16) < 3e-2);
      CHECK(max_rel_error(fused_bf16, reference) < 3e-2);
    }
  }
}

TEST_CASE("simplified weights: real-time chunking's trained and guided modes as on the modules",
          "[unit][model][fused][rtc]") {
  for (bool pi05 : {false, true}) {
    torch::manual_seed(5);
    Case c(pi05, false);
    RtcRequest r;
    r.prev = torch::randn({2, 3, c.o.action_dim});
    r.delay = 2;
    for (auto mode : {RtcMode::kTrained, RtcMode::kGuided}) {
      for (auto jac : {RtcJacobian::kIdentity, RtcJacobian::kExact}) {
        if (mode == RtcMode::kTrained && jac == RtcJacobian::kExact) continue;
        r.mode = mode;
        r.guidance.jacobian = jac;
        INFO("pi05=" << pi05 << " mode=" << to_string(mode) << " jacobian=" << to_string(jac));
        const auto reference = c.sample(false, 10, &r);
        const auto fused = c.sample(true, 10, &r);
        CHECK(max_rel_error(fused, reference) < 1e-5);
        CHECK(max_rel_error(fused, c.sample(true)) > 1e-3);  // continuing the chunk changed the answer
      }
    }
  }
}

TEST_CASE("simplified weights are remade when the weights change, and follow the compute dtype",
          "[unit][model][fused]") {
  torch::manual_seed(2);
  Case c(false, false);
  const auto before = c.sample(true);
  {
    torch::NoGradGuard ng;
    for (auto& p : c.model->parameters()) p.mul_(1.05);  // in place: same storage, a new version
  }
  const auto after = c.sample(true);
  CHECK(max_rel_error(after, before) > 1e-3);
  CHECK(max_rel_error(after, c.sample(false)) < 1e-5);
  // A 2-step schedule next to the 10-step one: each its own time branches.
  CHECK(max_rel_error(c.sample(true, 2), c.sample(false, 2)) < 1e-5);
}

TEST_CASE("the simplified pass dispatches fewer operations than the modules' forward", "[unit][model][fused]") {
  // Operations of the prefix pass and of one denoise step, from a 1-step and a 2-step call (common/op_count.h):
  // the device-free proxy for kernel launches.
  for (bool pi05 : {false, true}) {
    torch::manual_seed(4);
    Case c(pi05, false);
    const auto count = [&](bool fused, int64_t steps) {
      c.model->set_fused_inference(fused);
      c.model->sample_actions(c.obs, c.noise, steps);  // made outside the count: the copy is made once, not per call
      OpCounter counter;
      c.model->sample_actions(c.obs, c.noise, steps);
      return counter.count();
    };
    const auto ref1 = count(false, 1), ref2 = count(false, 2), fused1 = count(true, 1), fused2 = count(true, 2);
    const int64_t ref_step = ref2.top - ref1.top, fused_step = fused2.top - fused1.top;
    const int64_t ref_prefix = ref1.top - ref_step, fused_prefix = fused1.top - fused_step;
    const int64_t depth = c.o.action_expert.depth;
    INFO("pi05=" << pi05 << " per step " << fused_step << " (modules " << ref_step << "), prefix " << fused_prefix
                 << " (modules " << ref_prefix << ")");
    // Per layer and step, the folds remove at least the norm scales (2 × 3 operations), two projections, one RoPE
    // (9 → 5 operations, one instead of two) and the mask: a bound that fails if any of them regresses.
    CHECK(fused_step <= ref_step - 15 * depth);
    CHECK(fused_prefix < ref_prefix);
  }
}

TEST_CASE("grouped attention (bias + q·kᵀ, softmax, ·v per kv head) equals joint attention's explicit path",
          "[unit][model][fused]") {
  // float32: the same products and softmax, summed in another order (1e-6). pi0's grouping: 8 query heads on 1 kv
  // head; and 4 on 2. A padded key column and the causal block of the suffix come from the mask.
  torch::manual_seed(9);
  for (int64_t kv : {1, 2}) {
    const int64_t b = 2, t = 5, s = 12, n = 8, d = 16, g = n / kv;
    const auto q = torch::randn({b, t, n, d}) * 0.25, k = torch::randn({b, s, kv, d}), v = torch::randn({b, s, kv, d});
    auto mask = torch::rand({b, t, s}) > 0.3;
    mask.select(2, 0).fill_(true);  // every query sees at least one key
    mask[1].select(1, 4).fill_(false);  // a padded key for the second example
    const auto bias = attention_bias(mask, torch::kFloat32);  // [B,1,T,S]
    const auto grouped = bias.view({b, 1, 1, t, s}).expand({b, kv, g, t, s}).reshape({b * kv, g * t, s});
    INFO("kv heads " << kv);
    CHECK(max_rel_error(grouped_attention(q, k, v, grouped), joint_attention(q, k, v, mask)) < 1e-6);
  }
}
