// Dense's LoRA branch does less (issue 47): the scaling is skipped when it is 1 and moved onto the rank-wide x·Aᵀ when
// it is a power of two ≥ 1. Each form must give the reference expression's bits, forward and every gradient, in
// float32 and in bf16 (the CPU's float32-accumulating products included), and use fewer [.., out]-sized kernels.
#include <catch2/catch.hpp>

#include "pi0/common/op_count.h"
#include "pi0/nn/dense.h"
#include "pi0/nn/matmul.h"

using namespace pi0;

namespace {
struct Result {
  torch::Tensor y, gx, gw, ga, gb;
};

// The branch as it was written before: y + linear(linear(x, A), B) · scaling.
Result reference(nn::DenseImpl& d, const torch::Tensor& x0, const torch::Tensor& g) {
  auto x = x0.detach().requires_grad_(true);
  const auto dt = x.scalar_type();
  auto w = d.weight.detach().to(torch::kFloat32).requires_grad_(true);
  auto a = d.lora_a.detach().to(torch::kFloat32).requires_grad_(true);
  auto b = d.lora_b.detach().to(torch::kFloat32).requires_grad_(true);
  auto y = nn::linear(x, w.to(dt), d.bias.detach().to(dt));
  y = y + nn::linear(nn::linear(x, a.to(dt)), b.to(dt)) * d.lora_scaling;
  y.backward(g);
  return {y.detach(), x.grad(), w.grad(), a.grad(), b.grad()};
}

Result ours(nn::DenseImpl& d, const torch::Tensor& x0, const torch::Tensor& g) {
  for (auto& p : d.parameters()) p.mutable_grad() = torch::Tensor();
  auto x = x0.detach().requires_grad_(true);
  auto y = d.forward(x);
  y.backward(g);
  return {y.detach(), x.grad(), d.weight.grad(), d.lora_a.grad(), d.lora_b.grad()};
}
}  // namespace

TEST_CASE("Dense LoRA: the scaling skipped or moved onto x times A gives the reference's bits", "[unit][nn]") {
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    // rank 4: alpha 4 (scaling 1, openpi's variants), 8 and 16 (2 and 4: moved), 6 and 2 (1.5 and 0.5: kept).
    for (const double alpha : {4.0, 8.0, 16.0, 6.0, 2.0}) {
      INFO("dtype " << dtype << " alpha " << alpha);
      torch::manual_seed(3);
      nn::Dense d(48, 40);
      d->enable_lora(4, alpha);
      {
        torch::NoGradGuard no_grad;  // factors large enough that the branch matters in every output bit
        d->lora_a.normal_(0, 0.5);
        d->lora_b.normal_(0, 0.5);
      }
      for (auto& p : d->parameters()) p.set_requires_grad(true);
      const auto x = torch::randn({3, 5, 48}).to(dtype);
      const auto g = torch::randn({3, 5, 40}).to(dtype);
      const auto r = reference(*d, x, g);
      const auto o = ours(*d, x, g);
      CHECK(torch::equal(o.y, r.y));
      CHECK(torch::equal(o.gx, r.gx));
      CHECK(torch::equal(o.gw, r.gw));
      CHECK(torch::equal(o.ga, r.ga));
      CHECK(torch::equal(o.gb, r.gb));
      CHECK(d->lora_scaling_is_exact_on_h() == (alpha == 4.0 || alpha == 8.0 || alpha == 16.0));
    }
  }
}

TEST_CASE("Dense LoRA: a scaling of one costs no multiply and a power of two only a rank-wide one", "[unit][nn]") {
  // Kernels of one forward + backward, the [.., out] multiply and its gradient's gone with a scaling of 1.
  auto kernels = [](double alpha, int64_t* muls) {
    torch::manual_seed(4);
    nn::Dense d(32, 32);
    d->enable_lora(4, alpha);
    for (auto& p : d->parameters()) p.set_requires_grad(true);
    const auto x = torch::randn({8, 32}, torch::requires_grad());
    OpCounter counter(/*tally=*/true);
    d->forward(x).sum().backward();
    *muls = kernels_per_name(counter.tally())["aten::mul"];
    return counter.count().kernels;
  };
  int64_t muls_one = 0, muls_two = 0, muls_odd = 0;
  const int64_t one = kernels(4.0, &muls_one), two = kernels(8.0, &muls_two), odd = kernels(6.0, &muls_odd);
  CHECK(one == odd - 2);  // the multiply forward and its gradient
  CHECK(muls_one == 0);
  CHECK(two == odd);     // as many kernels, the multiplies rank-wide
  CHECK(muls_two == muls_odd);
}
