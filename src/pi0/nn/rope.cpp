#include "pi0/nn/rope.h"

#include "pi0/nn/dense.h"

#include <cmath>

namespace pi0::nn {

RopeTables rope_tables(const torch::Tensor& positions, int64_t d, torch::ScalarType dtype, double theta) {
  TORCH_CHECK(d % 2 == 0, "RoPE needs an even head dim, got ", d);
  auto f32 = torch::TensorOptions().dtype(dtype).device(positions.device());
  auto frac = torch::arange(0, d / 2, f32) * (2.0 / static_cast<double>(d));
  auto inv_timescale = torch::pow(theta, -frac);                             // [D/2]
  auto angle = positions.to(dtype).unsqueeze(-1) * inv_timescale;             // [B,T,D/2]
  return {angle.cos().unsqueeze(2), angle.sin().unsqueeze(2)};                // [B,T,1,D/2]
}

torch::Tensor apply_rope(const torch::Tensor& x, const RopeTables& tables) {
  const int64_t d = x.size(-1);
  auto x32 = upcast(x);
  TORCH_CHECK(tables.cos.size(-1) * 2 == d && tables.cos.scalar_type() == x32.scalar_type(),
              "RoPE tables do not match the input (head dim ", d, ", dtype ", x32.scalar_type(), ")");
  const auto& cos = tables.cos;
  const auto& sin = tables.sin;
  auto x1 = x32.narrow(-1, 0, d / 2), x2 = x32.narrow(-1, d / 2, d / 2);
  return torch::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1).to(x.scalar_type());
}

RotaryTables rotary_tables(const RopeTables& tables) {
  return {torch::cat({tables.cos, tables.cos}, -1), torch::cat({-tables.sin, tables.sin}, -1)};
}

torch::Tensor apply_rope(const torch::Tensor& x, const RotaryTables& tables) {
  const int64_t d = x.size(-1);
  auto x32 = upcast(x);
  TORCH_CHECK(tables.cos.size(-1) == d && tables.cos.scalar_type() == x32.scalar_type(),
              "RoPE tables do not match the input (head dim ", d, ", dtype ", x32.scalar_type(), ")");
  // roll by D/2 puts x2 in the first half and x1 in the second: [x1·cos − x2·sin ; x2·cos + x1·sin].
  return torch::addcmul(x32 * tables.cos, torch::roll(x32, d / 2, -1), tables.sin).to(x.scalar_type());
}

RotaryTables rotary_tables(const RopeTables& tables, int64_t rotated_heads, int64_t plain_heads) {
  const auto whole = rotary_tables(tables);  // [B,T,1,D]
  const auto sizes = whole.cos.sizes();
  const auto expand = [&](const torch::Tensor& t, int64_t heads) {
    return t.expand({sizes[0], sizes[1], heads, sizes[3]});
  };
  return {torch::cat({expand(whole.cos, rotated_heads), expand(torch::ones_like(whole.cos), plain_heads)}, 2),
          torch::cat({expand(whole.sin, rotated_heads), expand(torch::zeros_like(whole.sin), plain_heads)}, 2)};
}

RopeFactors rope_factors(const torch::Tensor& x, const RotaryTables& tables) {
  const int64_t d = x.size(-1);
  TORCH_CHECK(tables.cos.size(-1) == d, "RoPE tables do not match the input (head dim ", d, ")");
  // LibTorch's CPU kernels take no mixed dtypes inside (1.13 asserts): the exact upcast there, one kernel on CUDA.
  const auto xs = x.device().is_cpu() ? x.to(tables.cos.scalar_type()) : x;
  return {xs * tables.cos, torch::roll(x, d / 2, -1), tables.sin};
}

torch::Tensor rope_heads(const RopeFactors& f, int64_t h0, int64_t nh, torch::Tensor out) {
  const auto xc = f.xc.narrow(2, h0, nh), xr = f.xr.narrow(2, h0, nh), sin = f.sin.narrow(2, h0, nh);
  if (torch::GradMode::is_enabled()) return torch::addcmul(xc, xr, sin).to(f.xr.scalar_type());
  // out may be a differently shaped view of the same element order ([B,T,K,G,D] for [B,T,K·G,D]).
  const auto shape = out.sizes();
  if (out.device().is_cpu() && (out.scalar_type() != xc.scalar_type() || xr.scalar_type() != xc.scalar_type())) {
    out.copy_(torch::addcmul(xc, xr.to(xc.scalar_type()), sin).reshape(shape));  // as rope_factors: no mixed dtypes
  } else {
    at::addcmul_out(out, xc.reshape(shape), xr.reshape(shape), sin.reshape(shape));
  }
  return out;
}

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& positions, double theta) {
  return apply_rope(x, rope_tables(positions, x.size(-1), upcast(x).scalar_type(), theta));
}

torch::Tensor posemb_sincos(const torch::Tensor& t, int64_t dim, double min_period, double max_period) {
  TORCH_CHECK(dim % 2 == 0, "posemb_sincos needs an even dim, got ", dim);
  auto f64 = torch::TensorOptions().dtype(torch::kFloat64).device(t.device());
  auto fraction = torch::linspace(0.0, 1.0, dim / 2, f64);
  auto period = min_period * torch::pow(max_period / min_period, fraction);
  auto arg = t.to(torch::kFloat64).unsqueeze(-1) * (2.0 * M_PI / period).unsqueeze(0);
  return torch::cat({arg.sin(), arg.cos()}, -1).to(upcast(t).scalar_type());
}

}  // namespace pi0::nn
