// LR schedule at chosen steps against the §8.2 formula evaluated by hand, AdamW against a hand-computed 2-step
// update, bit-exact optimizer resume, state validation messages, global-norm clipping, EMA arithmetic.
#include <catch2/catch.hpp>

#include <cmath>

#include <ATen/CPUGeneratorImpl.h>

#include "pi0/common/check.h"
#include "pi0/train/ema.h"
#include "pi0/train/lr_schedule.h"
#include "pi0/train/optimizer.h"
#include "support/skip.h"

using namespace pi0;
using namespace pi0::train;
using Catch::Matchers::Contains;

TEST_CASE("warmup_cosine_lr at chosen steps", "[unit][train]") {
  const double peak = 2.5e-5, end = 2.5e-6;
  const double init = peak / 1001.0;
  auto lr = [&](int64_t s) { return warmup_cosine_lr(s, 1000, peak, 30000, end); };
  CHECK(lr(0) == Approx(init).epsilon(1e-12));
  CHECK(lr(500) == Approx(init + (peak - init) * 0.5).epsilon(1e-12));
  CHECK(lr(999) == Approx(init + (peak - init) * 0.999).epsilon(1e-12));
  CHECK(lr(1000) == Approx(peak).epsilon(1e-12));
  // mid-decay: p = (15500 − 1000) / 29000 = 0.5 → end + (peak − end)·0.5
  CHECK(lr(15500) == Approx(end + (peak - end) * 0.5).epsilon(1e-12));
  // p = 0.25: cos(π/4) = √2/2
  CHECK(lr(1000 + 7250) == Approx(end + (peak - end) * 0.5 * (1 + std::sqrt(0.5))).epsilon(1e-12));
  CHECK(lr(30000) == Approx(end).epsilon(1e-12));
  CHECK(lr(45000) == Approx(end).epsilon(1e-12));
  // no warmup: the cosine starts at peak on step 0
  CHECK(warmup_cosine_lr(0, 0, 1.0, 10, 0.0) == Approx(1.0));
  CHECK(warmup_cosine_lr(5, 0, 1.0, 10, 0.0) == Approx(0.5));
  CHECK(warmup_cosine_lr(10, 0, 1.0, 10, 0.0) == Approx(0.0).margin(1e-15));
  // decay_steps <= warmup: max(1, ·) guards the division; constant end right after warmup
  CHECK(warmup_cosine_lr(10, 10, 1.0, 5, 0.1) == Approx(1.0));
  CHECK(warmup_cosine_lr(11, 10, 1.0, 5, 0.1) == Approx(0.1));
  CHECK_THROWS_WITH(warmup_cosine_lr(0, -5, 1.0, 10, 0.0), Contains("lr_warmup_steps must be >= 0 (got -5)"));
}

