// FLOP counts (flops.h) against a hand computation for the dummy model: batch 2, two 28×28 cameras.
// Dummy sizes: SigLIP tiny/14 (width 32, depth 2, mlp 64, 2 heads of 16, 4 patches per image); Gemma "dummy"
// for both experts (width 64, depth 4, mlp 128, 8 query heads and 1 kv head of 16); A = 8, H = 4, L = 6.
#include <catch2/catch.hpp>

#include "pi0/model/flops.h"

using namespace pi0::model;

namespace {
// Per-token Gemma layer projections: q 64→128, k and v 64→16, o 128→64, gate and up 64→128, down 128→64.
constexpr int64_t kGemmaLayerPerToken = 2 * (64 * 128 + 2 * 64 * 16 + 128 * 64 + 3 * 64 * 128);  // 86016
// 4 images × 4 patches = 16 rows; conv over 3·14·14 = 588 inputs; per block q/k/v/out, logits + PV, fc1 + fc2.
constexpr int64_t kVision = 2 * 16 * 32 * 588 +
                            2 * (4 * 2 * 16 * 32 * 32 + 2 * (2 * 4 * 2 * 4 * 4 * 16) + 2 * 2 * 16 * 32 * 64);
constexpr int64_t kProjector = 2 * 16 * 32 * 64;
// Prefix: Tp = 2·4 + 6 = 14 tokens per sample → 28 rows, 4 layers.
constexpr int64_t kPrefix = 4 * 28 * kGemmaLayerPerToken;
}  // namespace

TEST_CASE("training_step_flops matches a hand count for dummy pi0", "[unit][model]") {
  // Suffix: state + 4 actions = 5 tokens → 10 rows; joint attention over T = 19 with 8 heads of 16.
  const int64_t suffix = 4 * 10 * kGemmaLayerPerToken;
  const int64_t attention = 4 * 2 * (2 * 2 * 8 * 19 * 19 * 16);
  // action_in / action_out (8 rows, 8↔64), state_proj (2 rows), action_time_mlp in 128→64 and out 64→64.
  const int64_t io = 2 * (2 * 8 * 8 * 64) + 2 * 2 * 8 * 64 + 2 * 8 * 128 * 64 + 2 * 8 * 64 * 64;
  const auto o = dummy_options(false);
  const auto f = forward_flops(o, 2, 2);
  CHECK(f.vision == kVision);
  CHECK(f.projector == kProjector);
  CHECK(f.prefix_linear == kPrefix);
  CHECK(f.suffix_linear == suffix);
  CHECK(f.attention == attention);
  CHECK(f.action_io == io);
  const int64_t forward = kVision + kProjector + kPrefix + suffix + attention + io;
  CHECK(forward == 15976448);
  CHECK(training_step_flops(o, 2, 2) == 3 * forward);

  // Sampling, 10 steps. With the cache: prefix pass over 14×14, then suffix passes with 5 queries × 19 keys.
  const int64_t once = kVision + kProjector;
  const int64_t cached = once + kPrefix + 4 * 2 * (2 * 2 * 8 * 14 * 14 * 16) +
                         10 * (suffix + io + 4 * 2 * (2 * 2 * 8 * 5 * 19 * 16));
  CHECK(sampling_flops(o, 2, 2, 10, true) == cached);
  CHECK(sampling_flops(o, 2, 2, 10, false) == once + 10 * (kPrefix + suffix + attention + io));
}

TEST_CASE("training_step_flops matches a hand count for dummy pi0.5", "[unit][model]") {
  // No state token: Ts = 4 → 8 rows, T = 18; adaRMS on 2·4 + 1 = 9 norms maps cond 64 → 192 for 2 rows.
  const int64_t suffix = 4 * 8 * kGemmaLayerPerToken + 9 * (2 * 2 * 64 * 192);
  const int64_t attention = 4 * 2 * (2 * 2 * 8 * 18 * 18 * 16);
  const int64_t io = 2 * (2 * 8 * 8 * 64) + 2 * (2 * 2 * 64 * 64);  // action in/out, time_mlp in/out
  const auto o = dummy_options(true);
  const auto f = forward_flops(o, 2, 2);
  CHECK(f.suffix_linear == suffix);
  CHECK(f.attention == attention);
  CHECK(f.action_io == io);
  CHECK(training_step_flops(o, 2, 2) == 3 * (kVision + kProjector + kPrefix + suffix + attention + io));
  CHECK(training_step_flops(o, 2, 2) == 46239744);
}

TEST_CASE("LoRA adds its low-rank products to the Gemma projections", "[unit][model]") {
  auto o = dummy_options(false);
  const int64_t base = forward_flops(o, 1, 1).prefix_linear;
  o.paligemma.lora_rank = 2;
  // Per token and layer: 2·r·(in + out) for q, k, v, o, gate, up, down; prefix Tp = 4 + 6 = 10 tokens.
  const int64_t lora = 2 * 2 * ((64 + 128) + 2 * (64 + 16) + (128 + 64) + 3 * (64 + 128));
  CHECK(forward_flops(o, 1, 1).prefix_linear == base + 4 * 10 * lora);
}
