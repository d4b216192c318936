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
