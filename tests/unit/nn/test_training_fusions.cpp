// Training-side fusions (issue 47): RMSNorm and GeGLU as autograd functions that keep less for backward than the
// composite expressions they replace, checked against those composites (written out here as the reference).
// - Forward: both run the composite's own operations, so the values are bit-identical.
// - GeGLU backward: the composite's own operations on a recomputed activation, so bit-identical gradients.
// - RMSNorm backward runs the operations autograd runs for the composite (derivatives.yaml's formulas), in the same
//   roundings, so its gradients are bit-identical too when x feeds only the norm (in a model, float32 x also takes
//   the residual's gradient, and three addends may then be summed in another order).
#include <catch2/catch.hpp>

#include <cmath>
#include <optional>

#include "pi0/common/op_count.h"
#include "pi0/nn/dense.h"
#include "pi0/nn/rms_norm.h"
#include "support/counting_allocator.h"
#include "support/test_support.h"

using namespace pi0;

namespace {

// The expressions the fusions replace (RMSNormImpl::forward and GemmaMlp before issue 47).
torch::Tensor rms_composite(const torch::Tensor& x, const torch::Tensor& scale, const torch::Tensor& shift,
                            double eps) {
  const auto x32 = nn::upcast(x);
  const auto n = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  auto y = n * (1.0 + scale.to(x32.scalar_type()));
  if (shift.defined()) y = y + shift;
  return y.to(x.scalar_type());
}
torch::Tensor geglu_composite(const torch::Tensor& gate, const torch::Tensor& up) {
  return nn::gelu_tanh(gate) * up;
}

torch::Tensor leaf(torch::Tensor t) { return t.detach().requires_grad_(true); }

// x [B,T,W] and the norm's inputs: a plain norm's weight [W], or an adaptive norm's scale/shift per example
// ([B,1,W]) or per token ([B,T,W]).
struct NormCase {
  torch::Tensor x, scale, shift, gy;
  NormCase(torch::ScalarType dtype, const char* kind, int64_t b = 3, int64_t t = 5, int64_t w = 64) {
    torch::manual_seed(7);
    const auto acc = dtype == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
    x = leaf((torch::randn({b, t, w}, torch::kFloat64) * 2 + 0.3).to(dtype));
    const std::string k = kind;
    const std::vector<int64_t> shape = k == "plain" ? std::vector<int64_t>{w}
                                       : k == "per_example" ? std::vector<int64_t>{b, 1, w}
                                                            : std::vector<int64_t>{b, t, w};
    scale = leaf(torch::randn(shape, torch::kFloat64).mul(0.5).to(acc));
    if (k != "plain") shift = leaf(torch::randn(shape, torch::kFloat64).mul(0.5).to(acc));
    gy = torch::randn({b, t, w}, torch::kFloat64).to(dtype);
  }
};

struct Grads {
  torch::Tensor y, dx, dscale, dshift;
};

Grads run_norm(const NormCase& c, bool fused, std::optional<torch::ScalarType> as = std::nullopt) {
  auto cast = [&](const torch::Tensor& t) {
    return !t.defined() ? t : leaf(as ? t.to(*as) : t);
  };
  const auto x = cast(c.x), scale = cast(c.scale), shift = cast(c.shift);
  const auto y = fused ? nn::rms_norm(x, scale, shift, 1e-6) : rms_composite(x, scale, shift, 1e-6);
  y.backward(as ? c.gy.to(*as) : c.gy);
  return {y.detach(), x.grad(), scale.grad(), shift.defined() ? shift.grad() : torch::Tensor()};
}

double max_abs(const torch::Tensor& t) { return t.to(torch::kFloat64).abs().max().item<double>(); }

}  // namespace

