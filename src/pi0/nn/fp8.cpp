#include "pi0/nn/fp8.h"

namespace pi0::nn {

torch::Tensor round_to_e4m3(const torch::Tensor& x) {
  const auto x32 = x.to(torch::kFloat32);
  // |x| = m·2^E with m in [0.5, 1): the binade's exponent is E − 1, exactly (log2 would misplace values just below a
  // power of two). Below 2^-6 the spacing stays that of the subnormals, 2^-9.
  const auto fe = torch::frexp(x32.abs());
  const auto binade = (std::get<1>(fe) - 1).clamp_min(-6).to(torch::kFloat32);
  const auto spacing = torch::pow(2.0, binade - 3);  // 3 mantissa bits
  // x / spacing and the product back are exact (powers of two); torch::round rounds half to even. A value that
  // rounds up to the next binade is representable there too.
  return (torch::round(x32 / spacing) * spacing).clamp(-kE4M3Max, kE4M3Max);
}

torch::Tensor fake_quantize_e4m3_rows(const torch::Tensor& x) {
  const auto x32 = x.to(torch::kFloat32);
  const auto amax = x32.abs().amax(-1, /*keepdim=*/true);
  const auto scale = torch::where(amax > 0, amax / kE4M3Max, torch::ones_like(amax));
  return (round_to_e4m3(x32 / scale) * scale).to(x.scalar_type());
}

}  // namespace pi0::nn
