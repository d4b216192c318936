// Joint attention: the SDPA path (LibTorch >= 2.1) against the explicit reference path, in float32 on the CPU
// (the same dispatch runs on CUDA; tests/integration/test_cuda.cpp covers it there).
#include <catch2/catch.hpp>

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