TEST_CASE("fused RMSNorm: the composite's values and gradients bit for bit", "[unit][nn][fused]") {
  for (const char* kind : {"plain", "per_example", "per_token"}) {
    for (auto dtype : {torch::kFloat64, torch::kFloat32, torch::kBFloat16}) {
      INFO(kind << ", dtype " << dtype);
      const NormCase c(dtype, kind);
      const auto f = run_norm(c, true), r = run_norm(c, false);
      CHECK(torch::equal(f.y, r.y));
      REQUIRE(f.dx.scalar_type() == dtype);
      CHECK(torch::equal(f.dx, r.dx));
      CHECK(torch::equal(f.dscale, r.dscale));
      if (r.dshift.defined()) CHECK(torch::equal(f.dshift, r.dshift));
      // Not vacuous: the gradients are far from zero.
      CHECK(max_abs(f.dx) > 0.1);
    }
  }
}

TEST_CASE("fused RMSNorm keeps only the normalization statistics for backward", "[unit][nn][fused]") {
  for (auto dtype : {torch::kBFloat16, torch::kFloat32}) {
    const NormCase c(dtype, "plain", 4, 16, 256);
    int64_t fused = 0, composite = 0;
    torch::Tensor keep;
    {
      testing::PeakAllocation alloc;
      keep = nn::rms_norm(c.x, c.scale, {}, 1e-6);
      fused = alloc.held();
    }
    keep = torch::Tensor();
    {
      testing::PeakAllocation alloc;
      keep = rms_composite(c.x, c.scale, {}, 1e-6);
      composite = alloc.held();
    }
    const int64_t rows = 4 * 16, y_bytes = rows * 256 * c.x.element_size();
    INFO("dtype " << dtype << ": fused keeps " << fused << " B, the composite " << composite << " B");
    // The output and one float32 rstd per row: x itself is the caller's, the scale a parameter.
    CHECK(fused == y_bytes + rows * 4);
    // The composite also keeps the float32 x (a copy in bf16) and the normalized value.
    CHECK(composite >= fused + rows * 256 * 4);
  }
}

TEST_CASE("fused GeGLU: the composite's values and gradients bit for bit, without keeping the activation",
          "[unit][nn][fused]") {
  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat64}) {
    INFO("dtype " << dtype);
    torch::manual_seed(3);
    const auto gate0 = (torch::randn({3, 7, 96}, torch::kFloat64) * 2).to(dtype);
    const auto up0 = torch::randn({3, 7, 96}, torch::kFloat64).to(dtype);
    const auto gy = torch::randn({3, 7, 96}, torch::kFloat64).to(dtype);
    auto run = [&](bool fused, int64_t* held) {
      const auto gate = leaf(gate0), up = leaf(up0);
      torch::Tensor y;
      {
        testing::PeakAllocation alloc;
        y = fused ? nn::gelu_tanh_mul(gate, up) : geglu_composite(gate, up);
        *held = alloc.held();
      }
      y.backward(gy);
      return std::vector<torch::Tensor>{y.detach(), gate.grad(), up.grad()};
    };
    int64_t held_fused = 0, held_composite = 0;
    const auto f = run(true, &held_fused), r = run(false, &held_composite);
    for (size_t i = 0; i < f.size(); ++i) CHECK(torch::equal(f[i], r[i]));
    const int64_t out_bytes = gate0.numel() * gate0.element_size();
    CHECK(held_fused == out_bytes);                    // the output only
    CHECK(held_composite == held_fused + out_bytes);  // and gelu_tanh(gate)
  }
}

TEST_CASE("fused RMSNorm recomputes only three elementwise operations in backward", "[unit][nn][fused]") {
  const NormCase c(torch::kBFloat16, "per_example");
  auto norm_ops = [&](bool fused) {
    OpCounter counter;
    run_norm(c, fused);
    return counter.count().kernels;
  };
  const auto fused = norm_ops(true), composite = norm_ops(false);
  WARN("RMSNorm forward + backward, bf16, adaptive: " << fused << " kernels fused, " << composite << " composite");
  // What it does not keep: x's float32 copy, n and 1 + scale, each one elementwise pass again.
  CHECK(fused <= composite + 3);
}
