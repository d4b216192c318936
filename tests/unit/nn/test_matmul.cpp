// bf16 products accumulate in float32 whatever the CPU (src/pi0/nn/matmul.h): bf16 inputs in, and every element
// of the result within the bound float32 accumulation and one bf16 rounding allow of the exact product of the same
// bf16 inputs, at accumulation lengths up to 16384 — forward and backward, for the attention-shaped matmul, Dense
// (linear with bias and LoRA) and the patch convolution. A kernel that sums in bf16 misses the bound by 10x at
// k=256 already (1.13 on an AVX2 CPU: 6.6e-2, 5.4e-1 and 9.4e-1 at k = 256, 2048, 16384).
#include <catch2/catch.hpp>

#include <cmath>

#include "pi0/nn/dense.h"
#include "pi0/nn/embedding.h"
#include "pi0/nn/matmul.h"
#include "support/cpu_features.h"

using namespace pi0;

namespace {

// Positive inputs make the bound attainable and cancellation-free: every partial sum is ≤ the exact sum s, so
// float32 accumulation in any order gives |ŝ − s| ≤ γ_k·s with γ_k = k·2⁻²⁴/(1 − k·2⁻²⁴) (the products of two
// bf16 numbers are exact in float32: 8 + 8 significant bits ≤ 24), and the final rounding to bf16 adds at most
// u = 2⁻⁸ relative: |result − s| ≤ (u + γ_k(1 + u))·s. Summing in bf16 instead stalls once the sum's ulp passes the
// addends (error ~ 1 at k = 16384).
double bound(int64_t k) {
  const double eps32 = std::ldexp(1.0, -24), u = std::ldexp(1.0, -8);
  const double gamma = k * eps32 / (1 - k * eps32);
  return u + gamma * (1 + u);
}

torch::Tensor positive_bf16(torch::IntArrayRef sizes) {
  return (torch::rand(sizes, torch::kFloat64) + 0.25).to(torch::kBFloat16);  // in [0.25, 1.25): no underflow
}

// max over elements of |got − exact| / exact.
double rel_error(const torch::Tensor& got, const torch::Tensor& exact) {
  return ((got.to(torch::kFloat64) - exact).abs() / exact).max().item<double>();
}

torch::Tensor f64(const torch::Tensor& t) { return t.detach().to(torch::kFloat64); }

}  // namespace

TEST_CASE("bf16 matmul accumulates in float32 on the CPU: forward and backward within the rounding bound",
          "[unit][nn]") {
  torch::manual_seed(0);
  INFO("CPU: " << testing::cpu_features());
  for (const int64_t k : {256, 2048, 16384}) {
    // Attention's shapes: [B, H, T, K]·[B, H, K, S], the right operand a transposed view as Q·Kᵀ takes it.
    auto a = positive_bf16({2, 3, 8, k}).requires_grad_(true);
    auto bt = positive_bf16({2, 3, 8, k}).requires_grad_(true);
    const auto b = bt.transpose(-1, -2);
    const auto c = nn::matmul(a, b);
    REQUIRE(c.scalar_type() == torch::kBFloat16);
    INFO("k = " << k << ", bound " << bound(k));
    CHECK(rel_error(c, f64(a).matmul(f64(b))) <= bound(k));
    // The other layout (P·V: the right operand contiguous [B, H, K, S]).
    const auto v = bt.detach().transpose(-1, -2).contiguous();
    CHECK(rel_error(nn::matmul(a.detach(), v), f64(a).matmul(f64(v))) <= bound(k));

    // Backward: grad_a = g·bᵀ sums over S (8: the bound holds trivially), grad_b = aᵀ·g over T; make those long too.
    auto p = positive_bf16({2, 3, 8, 8}).requires_grad_(true);
    auto q = positive_bf16({2, 3, 8, k}).requires_grad_(true);  // p·q: [.., 8, k]; grad_p = g·qᵀ sums over k
    auto g = positive_bf16({2, 3, 8, k});
    nn::matmul(p, q).backward(g);
    CHECK(rel_error(p.grad(), f64(g).matmul(f64(q).transpose(-1, -2))) <= bound(k));
    auto r = positive_bf16({2, 3, k, 8}).requires_grad_(true);
    auto s = positive_bf16({2, 3, 8, 8}).requires_grad_(true);  // r·s: [.., k, 8]; grad_s = rᵀ·g sums over k
    auto gr = positive_bf16({2, 3, k, 8});
    nn::matmul(r, s).backward(gr);
    CHECK(rel_error(s.grad(), f64(r).transpose(-1, -2).matmul(f64(gr))) <= bound(k));
  }
}

