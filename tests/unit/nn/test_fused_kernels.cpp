// Our fused kernels (nn/fused_kernels.h) against ATen's composite they replace, on the CPU loop that shares its
// per-element math with the CUDA kernel (the [cuda] test compares the two). Tolerances from the arithmetic:
// - RoPE: both sides form x1·c and x2·s in the tables' dtype and add them once; only an FMA contraction may differ,
//   at most one ulp of the larger term: |Δ| ≤ 2^-22·max|x| in float32. In bf16 both round the same float32 value
//   (±1 float32 ulp) once, so they differ by at most one bf16 ulp, and almost always not at all.
// - GeGLU: float32: tanh implementations differ by ~1 ulp (ATen's is vectorized): |Δ| ≤ 2^-20·max|a|·max|b|. bf16:
//   ours rounds once, so it stays within half a bf16 ulp (2^-8 relative) of the float64 truth, up to float32
//   arithmetic; the composite rounds gelu's output first and can miss that bound.
#include <catch2/catch.hpp>

#include <cmath>

#include "pi0/common/op_count.h"
#include "pi0/nn/fused_kernels.h"
#include "pi0/nn/rope.h"
#include "support/test_support.h"

using namespace pi0;

namespace {

double max_abs(const torch::Tensor& x) { return x.to(torch::kFloat64).abs().max().item<double>(); }
double max_diff(const torch::Tensor& a, const torch::Tensor& b) { return max_abs(a.to(torch::kFloat64) - b.to(torch::kFloat64)); }

struct RopeCase {
  int64_t b = 2, t = 5, n = 8, k = 2, d = 16, g = 4, rows = 9, row0 = 3;
  torch::Tensor qkv, positions;
  nn::RopeTables half;
  nn::RotaryTables rotary;
  RopeCase(torch::ScalarType dtype) {
    const auto acc = dtype == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
    qkv = (torch::randn({b, t, n + 2 * k, d}, torch::kFloat64) * 3).to(dtype);
    positions = torch::randint(0, 900, {b, t}, torch::kLong);
    half = nn::rope_tables(positions, d, acc);
    rotary = nn::rotary_tables(half, n + k, k);
  }
  // The composite (fused_inference's path without our kernels): q in the grouped layout, k and v into buffer rows.
  std::pair<torch::Tensor, torch::Tensor> composite() const {
    torch::NoGradGuard no_grad;  // rope_heads writes into its destination only without autograd, as inference runs
    auto q = torch::zeros({b, k, t, g, d}, qkv.options());
    auto buf = torch::zeros({b, rows, 2 * k, d}, qkv.options());
    const auto f = nn::rope_factors(qkv, rotary);
    nn::rope_heads(f, 0, n, q.permute({0, 2, 1, 3, 4}));
    nn::rope_heads(f, n, 2 * k, buf.narrow(1, row0, t));
    return {q, buf};
  }
  std::pair<torch::Tensor, torch::Tensor> fused(bool with_q = true) const {
    auto q = torch::zeros({b, k, t, g, d}, qkv.options());
    auto buf = torch::zeros({b, rows, 2 * k, d}, qkv.options());
    nn::rope_scatter(qkv, half, n, with_q ? q : torch::Tensor(), buf.narrow(1, row0, t));
    return {q, buf};
  }
};

}  // namespace

TEST_CASE("rope_scatter writes what RoPE's composite writes: grouped q and K/V buffer rows", "[unit][nn][fused]") {
  torch::manual_seed(3);
  for (auto dtype : {torch::kFloat32, torch::kFloat64, torch::kBFloat16}) {
    INFO("dtype " << dtype);
    RopeCase c(dtype);
    const auto [q_ref, buf_ref] = c.composite();
    const auto [q, buf] = c.fused();
    const double scale = max_abs(c.qkv);
    const double bound = dtype == torch::kFloat64 ? std::ldexp(scale, -51)
                         : dtype == torch::kFloat32 ? std::ldexp(scale, -22)
                                                    : std::ldexp(scale, -6);  // one bf16 ulp of |x1| + |x2|
    CHECK(max_diff(q, q_ref) <= bound);
    CHECK(max_diff(buf, buf_ref) <= bound);
    // Rows outside [row0, row0 + T) untouched; v heads copied bit for bit.
    CHECK(buf.narrow(1, 0, c.row0).abs().max().item<double>() == 0.0);
    CHECK(buf.narrow(1, c.row0 + c.t, c.rows - c.row0 - c.t).abs().max().item<double>() == 0.0);
    CHECK(torch::equal(buf.narrow(1, c.row0, c.t).narrow(2, c.k, c.k), c.qkv.narrow(2, c.n + c.k, c.k)));
    // The rotation happened (a test that could fail): q differs from the unrotated heads.
    CHECK(max_diff(q.permute({0, 2, 1, 3, 4}).reshape({c.b, c.t, c.n, c.d}), c.qkv.narrow(2, 0, c.n)) > 0.1);
    if (dtype == torch::kBFloat16) {
      const double same = q.eq(q_ref).to(torch::kFloat64).mean().item<double>();
      CHECK(same > 0.99);
    }
    // Without q: the same buffer, q untouched.
    const auto [q_none, buf_none] = c.fused(false);
    CHECK(torch::equal(buf_none, buf));
    CHECK(q_none.abs().max().item<double>() == 0.0);
  }
}

