// The host stages of a training step (train/host_update.h): the pool, the sums of squares in their fixed order, the
// accumulation and the fused update. What must hold exactly does (the offloaded step equals the plain one because
// both run these functions, so their bits must not depend on the thread count, on a gradient being bf16 or its
// float32 values, or on the stages running fused or one by one); what is compared with ATen's arithmetic has its
// rounding bound stated where it is checked.
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "pi0/train/host_update.h"
#include "pi0/train/optimizer.h"

using namespace pi0::train;
using Catch::Contains;

namespace {

// Sizes around the block and lane boundaries: empty, one element, a partial lane, a block and one more, several
// blocks with a ragged tail.
const std::vector<int64_t> kSizes = {0, 1, 7, 8, 9, kHostBlock - 1, kHostBlock, kHostBlock + 1, 3 * kHostBlock + 5};

torch::Tensor bits(const torch::Tensor& t) {  // a float tensor's bit pattern, so NaN compares equal to itself
  return t.scalar_type() == torch::kBFloat16 ? t.view(torch::kInt16) : t.view(torch::kInt32);
}

}  // namespace

TEST_CASE("HostPool runs every task once on its threads and rethrows the first failure", "[unit][train]") {
  for (const int threads : {1, 2, 4}) {
    INFO(threads << " threads");
    HostPool pool(threads);
    CHECK(pool.threads() == threads);
    for (int job = 0; job < 3; ++job) {  // the same workers, several jobs in a row
      std::vector<std::atomic<int>> hits(1000);
      pool.run(1000, [&](int64_t t) { hits[static_cast<size_t>(t)]++; });
      for (const auto& h : hits) CHECK(h.load() == 1);
    }
    CHECK_THROWS_WITH(pool.run(50, [](int64_t t) {
      if (t == 17) throw std::runtime_error("task 17 failed");
    }), Contains("task 17 failed"));
    int after = 0;
    pool.run(1, [&](int64_t) { ++after; });  // usable after a failure
    CHECK(after == 1);
  }
}

TEST_CASE("host_sum_of_squares: one value whatever the threads, the same for bf16 and its float32 values",
          "[unit][train]") {
  HostPool one(1), three(3);
  torch::manual_seed(3);
  for (const int64_t n : kSizes) {
    INFO(n << " elements");
    const auto x = torch::randn({n});
    const double a = host_sum_of_squares(x, one), b = host_sum_of_squares(x, three);
    CHECK(a == b);  // bits, not closeness: the order is fixed by the size alone
    // Against ATen in float64: both add n float64 squares (each exact for a float32 input: 48 significant bits), in
    // different orders, so they differ by at most ~n·2^-53 relative (a sum of positive terms); 1e-12 is above that
    // for n < 10^5 · 4 and far below a missed or doubled element (~1/n relative).
    const double want = x.to(torch::kFloat64).square().sum().item<double>();
    CHECK(a == Approx(want).epsilon(1e-12).margin(1e-300));
    const auto h = torch::randn({n}).to(torch::kBFloat16);
    CHECK(host_sum_of_squares(h, three) == host_sum_of_squares(h.to(torch::kFloat32), one));
    CHECK(host_sum_of_squares(x.to(torch::kFloat64), three) == a);  // float64 input: the same values, the same order
  }
  CHECK(host_sum_of_squares(torch::full({5}, 2.0f), one) == 20.0);
  CHECK(std::isnan(host_sum_of_squares(torch::tensor({1.0f, std::nanf("")}), one)));
  CHECK_THROWS_WITH(host_sum_of_squares(torch::zeros({4, 4}).t(), one), Contains("contiguous"));
  CHECK_THROWS_WITH(host_sum_of_squares(torch::zeros({4}, torch::kInt32), one), Contains("float32, bfloat16 or float64"));
}

TEST_CASE("host_accumulate sums as a float32 .grad does and returns the result's sum of squares", "[unit][train]") {
  HostPool pool(3);
  torch::manual_seed(4);
  for (const int64_t n : kSizes) {
    INFO(n << " elements");
    const auto g1 = torch::randn({n}).to(torch::kBFloat16), g2 = torch::randn({n}), g3 = torch::randn({n});
    auto acc = torch::empty({n});
    const double s1 = host_accumulate(acc, g1, /*first=*/true, /*want_sum=*/true, pool);
    CHECK(torch::equal(acc, g1.to(torch::kFloat32)));
    CHECK(s1 == host_sum_of_squares(acc, pool));
    host_accumulate(acc, g2, false, false, pool);
    const double s3 = host_accumulate(acc, g3, false, true, pool);
    // What autograd's float32 accumulation gives: a copy, then in-place adds in arrival order.
    const auto want = g1.to(torch::kFloat32).add(g2).add(g3);
    CHECK(torch::equal(acc, want));
    CHECK(s3 == host_sum_of_squares(want, pool));
  }
  auto acc = torch::empty({3});
  CHECK_THROWS_WITH(host_accumulate(acc, torch::zeros({4}), true, false, pool), Contains("gradient's size"));
}

