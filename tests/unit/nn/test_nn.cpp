// Building blocks: RoPE and timestep embedding against hand-computed values, attention masks and positions on
// tabulated cases, adaptive RMSNorm at init and its finite-difference gradient, gradient checkpointing.
#include <catch2/catch.hpp>

#include <cmath>

#include "pi0/nn/attention_mask.h"
#include "pi0/nn/checkpoint.h"
#include "pi0/nn/rms_norm.h"
#include "pi0/nn/rope.h"
#include "support/test_support.h"

using namespace pi0;

namespace {
torch::Tensor bools(std::vector<int> v) {
  auto t = torch::empty({static_cast<int64_t>(v.size())}, torch::kBool);
  for (size_t i = 0; i < v.size(); ++i) t[i] = bool(v[i]);
  return t;
}
torch::Tensor bool_matrix(std::vector<std::vector<int>> rows) {
  std::vector<torch::Tensor> r;
  for (auto& row : rows) r.push_back(bools(row));
  return torch::stack(r);
}
}  // namespace

TEST_CASE("posemb_sincos matches the formula sin(t·2π/period) | cos(...)", "[unit][nn]") {
  auto t = torch::tensor({0.5, 0.001}, torch::kFloat64);
  auto emb = nn::posemb_sincos(t, 6, 4e-3, 4.0);
  REQUIRE(emb.sizes() == torch::IntArrayRef({2, 6}));
  for (int b = 0; b < 2; ++b) {
    const double tv = b == 0 ? 0.5 : 0.001;
    for (int i = 0; i < 3; ++i) {
      const double period = 4e-3 * std::pow(4.0 / 4e-3, i / 2.0);  // linspace(0,1,3) = 0, .5, 1
      const double arg = tv * 2 * M_PI / period;
      CHECK(emb[b][i].item<double>() == Approx(std::sin(arg)).margin(1e-12));
      CHECK(emb[b][i + 3].item<double>() == Approx(std::cos(arg)).margin(1e-12));
    }
  }
  // float32 input gives float32 output (the model's time embedding dtype).
  CHECK(nn::posemb_sincos(torch::ones({1}), 4).scalar_type() == torch::kFloat32);
}

TEST_CASE("RoPE rotates split halves with theta 10000", "[unit][nn]") {
  auto x = torch::tensor({1.0, 2.0, 3.0, 4.0}, torch::kFloat64).view({1, 1, 1, 4});
  auto pos = torch::tensor({3}, torch::kLong).view({1, 1});
  auto y = nn::apply_rope(x, pos).view({4});
  const double a0 = 3.0, a1 = 3.0 / std::pow(10000.0, 0.5);  // θ_i = pos / 10000^(2i/D), D = 4
  CHECK(y[0].item<double>() == Approx(1 * std::cos(a0) - 3 * std::sin(a0)));
  CHECK(y[1].item<double>() == Approx(2 * std::cos(a1) - 4 * std::sin(a1)));
  CHECK(y[2].item<double>() == Approx(3 * std::cos(a0) + 1 * std::sin(a0)));
  CHECK(y[3].item<double>() == Approx(4 * std::cos(a1) + 2 * std::sin(a1)));
  // Position 0 is the identity; bf16 input returns bf16.
  auto z = torch::randn({2, 3, 2, 8});
  CHECK(torch::allclose(nn::apply_rope(z, torch::zeros({2, 3}, torch::kLong)), z));
  CHECK(nn::apply_rope(z.to(torch::kBFloat16), torch::zeros({2, 3}, torch::kLong)).scalar_type() == torch::kBFloat16);
}

