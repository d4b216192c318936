// Joint attention: the SDPA path (LibTorch >= 2.1) against the explicit reference path, in float32 on the CPU
// (the same dispatch runs on CUDA; tests/integration/test_cuda.cpp covers it there), and both in bf16 against the
// exact attention of the same inputs at a long key length.
#include <catch2/catch.hpp>

#include <cmath>

#include "pi0/common/check.h"
#include "pi0/model/pi0.h"
#include "pi0/nn/attention_mask.h"
#include "support/skip.h"
#include "support/test_support.h"

using namespace pi0;
using namespace pi0::model;

TEST_CASE("attention_bias: 0 where allowed, the reference's finite mask value elsewhere", "[unit][model]") {
  auto mask = torch::tensor({true, false, true, true}, torch::kBool).view({1, 2, 2});
  auto bias = attention_bias(mask, torch::kFloat32);
  REQUIRE(bias.sizes() == torch::IntArrayRef({1, 1, 2, 2}));
  CHECK(bias[0][0][0][0].item<float>() == 0.0f);
  CHECK(bias[0][0][0][1].item<float>() == static_cast<float>(nn::kMaskValue));
  CHECK(std::isfinite(bias.min().item<float>()));
}

TEST_CASE("model.attention names are checked", "[unit][model]") {
  CHECK(parse_attention_impl("explicit", "model.attention") == AttentionImpl::kExplicit);
  CHECK(parse_attention_impl("auto", "model.attention") == AttentionImpl::kAuto);
  CHECK_THROWS_WITH(parse_attention_impl("flash", "model.attention"),
                    "model.attention must be auto, explicit or sdpa (got 'flash')");
  if (sdpa_available()) {
    CHECK(parse_attention_impl("sdpa", "model.attention") == AttentionImpl::kSdpa);
  } else {
    CHECK_THROWS_AS(parse_attention_impl("sdpa", "model.attention"), UserError);
  }
}

TEST_CASE("SDPA attention equals the explicit path (loss, gradients and sampling within 1e-5 in float32)", "[unit][model]") {
  if (!sdpa_available()) {
    testing::skip("LibTorch " TORCH_VERSION " has no scaled_dot_product_attention with a scale (needs >= 2.1)");
    return;
  }
  for (bool pi05 : {false, true}) {
    INFO("pi05=" << pi05);
    torch::manual_seed(3);
    auto o = dummy_options(pi05);
    o.paligemma.num_kv_heads = o.action_expert.num_kv_heads = 2;  // grouped-query: 8 query heads over 2 kv heads
    Pi0 model(o);
    auto obs = testing::random_observation(o, 2, 2, /*pad=*/2);
    obs.image_masks[1][1] = false;  // a masked camera: fully masked query rows must not turn into NaN
    auto actions = torch::randn({2, o.action_horizon, o.action_dim});
    auto noise = torch::randn_like(actions);
    auto time = torch::tensor({0.3f, 0.8f});
    auto run = [&](AttentionImpl impl) {
      model->set_attention_impl(impl);
      model->zero_grad();
      auto loss = model->compute_loss(obs, actions, noise, time);
      loss.mean().backward();
      std::vector<torch::Tensor> grads;
      for (auto& p : model->parameters()) grads.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
      auto sampled = model->sample_actions(obs, noise, 4);
      return std::make_tuple(loss.detach(), grads, sampled);
    };
    auto [loss_e, grads_e, sample_e] = run(AttentionImpl::kExplicit);
    auto [loss_s, grads_s, sample_s] = run(AttentionImpl::kSdpa);
    CHECK(torch::isfinite(loss_s).all().item<bool>());
    CHECK(testing::max_rel_error(loss_s, loss_e) < 1e-5);
    CHECK(testing::max_rel_error(sample_s, sample_e) < 1e-5);
    double worst = 0;
    for (size_t i = 0; i < grads_e.size(); ++i)
      if (grads_e[i].abs().max().item<double>() > 0) worst = std::max(worst, testing::max_rel_error(grads_s[i], grads_e[i]));
    CHECK(worst < 1e-4);
  }
}

// bf16 attention on the CPU sums in float32 (nn/matmul.h): one query row attending to S = 4096 keys, against the
// exact softmax attention of the same bf16 inputs. Positive q, k, v and logits l ≤ L keep every step's error
// relative: Q·Kᵀ is within u + γ_D of each logit (D = 16 terms, rounded to bf16), which moves each probability by at
// most 2L(u + γ_D) relative after normalization; the probabilities are rounded to bf16 (u); P·V sums S terms in
// float32 (γ_S) and rounds once (u). Bound: 2L(u + γ_D) + 2u + 2γ_S (the softmax's own float32 sums within γ_S),
// with u = 2⁻⁸ and γ_n = n·2⁻²⁴/(1 − n·2⁻²⁴). A bf16-summing P·V kernel misses it by 100x at this S.
TEST_CASE("bf16 joint attention on the CPU: explicit and SDPA paths within the float32-accumulation bound",
          "[unit][model]") {
  torch::manual_seed(4);
  const int64_t s = 4096, d = 16;
  auto positive = [](torch::IntArrayRef sizes, double scale) {
    return ((torch::rand(sizes, torch::kFloat64) + 0.25) * scale).to(torch::kBFloat16);
  };
  const auto q = positive({1, 2, 1, d}, 0.25), k = positive({1, s, 1, d}, 0.25), v = positive({1, s, 1, d}, 1.0);
  const auto f64 = [](const torch::Tensor& t) { return t.to(torch::kFloat64); };
  const auto logits = torch::einsum("btnd,bsnd->bnts", {f64(q), f64(k)});
  const auto exact = torch::einsum("bnts,bsnd->btnd", {torch::softmax(logits, -1), f64(v)}).reshape({1, 2, d});
  const double big_l = logits.abs().max().item<double>();
  auto gamma = [](double n) { return n * std::ldexp(1.0, -24) / (1 - n * std::ldexp(1.0, -24)); };
  const double u = std::ldexp(1.0, -8);
  const double bound = 2 * big_l * (u + gamma(d)) + 2 * u + 2 * gamma(s);
  const auto mask = torch::ones({1, 2, s}, torch::kBool);
  auto rel = [&](const torch::Tensor& got) { return ((f64(got) - exact).abs() / exact).max().item<double>(); };
  INFO("L = " << big_l << ", bound " << bound);
  const double explicit_err = rel(joint_attention(q, k, v, mask));
  CHECK(explicit_err <= bound);
  if (sdpa_available()) {
    const double sdpa_err = rel(joint_attention(q, k, v, attention_bias(mask, torch::kBFloat16)));
    INFO("explicit " << explicit_err << ", SDPA " << sdpa_err);
    CHECK(sdpa_err <= bound);
  }
}