TEST_CASE("bf16 Dense and patch convolution accumulate in float32 on the CPU, forward and backward", "[unit][nn]") {
  torch::manual_seed(1);
  INFO("CPU: " << testing::cpu_features());
  for (const int64_t k : {256, 2048, 16384}) {
    INFO("k = " << k << ", bound " << bound(k));
    // Forward sums over in_features (k); the bias is one more positive addend in the same float32 sum.
    nn::Dense wide(nn::DenseOptions(k, 8));
    {
      torch::NoGradGuard no_grad;
      wide->weight.copy_(positive_bf16({8, k}));
      wide->bias.copy_(positive_bf16({8}));
    }
    const auto x = positive_bf16({4, 3, k});
    const auto exact = f64(x).matmul(f64(wide->weight).t()) + f64(wide->bias);
    CHECK(rel_error(wide->forward(x), exact) <= bound(k + 1));

    // Backward of a Dense over k tokens: grad_weight and grad_bias sum over the tokens (float32 master weights:
    // the bf16 gradient of the cast, then exact in float32), grad_x over out_features.
    nn::Dense layer(nn::DenseOptions(16, 8));
    {
      torch::NoGradGuard no_grad;
      layer->weight.copy_(positive_bf16({8, 16}));
    }
    auto tokens = positive_bf16({k, 16}).requires_grad_(true);
    const auto g = positive_bf16({k, 8});
    layer->forward(tokens).backward(g);
    CHECK(rel_error(layer->weight.grad(), f64(g).t().matmul(f64(tokens))) <= bound(k));
    CHECK(rel_error(layer->bias.grad(), f64(g).sum(0)) <= bound(k));
    nn::Dense tall(nn::DenseOptions(8, k));
    {
      torch::NoGradGuard no_grad;
      tall->weight.copy_(positive_bf16({k, 8}));
    }
    auto xs = positive_bf16({4, 8}).requires_grad_(true);
    const auto gt = positive_bf16({4, k});
    tall->forward(xs).backward(gt);
    CHECK(rel_error(xs.grad(), f64(gt).matmul(f64(tall->weight))) <= bound(k));
  }

  // LoRA's two factors: the rank-r product is rounded to bf16 between them (as the native path does), so its
  // bound is composed: x·Aᵀ within bound(in), then ·Bᵀ within bound(r) of the rounded value.
  nn::Dense lora(nn::DenseOptions(2048, 8));
  lora->enable_lora(4, 4);
  {
    torch::NoGradGuard no_grad;
    lora->weight.zero_();
    lora->bias.zero_();
    lora->lora_a.copy_(positive_bf16({4, 2048}));
    lora->lora_b.copy_(positive_bf16({8, 4}));
  }
  const auto x = positive_bf16({2, 2048});
  const auto xa = f64(nn::linear(x, lora->lora_a.to(torch::kBFloat16)));
  CHECK(rel_error(xa, f64(x).matmul(f64(lora->lora_a).t())) <= bound(2048));
  const auto y = lora->forward(x);  // 0 + (x·Aᵀ)·Bᵀ · scaling(1): the bias and base add exact zeros
  const double lora_bound = (1 + bound(2048)) * (1 + bound(4)) - 1;
  CHECK(rel_error(y, f64(x).matmul(f64(lora->lora_a).t()).matmul(f64(lora->lora_b).t())) <= lora_bound);

  // SigLIP's patch embedding in all-bf16 weights: a 14×14×3 kernel sums k = 588 products per output.
  nn::PatchConv conv(3, 16, 14);
  conv->to(torch::kBFloat16);
  {
    torch::NoGradGuard no_grad;
    conv->weight.copy_(positive_bf16(conv->weight.sizes()));
    conv->bias.copy_(positive_bf16(conv->bias.sizes()));
  }
  const auto images = positive_bf16({1, 3, 56, 56});
  const auto exact = torch::conv2d(f64(images), f64(conv->weight), f64(conv->bias), {14, 14});
  CHECK(rel_error(conv->forward(images), exact) <= bound(3 * 14 * 14 + 1));
}