TEST_CASE("RoPE as whole-width tables (x·cos + roll(x)·sin) equals the split-half form", "[unit][nn]") {
  // float32 1e-6: the same products, the sum possibly fused; bf16: one rounding of nearly equal values.
  torch::manual_seed(3);
  const auto x = torch::randn({2, 5, 3, 16});
  const auto pos = torch::randint(0, 40, {2, 5}, torch::kLong);
  const auto half = nn::rope_tables(pos, 16, torch::kFloat32);
  const auto full = nn::rotary_tables(half);
  CHECK(testing::max_rel_error(nn::apply_rope(x, full), nn::apply_rope(x, half)) < 1e-6);
  // A strided view (q and k of a stacked projection) rotates like its contiguous copy.
  const auto stacked = torch::randn({2, 5, 4 * 16});
  const auto view = stacked.narrow(-1, 0, 3 * 16).view({2, 5, 3, 16});
  CHECK(testing::max_rel_error(nn::apply_rope(view, full), nn::apply_rope(view.contiguous(), half)) < 1e-6);
  const auto xb = x.to(torch::kBFloat16);
  CHECK(nn::apply_rope(xb, full).scalar_type() == torch::kBFloat16);
  CHECK(testing::max_rel_error(nn::apply_rope(xb, full), nn::apply_rope(xb, half)) < 1e-2);
}

TEST_CASE("RoPE in factors written to several places equals apply_rope, bits included", "[unit][nn]") {
  // The simplified weights' RoPE: bf16 x against float32 tables (mixed-dtype product, no upcast or cast pass), q
  // heads into one tensor and k, v heads into another (v passed through by the identity tables). Same arithmetic as
  // apply_rope's upcast → float32 → one rounding, so bf16 results are bit-equal.
  torch::NoGradGuard no_grad;
  const int64_t b = 2, t = 5, n = 4, kv = 1, d = 16;
  const auto pos = torch::randint(0, 40, {b, t}, torch::kLong);
  const auto half = nn::rope_tables(pos, d, torch::kFloat32);
  const auto tables = nn::rotary_tables(half, n + kv, kv);
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    const auto qkv = torch::randn({b, t, n + 2 * kv, d}).to(dtype);
    const auto f = nn::rope_factors(qkv, tables);
    auto q = torch::empty({b, t, n, d}, qkv.options());
    auto kv_rows = torch::zeros({b, t + 3, 2 * kv, d}, qkv.options()).narrow(1, 2, t);  // rows inside a buffer
    nn::rope_heads(f, 0, n, q);
    nn::rope_heads(f, n, 2 * kv, kv_rows);
    const auto whole = nn::rotary_tables(half);
    INFO("dtype " << dtype);
    CHECK(torch::equal(q, nn::apply_rope(qkv.narrow(2, 0, n), whole)));
    CHECK(torch::equal(kv_rows.narrow(2, 0, kv), nn::apply_rope(qkv.narrow(2, n, kv), whole)));
    CHECK(torch::equal(kv_rows.narrow(2, kv, kv), qkv.narrow(2, n + kv, kv)));  // v unchanged
  }
  // Under autograd the heads come back as a new tensor (out= is not differentiable).
  torch::AutoGradMode grad(true);
  const auto x = torch::randn({b, t, n + 2 * kv, d}, torch::requires_grad());
  auto unused = torch::zeros({b, t, n, d});
  const auto q = nn::rope_heads(nn::rope_factors(x, tables), 0, n, unused);
  CHECK(q.requires_grad());
  CHECK(torch::equal(unused, torch::zeros_like(unused)));
}

TEST_CASE("a pass after a cached prefix gets the rows of the whole sequence's mask and positions", "[unit][nn]") {
  // Prefix: imgA (valid), imgB (camera masked), txt0, txt1 (pad); then state, act0, act1 as one cached-prefix pass.
  const auto prefix = bools({1, 0, 1, 0}).view({1, 4});
  const auto suffix = bools({1, 1, 1}).view({1, 3});
  const auto suffix_ar = bools({1, 1, 0});
  const auto full = nn::make_attn_mask(torch::cat({prefix, suffix}, 1), bools({0, 0, 0, 0, 1, 1, 0}));
  CHECK(torch::equal(nn::make_cached_attn_mask(prefix, suffix, suffix_ar), full.narrow(1, 4, 3)));
  const auto positions = nn::positions_from_mask(torch::cat({prefix, suffix}, 1)).narrow(1, 4, 3);
  CHECK(torch::equal(nn::positions_after(prefix, suffix), positions));
  CHECK(torch::equal(positions, torch::tensor({{2L, 3L, 4L}})));
}