TEST_CASE("AdamW matches a hand-computed two-step update", "[unit][train]") {
  const double lr = 0.1, wd = 0.01, b1 = 0.9, b2 = 0.95, eps = 1e-8;
  auto p = torch::tensor({1.0, -2.0, 0.5}, torch::kFloat64).requires_grad_();
  AdamW opt({{"w", p}}, AdamWOptions{b1, b2, eps, wd});
  const std::vector<std::vector<double>> grads = {{0.5, -1.0, 0.0}, {0.1, 0.2, -0.3}};
  std::vector<double> ref = {1.0, -2.0, 0.5}, m(3, 0.0), v(3, 0.0);
  for (int t = 1; t <= 2; ++t) {
    p.mutable_grad() = torch::tensor(grads[t - 1], torch::kFloat64);
    opt.step(lr);
    for (int i = 0; i < 3; ++i) {
      const double g = grads[t - 1][i];
      ref[i] -= lr * wd * ref[i];  // decoupled weight decay first
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double mhat = m[i] / (1 - std::pow(b1, t)), vhat = v[i] / (1 - std::pow(b2, t));
      ref[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
  }
  for (int i = 0; i < 3; ++i) CHECK(p[i].item<double>() == Approx(ref[i]).epsilon(1e-12));
  CHECK(opt.step_count() == 2);
  auto state = opt.state_dict();
  CHECK(state.at("w.exp_avg")[1].item<double>() == Approx(m[1]).epsilon(1e-12));
  CHECK(state.at("w.exp_avg_sq")[2].item<double>() == Approx(v[2]).epsilon(1e-12));
  CHECK(state.at("step").item<int64_t>() == 2);
}

namespace {
NamedTensors make_params(uint64_t seed) {
  torch::manual_seed(seed);
  return {{"a.weight", torch::randn({4, 3}).requires_grad_()}, {"b.bias", torch::randn({5}).requires_grad_()}};
}
void set_grads(NamedTensors& params, int64_t step) {
  auto gen = at::detail::createCPUGenerator(1000 + step);
  for (auto& [name, p] : params) p.mutable_grad() = at::randn(p.sizes(), gen);
}
}  // namespace

TEST_CASE("AdamW save -> load -> step equals uninterrupted steps bit-exactly", "[unit][train]") {
  auto straight = make_params(7);
  AdamW a(straight);
  for (int64_t s = 0; s < 4; ++s) set_grads(straight, s), a.step(1e-2 * (s + 1));

  auto first = make_params(7);
  AdamW b(first);
  for (int64_t s = 0; s < 2; ++s) set_grads(first, s), b.step(1e-2 * (s + 1));
  std::map<std::string, torch::Tensor> saved;
  for (const auto& [k, t] : b.state_dict()) saved[k] = t.clone();
  // A fresh process: new parameter tensors (loaded weights) and a new optimizer.
  NamedTensors resumed;
  for (const auto& [name, p] : first) resumed.push_back({name, p.detach().clone().requires_grad_()});
  AdamW c(resumed);
  c.load_state_dict(saved);
  CHECK(c.step_count() == 2);
  for (int64_t s = 2; s < 4; ++s) set_grads(resumed, s), c.step(1e-2 * (s + 1));
  for (size_t i = 0; i < straight.size(); ++i) CHECK(torch::equal(straight[i].second, resumed[i].second));
  for (const auto& [k, t] : a.state_dict()) CHECK(torch::equal(t, c.state_dict().at(k)));
}

TEST_CASE("AdamW state validation names the key", "[unit][train]") {
  auto params = make_params(1);
  AdamW opt(params);
  auto state = opt.state_dict();
  SECTION("missing") {
    state.erase("b.bias.exp_avg_sq");
    CHECK_THROWS_WITH(opt.load_state_dict(state, "ckpt/optimizer.safetensors"),
                      Contains("ckpt/optimizer.safetensors: missing key 'b.bias.exp_avg_sq'"));
  }
  SECTION("shape") {
    state["a.weight.exp_avg"] = torch::zeros({3, 4});
    CHECK_THROWS_WITH(opt.load_state_dict(state), Contains("key 'a.weight.exp_avg' has shape [3, 4], expected [4, 3]"));
  }
  SECTION("unexpected") {
    state["c.weight.exp_avg"] = torch::zeros({1});
    CHECK_THROWS_WITH(opt.load_state_dict(state), Contains("unexpected key 'c.weight.exp_avg'"));
  }
  SECTION("no step") {
    state.erase("step");
    CHECK_THROWS_AS(opt.load_state_dict(state), UserError);
  }
}

TEST_CASE("AdamW keeps state in the parameter dtype and skips params without grad", "[unit][train]") {
  auto p16 = torch::ones({3}, torch::kBFloat16).requires_grad_();
  auto untouched = torch::ones({2}).requires_grad_();
  AdamW opt({{"p16", p16}, {"u", untouched}});
  p16.mutable_grad() = torch::ones({3}, torch::kBFloat16);
  opt.step(0.1);
  CHECK(opt.state_dict().at("p16.exp_avg").scalar_type() == torch::kBFloat16);
  CHECK(torch::equal(untouched, torch::ones({2})));
  CHECK(p16[0].item<float>() < 1.0f);
}

TEST_CASE("clip_grad_norm returns the pre-clip norm and scales like clip_grad_norm_", "[unit][train]") {
  auto a = torch::zeros({2}).requires_grad_(), b = torch::zeros({1}).requires_grad_(), c = torch::zeros({1});
  std::vector<torch::Tensor> params = {a, b, c};  // c has no grad: skipped
  a.mutable_grad() = torch::tensor({3.0f, 4.0f});
  b.mutable_grad() = torch::tensor({12.0f});
  SECTION("no clipping below max_norm") {
    CHECK(clip_grad_norm(params, 100.0) == Approx(13.0));
    CHECK(torch::equal(a.grad(), torch::tensor({3.0f, 4.0f})));
  }
  SECTION("clipping above max_norm") {
    CHECK(clip_grad_norm(params, 1.0) == Approx(13.0));
    const double coef = 1.0 / (13.0 + 1e-6);
    CHECK(a.grad()[1].item<float>() == Approx(4.0 * coef).epsilon(1e-6));
    CHECK(b.grad()[0].item<float>() == Approx(12.0 * coef).epsilon(1e-6));
    double n2 = 0;
    for (auto& t : {a.grad(), b.grad()}) n2 += t.pow(2).sum().item<double>();
    CHECK(std::sqrt(n2) == Approx(1.0).epsilon(1e-5));
  }
  SECTION("non-finite norm leaves grads alone") {
    b.mutable_grad() = torch::tensor({NAN});
    CHECK(std::isnan(clip_grad_norm(params, 1.0)));
    CHECK(torch::equal(a.grad(), torch::tensor({3.0f, 4.0f})));
  }
}

TEST_CASE("EMA arithmetic after several updates", "[unit][train]") {
  torch::manual_seed(3);
  auto w = torch::randn({6}).requires_grad_();
  auto h = torch::randn({2, 2}).to(torch::kBFloat16).requires_grad_();
  const double d = 0.9;
  Ema ema({{"w", w}, {"h", h}}, d);
  CHECK(ema.state_dict().at("h").scalar_type() == torch::kFloat32);
  auto ref_w = w.detach().to(torch::kFloat64).clone(), ref_h = h.detach().to(torch::kFloat64).clone();
  for (int k = 0; k < 5; ++k) {
    torch::NoGradGuard no_grad;
    w.add_(0.3 * (k + 1));
    h.mul_(0.5);
    ema.update();
    ref_w = d * ref_w + (1 - d) * w.detach().to(torch::kFloat64);
    ref_h = d * ref_h + (1 - d) * h.detach().to(torch::kFloat64);
  }
  auto state = ema.state_dict();
  CHECK((state.at("w").to(torch::kFloat64) - ref_w).abs().max().item<double>() < 1e-5);
  CHECK((state.at("h").to(torch::kFloat64) - ref_h).abs().max().item<double>() < 1e-5);

  // Round trip through the state map.
  Ema other({{"w", w}, {"h", h}}, d);
  std::map<std::string, torch::Tensor> saved;
  for (const auto& [k, t] : state) saved[k] = t.clone();
  other.load_state_dict(saved);
  CHECK(torch::equal(other.state_dict().at("w"), state.at("w")));
  saved.erase("h");
  CHECK_THROWS_WITH(other.load_state_dict(saved, "ema.safetensors"), Contains("ema.safetensors: missing key 'h'"));
}

TEST_CASE("EMA weights swap into a model and back", "[unit][train]") {
  torch::nn::Linear lin(3, 2);
  NamedTensors params;
  for (auto& item : lin->named_parameters()) params.push_back({item.key(), item.value()});
  Ema ema(params, 0.5);
  auto live = lin->weight.detach().clone();
  {
    torch::NoGradGuard no_grad;
    lin->weight.add_(2.0);
  }
  ema.update();  // ema = live + 1
  auto trained = lin->weight.detach().clone();
  {
    ScopedEmaWeights swap(ema, *lin);
    CHECK(torch::allclose(lin->weight, live + 1.0));
  }
  CHECK(torch::equal(lin->weight, trained));
  std::map<std::string, torch::Tensor> export_weights = {{"weight", torch::zeros({2, 3}, torch::kBFloat16)}};
  ema.copy_to(export_weights);
  CHECK(torch::allclose(export_weights["weight"].to(torch::kFloat32), live + 1.0, 1e-2, 1e-2));
}

TEST_CASE("multi-tensor AdamW and EMA equal the per-tensor loops bit-exactly", "[unit][train]") {
  if (!PI0_HAVE_FOREACH) {
    testing::skip("LibTorch " TORCH_VERSION " has no complete _foreach_* set (needs >= 2.0); the per-tensor loop runs");
    return;
  }
  auto make = [] {
    torch::manual_seed(11);
    NamedTensors ps;
    // Several shapes, one parameter without a gradient, one group split by the element bound below.
    for (int64_t i = 0; i < 5; ++i) ps.emplace_back("p" + std::to_string(i), torch::randn({3 + i, 7}).requires_grad_());
    return ps;
  };
  auto a = make(), b = make();
  AdamWOptions oa, ob;
  oa.foreach = true;
  ob.foreach = false;
  oa.fused_host = ob.fused_host = false;  // the op sequences are compared here; the one-pass form below
  oa.weight_decay = ob.weight_decay = 0.01;
  AdamW opt_a(a, oa), opt_b(b, ob);
  Ema ema_a(a, 0.9), ema_b(b, 0.9);
  for (int step = 0; step < 4; ++step) {
    torch::manual_seed(100 + step);
    for (size_t i = 0; i < a.size(); ++i) {
      if (i == 2) continue;  // never gets a gradient
      auto g = torch::randn_like(a[i].second);
      a[i].second.mutable_grad() = g.clone();
      b[i].second.mutable_grad() = g.clone();
    }
    std::vector<torch::Tensor> pa, pb;
    for (auto& [n, p] : a) pa.push_back(p);
    for (auto& [n, p] : b) pb.push_back(p);
    CHECK(clip_grad_norm(pa, 1.0) == clip_grad_norm(pb, 1.0));
    opt_a.step(1e-2);
    opt_b.step(1e-2);
    ema_a.update();
    ema_b.update();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].first);
    CHECK(torch::equal(a[i].second, b[i].second));
    CHECK(torch::equal(ema_a.state_dict().at(a[i].first), ema_b.state_dict().at(b[i].first)));
  }
  auto sa = opt_a.state_dict(), sb = opt_b.state_dict();
  for (const auto& [k, t] : sa) CHECK(torch::equal(t, sb.at(k)));
}

