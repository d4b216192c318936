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
    // pi0's state token runs through the expert once per call, counted with the prefix: compare whole calls there.
    if (pi05) CHECK(fused_prefix < ref_prefix);
    CHECK(fused_prefix + 10 * fused_step < ref_prefix + 10 * ref_step);
  }
}

TEST_CASE("grouped attention (q·kᵀ, masked softmax, ·v per kv head) equals joint attention's explicit path",
          "[unit][model][fused]") {
  // float32: the same products and softmax, summed in another order (1e-6). pi0's grouping: 8 query heads on 1 kv
  // head; and 4 on 2. Keys and values as the K/V buffer holds them (strided views, keys then values per row). A
  // padded key column and the causal block of the suffix come from the mask.
  torch::manual_seed(9);
  for (int64_t kv : {1, 2}) {
    const int64_t b = 2, t = 5, s = 12, n = 8, d = 16, g = n / kv;
    const auto q = torch::randn({b, t, n, d}) * 0.25;
    const auto buf = torch::randn({b, s + 3, 2 * kv, d});  // 3 rows no pass reads
    const auto k = buf.narrow(1, 0, s).narrow(2, 0, kv), v = buf.narrow(1, 0, s).narrow(2, kv, kv);
    auto mask = torch::rand({b, t, s}) > 0.3;
    mask.select(2, 0).fill_(true);  // every query sees at least one key
    mask[1].select(1, 4).fill_(false);  // a padded key for the second example
    INFO("kv heads " << kv);
    const auto q_grouped = q.view({b, t, kv, g, d}).permute({0, 2, 1, 3, 4});  // [B,K,T,G,D]
    const auto out = grouped_attention(q_grouped, k, v, grouped_mask(mask, kv, g));
    CHECK(max_rel_error(out, joint_attention(q, k.contiguous(), v.contiguous(), mask)) < 1e-6);
    // bf16: one rounding of the logits and of the probabilities, as the explicit path (float32 softmax inside).
    const auto bf = [](const torch::Tensor& x) { return x.to(torch::kBFloat16); };
    const auto out_bf16 = grouped_attention(bf(q_grouped), bf(k), bf(v), grouped_mask(mask, kv, g));
    CHECK(max_rel_error(out_bf16, joint_attention(bf(q), bf(k).contiguous(), bf(v).contiguous(), mask)) < 1e-2);
  }
}

TEST_CASE("the simplified pass's kernels per layer", "[unit][model][fused]") {
  // Issue 48's measure: the kernels (common/op_count.h) of one denoise step and of the prefix pass, per layer, on
  // the float32 path (bf16 on the CPU adds the float32 round trips of nn/matmul.h that a GPU does not make). One
  // layer's share is the difference between the 2-step and 1-step calls, minus the step's few operations outside
  // the layers, over the depth; the bound is what LibTorch 1.13 counts (its RMSNorm is 5 operations, 1 from 2.4).
  torch::manual_seed(4);
  for (bool pi05 : {false, true}) {
    Case c(pi05, false);
    c.model->set_fused_inference(true);
    const auto count = [&](int64_t steps) {
      c.model->sample_actions(c.obs, c.noise, steps);
      OpCounter counter;
      c.model->sample_actions(c.obs, c.noise, steps);
      return counter.count().kernels;
    };
    const int64_t step = count(2) - count(1), depth = c.o.action_expert.depth;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    const int64_t rms = 1;
#else
    const int64_t rms = 5;
#endif
    // A state token run in every step would add another pass through every layer and fail the upper bound.
    // pi0: norm, QKV, RoPE scattered into place (1, nn::rope_scatter; ATen's composite: 4), attention 3,
    // O+residual, norm, gate/up, GeGLU (1, nn::geglu; composite: 2), down+residual = 9 + 2 norms.
    // pi0.5: the adaptive norms are norm, modulation, cast (+2 each) and the gated residuals 2 each (+2).
    // On the CPU the attention's masked softmax is masked_fill_ + softmax (+1; CUDA: one _masked_softmax kernel).
    // And GeGLU stays ATen's gelu + product there (+1; CUDA: one nn::geglu kernel).
    const int64_t cpu_only = 2;
    const int64_t per_layer = (pi05 ? 9 + 2 * (rms + 2) + 2 : 9 + 2 * rms) + cpu_only;
    INFO("pi05=" << pi05 << " step kernels " << step << ", depth " << depth);
    CHECK(step <= per_layer * depth + 20);  // + the step's own: action projections, final norm, Euler update
    CHECK(step >= per_layer * depth);
  }
}

TEST_CASE("pi0's state token is computed once per call, not once per step", "[unit][model][fused]") {
  // Its keys and values come from suffix_context, once per call; the kernel count above fails if it ran per step
  // (one more pass through every layer). Here: it is still read, and as the modules read it.
  torch::manual_seed(6);
  Case c(false, false);
  c.model->set_fused_inference(true);
  const auto a = c.sample(true, 3);
  c.obs.state = c.obs.state + 0.5;  // a different state moves the actions (it is read) ...
  const auto b = c.sample(true, 3);
  CHECK(max_rel_error(a, b) > 1e-4);
  CHECK(max_rel_error(b, c.sample(false, 3)) < 1e-5);  // ... as the modules read it
}