TEST_CASE("attention mask and positions: pi0 layout with a masked camera and a padded token", "[unit][nn]") {
  // tokens: imgA (valid), imgB (camera masked), txt0, txt1 (pad), state, act0, act1
  auto input_mask = bools({1, 0, 1, 0, 1, 1, 1}).view({1, 7});
  auto ar_mask = bools({0, 0, 0, 0, 1, 1, 0});
  auto expected = bool_matrix({{1, 0, 1, 0, 0, 0, 0},
                               {0, 0, 0, 0, 0, 0, 0},
                               {1, 0, 1, 0, 0, 0, 0},
                               {0, 0, 0, 0, 0, 0, 0},
                               {1, 0, 1, 0, 1, 0, 0},
                               {1, 0, 1, 0, 1, 1, 1},
                               {1, 0, 1, 0, 1, 1, 1}});
  CHECK(torch::equal(nn::make_attn_mask(input_mask, ar_mask)[0], expected));
  CHECK(torch::equal(nn::positions_from_mask(input_mask)[0], torch::tensor({0, 0, 1, 1, 2, 3, 4}, torch::kLong)));
}

TEST_CASE("attention mask and positions: pi0.5 layout (actions see prefix and each other)", "[unit][nn]") {
  auto input_mask = bools({1, 0, 1, 0, 1, 1}).view({1, 6});
  auto ar_mask = bools({0, 0, 0, 0, 1, 0});
  auto expected = bool_matrix({{1, 0, 1, 0, 0, 0},
                               {0, 0, 0, 0, 0, 0},
                               {1, 0, 1, 0, 0, 0},
                               {0, 0, 0, 0, 0, 0},
                               {1, 0, 1, 0, 1, 1},
                               {1, 0, 1, 0, 1, 1}});
  CHECK(torch::equal(nn::make_attn_mask(input_mask, ar_mask)[0], expected));
  CHECK(torch::equal(nn::positions_from_mask(input_mask)[0], torch::tensor({0, 0, 1, 1, 2, 3}, torch::kLong)));
  // A [B,T] ar mask gives the same result as the broadcast [T] one.
  CHECK(torch::equal(nn::make_attn_mask(input_mask, ar_mask.view({1, 6})), nn::make_attn_mask(input_mask, ar_mask)));
}

TEST_CASE("adaptive RMSNorm at zero init is plain RMS normalization with gate 0", "[unit][nn]") {
  nn::RMSNorm ada(nn::RMSNormOptions(16).cond_dim(8));
  auto x = torch::randn({2, 5, 16}), cond = torch::randn({2, 8});
  auto [y, gate] = ada->forward(x, cond);
  auto expected = x / torch::sqrt(x.pow(2).mean(-1, true) + 1e-6);
  CHECK(torch::allclose(y, expected, 1e-5, 1e-6));
  REQUIRE(gate.defined());
  CHECK(gate.sizes() == torch::IntArrayRef({2, 1, 16}));
  CHECK(gate.abs().max().item<float>() == 0.0f);
  nn::RMSNorm plain(nn::RMSNormOptions(16));
  auto [y2, g2] = plain->forward(x);
  CHECK(!g2.defined());
  CHECK(torch::allclose(y2, expected, 1e-5, 1e-6));
  // bf16 in → bf16 out, computed in float32.
  CHECK(plain->forward(x.to(torch::kBFloat16)).first.scalar_type() == torch::kBFloat16);
}

TEST_CASE("adaptive RMSNorm gradient matches finite differences (float64)", "[unit][nn]") {
  nn::RMSNorm ada(nn::RMSNormOptions(6).cond_dim(4));
  ada->to(torch::kFloat64);
  {
    torch::NoGradGuard ng;
    ada->dense->weight.normal_(0, 0.5);
    ada->dense->bias.normal_(0, 0.5);
  }
  auto x = torch::randn({2, 3, 6}, torch::kFloat64).requires_grad_(true);
  auto cond = torch::randn({2, 4}, torch::kFloat64).requires_grad_(true);
  auto w_out = torch::randn({2, 3, 6}, torch::kFloat64), g_out = torch::randn({2, 1, 6}, torch::kFloat64);
  auto objective = [&]() {
    auto [y, g] = ada->forward(x, cond);
    return (y * w_out).sum() + (g * g_out).sum();
  };
  auto grads = torch::autograd::grad({objective()}, {x, cond, ada->dense->weight});
  auto f = [&]() { return objective().item<double>(); };
  std::vector<torch::Tensor> targets = {x, cond, ada->dense->weight};
  for (size_t k = 0; k < targets.size(); ++k) {
    for (int64_t i = 0; i < targets[k].numel(); i += 3) {
      const double fd = testing::finite_difference(f, targets[k].detach(), i);
      CHECK(grads[k].view({-1})[i].item<double>() == Approx(fd).epsilon(1e-6).margin(1e-8));
    }
  }
}

