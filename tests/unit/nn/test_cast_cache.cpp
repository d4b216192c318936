// Dense's cast cache: one bf16 copy of a float32 master weight per optimizer step, reused by checkpointed
// recomputation, with gradients still reaching the master weight and no stale copy after an update.
#include <catch2/catch.hpp>

#include "pi0/model/pi0.h"
#include "pi0/nn/dense.h"
#include "pi0/nn/matmul.h"
#include "support/test_support.h"

using namespace pi0;

TEST_CASE("cast cache: one copy while the weight is unchanged, a fresh one after an in-place update", "[unit][nn]") {
  torch::manual_seed(0);
  nn::Dense d(8, 4);
  auto x = torch::randn({3, 8}).to(torch::kBFloat16);
  auto y1 = d->forward(x);
  const void* first = d->cast_w.value.data_ptr();
  REQUIRE(d->cast_w.value.scalar_type() == torch::kBFloat16);
  auto y2 = d->forward(x);
  CHECK(d->cast_w.value.data_ptr() == first);  // reused, not re-cast
  CHECK(torch::equal(y1, y2));
  {
    torch::NoGradGuard no_grad;
    d->weight.add_(1.0);  // what the optimizer does
  }
  auto y3 = d->forward(x);
  CHECK(d->cast_w.value.data_ptr() != first);
  auto expected = nn::linear(x, d->weight.to(torch::kBFloat16), d->bias.to(torch::kBFloat16));
  CHECK(torch::equal(y3, expected));
  nn::clear_cast_cache(*d);
  CHECK(!d->cast_w.value.defined());
}

TEST_CASE("cast cache: gradients reach the float32 master weight, also from a copy made under no_grad", "[unit][nn]") {
  torch::manual_seed(1);
  nn::Dense d(8, 4);
  auto x = torch::randn({3, 8}).to(torch::kBFloat16);
  {
    torch::NoGradGuard no_grad;  // as a checkpointed layer's first forward
    d->forward(x);
  }
  d->forward(x).to(torch::kFloat32).sum().backward();
  REQUIRE(d->weight.grad().defined());
  auto cached_grad = d->weight.grad().clone();
  d->zero_grad();
  nn::set_cast_cache(*d, false);
  d->forward(x).to(torch::kFloat32).sum().backward();
  CHECK(torch::equal(cached_grad, d->weight.grad()));
}

TEST_CASE("cast cache + gradient checkpointing in bf16: same loss and gradients as without the cache", "[unit][nn]") {
  for (bool pi05 : {false, true}) {
    INFO("pi05=" << pi05);
    torch::manual_seed(5);
    auto o = model::dummy_options(pi05);
    model::Pi0 model(o);
    model->set_compute_dtype(torch::kBFloat16);
    model->set_gradient_checkpointing(true);
    auto obs = testing::random_observation(o, 2);
    auto actions = torch::randn({2, o.action_horizon, o.action_dim});
    auto noise = torch::randn_like(actions);
    auto time = torch::tensor({0.2f, 0.7f});
    auto run = [&](bool cache) {
      nn::set_cast_cache(*model, cache);
      model->zero_grad();
      auto loss = model->compute_loss(obs, actions, noise, time).mean();
      loss.backward();
      std::vector<torch::Tensor> grads;
      for (auto& p : model->parameters()) grads.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
      return std::make_pair(loss.item<double>(), grads);
    };
    auto [loss_off, grads_off] = run(false);
    auto [loss_on, grads_on] = run(true);
    CHECK(loss_on == loss_off);
    size_t compared = 0;
    for (size_t i = 0; i < grads_off.size(); ++i) {
      REQUIRE(grads_on[i].defined() == grads_off[i].defined());
      if (!grads_off[i].defined()) continue;
      CHECK(torch::equal(grads_on[i], grads_off[i]));
      ++compared;
    }
    // All but the parameters that feed only the prefix expert's unused output: its final norm and, in the last
    // layer, o_proj, the pre-FFW norm and the three MLP projections (checkpointing does not differentiate them).
    CHECK(compared + 6 == grads_off.size());
  }
}