// The host update (train.offload's, and every float32 host parameter's): at::_fused_adamw_ on LibTorch >= 2.4,
// host_adamw_step's loop on older ones. Same formulas as the op sequence in float32, so they differ only in rounding
// order: a few ulps per step of each of p (|p| ~ 1 here, ulp 1.2e-7), m and v. Four steps stay within 1e-6
// absolute plus 1e-5 relative; a wrong formula (a missed bias correction, decay or lerp weight) moves p by ~1e-3.
TEST_CASE("one-pass host AdamW equals the op sequence within float32 rounding", "[unit][train]") {
  auto make = [] {
    torch::manual_seed(12);
    NamedTensors ps;
    for (int64_t i = 0; i < 4; ++i) ps.emplace_back("p" + std::to_string(i), torch::randn({200 + 37 * i, 9}));
    // Not the host form's: a bfloat16 parameter and a non-contiguous one go through the op sequence in both.
    ps.emplace_back("bf16", torch::randn({6, 5}).to(torch::kBFloat16));
    ps.emplace_back("strided", torch::randn({8, 6}).t());
    return ps;
  };
  auto a = make(), b = make();
  AdamWOptions oa, ob;
  oa.weight_decay = ob.weight_decay = 0.01;
  ob.fused_host = false;
  AdamW fused(a, oa), ops(b, ob);
  for (int step = 0; step < 4; ++step) {
    torch::manual_seed(200 + step);
    std::vector<torch::Tensor> grads;
    for (auto& [n, p] : a) grads.push_back(torch::randn(p.sizes()).to(p.scalar_type()));
    fused.step(1e-2, grads);
    ops.step(1e-2, grads);
  }
  REQUIRE(host_adamw_takes(a[0].second, a[0].second));
  CHECK_FALSE(host_adamw_takes(a[4].second, a[4].second));
  CHECK_FALSE(host_adamw_takes(a[5].second, a[5].second));
  auto sa = fused.state_dict(), sb = ops.state_dict();
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].first);
    if (i >= 4) {
      CHECK(torch::equal(a[i].second, b[i].second));  // the same op sequence on both sides
      continue;
    }
    CHECK(torch::allclose(a[i].second, b[i].second, 1e-5, 1e-6));
    CHECK(torch::allclose(sa.at(a[i].first + ".exp_avg"), sb.at(b[i].first + ".exp_avg"), 1e-5, 1e-7));
    CHECK(torch::allclose(sa.at(a[i].first + ".exp_avg_sq"), sb.at(b[i].first + ".exp_avg_sq"), 1e-5, 1e-8));
    // And the steps did move the weights: the comparison is not of untouched tensors.
    CHECK((a[i].second - make()[i].second).abs().max().item<double>() > 1e-3);
  }
  CHECK(sa.at("step").item<int64_t>() == 4);
}

TEST_CASE("host_adamw_step refuses tensors it cannot take", "[unit][train]") {
  auto p = torch::zeros({4}), g = torch::zeros({4}, torch::kFloat64);
  CHECK_THROWS_WITH(host_adamw_step({p}, {g}, {torch::zeros({4})}, {torch::zeros({4})}, 1e-3, 1, {}),
                    Contains("tensor 0 is not contiguous float32 in host memory"));
}

TEST_CASE("for_each_group splits by element bound and keeps the lists parallel", "[unit][train]") {
  std::vector<torch::Tensor> x, y;
  for (int64_t n : {4, 4, 8, 2}) x.push_back(torch::zeros({n})), y.push_back(torch::ones({n}));
  std::vector<int64_t> sizes;
  for_each_group({&x, &y}, [&](const std::vector<std::vector<torch::Tensor>>& l) {
    REQUIRE(l.size() == 2);
    REQUIRE(l[0].size() == l[1].size());
    int64_t n = 0;
    for (const auto& t : l[0]) n += t.numel();
    sizes.push_back(n);
  }, /*max_elements=*/8);
  CHECK(sizes == std::vector<int64_t>{8, 8, 2});
}