namespace {

struct State {
  torch::Tensor p, m, v, ema;
  State clone() const { return {p.clone(), m.clone(), v.clone(), ema.clone()}; }
};

State make_state(int64_t n, uint64_t seed) {
  torch::manual_seed(seed);
  // Moments of a few steps' size, as after some training (v > 0 so the update is away from its ε floor).
  return {torch::randn({n}), torch::randn({n}) * 1e-3, torch::rand({n}) * 1e-5, torch::randn({n})};
}

HostUpdateScalars scalars(int64_t step, double scale, double ema) {
  HostUpdateScalars s;
  s.lr = 1e-2, s.beta1 = 0.9, s.beta2 = 0.95, s.eps = 1e-8, s.weight_decay = 0.01, s.step = step;
  s.grad_scale = scale, s.ema_decay = ema;
  return s;
}

}  // namespace

TEST_CASE("host_update: fused equals its stages one by one, at any thread count, from bf16 or float32 gradients",
          "[unit][train]") {
  HostPool one(1), three(3);
  for (const int64_t n : {int64_t{1}, int64_t{9}, 2 * kHostBlock + 3}) {
    INFO(n << " elements");
    const auto base = make_state(n, 5);
    const auto g = (torch::randn({n}) * 1e-2).to(torch::kBFloat16);
    const double scale = 0.37;  // clipping fires
    // Fused: clip + AdamW + EMA + bf16 copy out, on three threads, gradient in bf16.
    auto a = base.clone();
    auto out = torch::empty({n}, torch::kBFloat16);
    host_update({{a.p, g, a.m, a.v, a.ema, out}}, scalars(3, scale, 0.9), three);
    // One by one on one thread: the gradient scaled in place first (ATen: float32 × float(scale)), AdamW, then the EMA
    // alone, then the copy through ATen's conversion.
    auto b = base.clone();
    const auto g32 = g.to(torch::kFloat32).mul_(scale);
    host_update({{b.p, g32, b.m, b.v, {}, {}}}, scalars(3, 1.0, 0), one);
    host_update({{b.p, {}, {}, {}, b.ema, {}}}, scalars(3, 1.0, 0.9), one);
    for (const auto& [x, y] : std::vector<std::pair<torch::Tensor, torch::Tensor>>{
             {a.p, b.p}, {a.m, b.m}, {a.v, b.v}, {a.ema, b.ema}})
      CHECK(torch::equal(bits(x), bits(y)));
    CHECK(torch::equal(bits(out), bits(b.p.to(torch::kBFloat16))));
    CHECK_FALSE(torch::equal(a.p, base.p));  // it did update
    // The float32 copy out is the master itself.
    auto c = base.clone();
    auto out32 = torch::empty({n});
    host_update({{c.p, g, c.m, c.v, c.ema, out32}}, scalars(3, scale, 0.9), three);
    CHECK(torch::equal(out32, c.p));
    CHECK(torch::equal(c.p, a.p));
  }
}

TEST_CASE("host_update: AdamW and the EMA against ATen's op sequence", "[unit][train]") {
  // The same formulas in float32 in a different rounding order (ATen's lerp, addcmul, addcdiv): a few ulps per step
  // of p (|p| ~ 1: ulp 1.2e-7), m and v. Four steps stay within 1e-6 absolute plus 1e-5 relative; a missed bias
  // correction, decay or lerp weight moves p by ~1e-3.
  HostPool pool(2);
  const int64_t n = 3 * kHostBlock + 11;
  const auto base = make_state(n, 6);
  auto a = base.clone(), b = base.clone();
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.01, d = 0.9;
  for (int step = 1; step <= 4; ++step) {
    torch::manual_seed(100 + step);
    const auto g = torch::randn({n}) * 1e-2;
    host_update({{a.p, g, a.m, a.v, a.ema, {}}}, scalars(step, 0.5, d), pool);
    const auto gs = g * 0.5;
    b.p.mul_(1 - lr * wd);
    b.m.lerp_(gs, 1 - b1);
    b.v.mul_(b2).addcmul_(gs, gs, 1 - b2);
    const double bc1 = 1 - std::pow(b1, step), bc2 = std::sqrt(1 - std::pow(b2, step));
    b.p.addcdiv_(b.m, (b.v.sqrt() / bc2).add_(eps), -lr / bc1);
    b.ema.mul_(d).add_(b.p, 1 - d);
  }
  CHECK(torch::allclose(a.p, b.p, 1e-5, 1e-6));
  CHECK(torch::allclose(a.m, b.m, 1e-5, 1e-9));
  CHECK(torch::allclose(a.v, b.v, 1e-5, 1e-12));
  CHECK(torch::allclose(a.ema, b.ema, 1e-5, 1e-6));
  CHECK((a.p - base.p).abs().max().item<double>() > 1e-3);
}