TEST_CASE("rope_scatter takes tables broadcast over the batch and rejects mismatched outputs", "[unit][nn][fused]") {
  torch::manual_seed(5);
  RopeCase c(torch::kFloat32);
  // One row of positions for the whole batch: tables [1,T,1,D/2].
  const auto pos = c.positions.narrow(0, 0, 1);
  c.half = nn::rope_tables(pos, c.d, torch::kFloat32);
  c.rotary = nn::rotary_tables(nn::rope_tables(pos.expand({c.b, c.t}), c.d, torch::kFloat32), c.n + c.k, c.k);
  const auto [q_ref, buf_ref] = c.composite();
  const auto [q, buf] = c.fused();
  CHECK(max_diff(q, q_ref) <= std::ldexp(max_abs(c.qkv), -22));
  CHECK(max_diff(buf, buf_ref) <= std::ldexp(max_abs(c.qkv), -22));
  auto wrong_q = torch::zeros({c.b, c.t, c.n, c.d});
  auto kv = torch::zeros({c.b, c.t, 2 * c.k, c.d});
  CHECK_THROWS_WITH(nn::rope_scatter(c.qkv, c.half, c.n, wrong_q, kv), Catch::Contains("q_out must be [B,K,T,G,D]"));
  CHECK_THROWS_WITH(nn::rope_scatter(c.qkv, c.half, 7, torch::Tensor(), kv), Catch::Contains("are not N + 2K"));
  CHECK_THROWS_WITH(nn::rope_scatter(c.qkv, c.half, c.n, torch::Tensor(), kv.to(torch::kFloat64)),
                    Catch::Contains("kv_out must be"));
}

TEST_CASE("geglu equals gelu_tanh(gate) times up, and bf16 rounds once", "[unit][nn][fused]") {
  torch::manual_seed(7);
  const int64_t f = 37;
  const auto gu64 = torch::randn({3, 4, 2 * f}, torch::kFloat64) * 4;
  const auto a64 = gu64.narrow(-1, 0, f), b64 = gu64.narrow(-1, f, f);
  const auto truth = torch::gelu(a64, "tanh") * b64;
  {
    const auto gu = gu64.to(torch::kFloat32);
    const auto composite = torch::gelu(gu.narrow(-1, 0, f), "tanh") * gu.narrow(-1, f, f);
    const auto fused = nn::geglu(gu);
    CHECK(fused.sizes() == composite.sizes());
    CHECK(max_diff(fused, composite) <= std::ldexp(max_abs(a64) * max_abs(b64), -20));
    CHECK(max_diff(nn::geglu(gu64), truth) <= 1e-13 * max_abs(a64) * max_abs(b64));
  }
  {
    const auto gu = gu64.to(torch::kBFloat16);
    const auto a = gu.narrow(-1, 0, f).to(torch::kFloat64), b = gu.narrow(-1, f, f).to(torch::kFloat64);
    const auto exact = torch::gelu(a, "tanh") * b;  // the truth for the bf16 inputs
    const auto fused = nn::geglu(gu).to(torch::kFloat64);
    const auto err = (fused - exact).abs();
    const auto bound = std::ldexp(1.0, -8) * exact.abs() + std::ldexp(1.0, -20) * a.abs() * b.abs();
    CHECK((err <= bound).all().item<bool>());
    // Non-contiguous input (a view) reads the same.
    const auto wide = torch::cat({gu, gu}, -1).narrow(-1, 0, 2 * f);
    CHECK(torch::equal(nn::geglu(wide), nn::geglu(gu)));
  }
  CHECK_THROWS_WITH(nn::geglu(torch::zeros({2, 3})), Catch::Contains("the last dim must be 2F"));
}

TEST_CASE("each fused kernel is one operation in op counts and profiles", "[unit][nn][fused]") {
  RopeCase c(torch::kFloat32);
  auto q = torch::empty({c.b, c.k, c.t, c.g, c.d});
  auto kv = torch::empty({c.b, c.t, 2 * c.k, c.d});
  const auto gu = torch::randn({4, 10});
  OpCounter counter;
  nn::rope_scatter(c.qkv, c.half, c.n, q, kv);
  const auto after_rope = counter.count();
  nn::geglu(gu);
  const auto total = counter.count();
  CHECK(after_rope.kernels == 1);
  CHECK(total.kernels == 2);
  CHECK(total.top == 2);  // geglu's output allocation is nested inside its record
}