TEST_CASE("gradient checkpointing gives the same values and gradients", "[unit][nn]") {
  auto w = torch::randn({8, 8}, torch::requires_grad());
  auto fn = [&](const nn::TensorList& in) {
    auto h = torch::tanh(torch::matmul(in[0], w));
    return nn::TensorList{h * in[1], torch::Tensor(), h.sum(-1)};
  };
  auto x = torch::randn({3, 8}, torch::requires_grad()), s = torch::randn({3, 8}, torch::requires_grad());
  auto plain = fn({x, s});
  auto loss_plain = plain[0].pow(2).sum() + plain[2].sum();
  auto g_plain = torch::autograd::grad({loss_plain}, {x, s, w});
  auto ck = nn::checkpoint(fn, {x, s});
  CHECK(!ck[1].defined());
  REQUIRE(ck[0].requires_grad());  // the graph stays connected through the checkpoint
  REQUIRE(ck[2].requires_grad());
  auto loss_ck = ck[0].pow(2).sum() + ck[2].sum();
  CHECK(torch::allclose(loss_plain, loss_ck));
  loss_ck.backward();
  CHECK(torch::allclose(x.grad(), g_plain[0], 1e-6, 1e-7));
  CHECK(torch::allclose(s.grad(), g_plain[1], 1e-6, 1e-7));
  CHECK(torch::allclose(w.grad(), g_plain[2], 1e-6, 1e-7));
  CHECK(w.grad().abs().sum().item<float>() > 0);
}

TEST_CASE("gradient checkpointing differentiates only the outputs that receive a gradient", "[unit][nn]") {
  auto w1 = torch::randn({8, 8}, torch::requires_grad()), w2 = torch::randn({8, 8}, torch::requires_grad());
  auto x = torch::randn({3, 8}, torch::requires_grad());
  auto fn = [&](const nn::TensorList& in) {
    return nn::TensorList{torch::tanh(torch::matmul(in[0], w1)), torch::tanh(torch::matmul(in[0], w2))};
  };
  const auto before = nn::checkpoint_recomputations();
  auto out = nn::checkpoint(fn, {x});
  out[0].sum().backward();  // out[1] feeds nothing, like the prefix expert's last layer
  CHECK(nn::checkpoint_recomputations() == before + 1);
  REQUIRE(w1.grad().defined());
  // Handing backward zeros for out[1] would differentiate w2's branch for nothing and leave a zero gradient.
  CHECK(!w2.grad().defined());
  auto g = torch::autograd::grad({fn({x})[0].sum()}, {x, w1});
  CHECK(torch::allclose(x.grad(), g[0], 1e-6, 1e-7));
  CHECK(torch::allclose(w1.grad(), g[1], 1e-6, 1e-7));
}

TEST_CASE("gradient checkpointing trains the parameters of a layer whose inputs need no gradient", "[unit][nn]") {
  auto w = torch::randn({8, 8}, torch::requires_grad());
  auto x = torch::randn({3, 8});  // e.g. the output of frozen embeddings
  auto fn = [&](const nn::TensorList& in) { return nn::TensorList{torch::tanh(torch::matmul(in[0], w))}; };
  auto expected = torch::autograd::grad({fn({x})[0].pow(2).sum()}, {w})[0];
  auto out = nn::checkpoint(fn, {x}, {w});
  REQUIRE(out[0].requires_grad());
  out[0].pow(2).sum().backward();
  REQUIRE(w.grad().defined());
  CHECK(torch::allclose(w.grad(), expected, 1e-6, 1e-7));
}