TEST_CASE("host_update: a parameter without a gradient keeps its weights and moments, its EMA still moves",
          "[unit][train]") {
  HostPool pool(2);
  const auto base = make_state(100, 7);
  auto a = base.clone();
  auto out = torch::empty({100}, torch::kBFloat16);
  host_update({{a.p, {}, a.m, a.v, a.ema, out}}, scalars(2, 1.0, 0.5), pool);
  CHECK(torch::equal(a.p, base.p));
  CHECK(torch::equal(a.m, base.m));
  CHECK(torch::equal(a.v, base.v));
  CHECK(torch::equal(a.ema, base.ema.mul(0.5f).add(base.p.mul(0.5f))));
  CHECK(torch::equal(out, base.p.to(torch::kBFloat16)));
}

TEST_CASE("host_update writes bf16 as ATen converts: ties to even, infinities, subnormals, NaN", "[unit][train]") {
  HostPool pool(1);
  const float inf = std::numeric_limits<float>::infinity();
  const auto p = torch::tensor({1.00390625f, 1.01171875f, -1.00390625f, 0.0f, -0.0f, inf, -inf, 1e-40f, -3e-39f,
                                3.3895e38f, 1.0f / 3});
  auto out = torch::empty({p.numel()}, torch::kBFloat16);
  auto copy = p.clone();
  host_update({{copy, {}, {}, {}, {}, out}}, scalars(1, 1.0, 0), pool);
  CHECK(torch::equal(bits(out), bits(p.to(torch::kBFloat16))));
  CHECK(torch::equal(bits(copy), bits(p)));  // nothing to update: the master is untouched
  // NaN stays NaN (its payload bits differ between ATen's scalar and vector conversions, so only that is checked).
  auto nan = torch::tensor({std::nanf("")});
  auto nan_out = torch::empty({1}, torch::kBFloat16);
  host_update({{nan, {}, {}, {}, {}, nan_out}}, scalars(1, 1.0, 0), pool);
  CHECK(std::isnan(nan_out.to(torch::kFloat32).item<float>()));
}

TEST_CASE("host_update refuses what it cannot take, naming it", "[unit][train]") {
  HostPool pool(1);
  auto p = torch::zeros({4});
  CHECK_THROWS_WITH(host_update({{torch::zeros({4}, torch::kFloat64), {}, {}, {}, {}, {}}}, scalars(1, 1, 0), pool),
                    Contains("float32 master weights"));
  CHECK_THROWS_WITH(host_update({{p, torch::zeros({5}), torch::zeros({4}), torch::zeros({4}), {}, {}}},
                                scalars(1, 1, 0), pool),
                    Contains("5 elements for a parameter of 4"));
  CHECK_THROWS_WITH(host_update({{p, torch::zeros({4}, torch::kFloat16), torch::zeros({4}), torch::zeros({4}), {}, {}}},
                                scalars(1, 1, 0), pool),
                    Contains("float32 or bfloat16"));
  CHECK(host_update_takes(p, torch::zeros({4}, torch::kBFloat16)));
  CHECK_FALSE(host_update_takes(p, torch::zeros({4}, torch::kFloat16)));
  CHECK_FALSE(host_update_takes(torch::zeros({2, 2}).t(), torch::zeros({4})));
}

TEST_CASE("AdamW::step's grad_scale equals clipping the gradients in place first, bit for bit", "[unit][train]") {
  // Host float32 parameters take the scale inside host_update; the others (here a bf16 parameter, through the op
  // sequence) are scaled in place first, as clip_grad_norm_ does.
  auto make = [] {
    torch::manual_seed(13);
    NamedTensors ps;
    ps.emplace_back("host", torch::randn({300, 7}));
    ps.emplace_back("bf16", torch::randn({6, 5}).to(torch::kBFloat16));
    return ps;
  };
  auto a = make(), b = make();
  AdamW opt_a(a), opt_b(b);
  for (int step = 0; step < 3; ++step) {
    torch::manual_seed(300 + step);
    std::vector<torch::Tensor> ga, gb;
    for (auto& [n, p] : a) ga.push_back(torch::randn(p.sizes()).to(p.scalar_type()));
    for (auto& g : ga) gb.push_back(g.clone());
    const double norm = std::sqrt(gradient_sum_of_squares(ga).item<double>());
    REQUIRE(norm > 1.0);
    opt_a.step(1e-2, ga, clip_scale(norm, 1.0));
    scale_gradients_to_norm(gb, norm, 1.0);
    opt_b.step(1e-2, gb);
  }
  for (size_t i = 0; i < a.size(); ++i) CHECK(torch::equal(a[i].second, b[i].second));
  CHECK(clip_scale(0.5, 1.0) == 1.0);
  CHECK(clip_scale(std::nan(""), 1.0) == 1.0);
  CHECK(clip_scale(4.0, 1.0) == Approx(1.0 / (4.0 + 1e-6)));
}
