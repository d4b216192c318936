#include "pi0/nn/attention_mask.h"

namespace pi0::nn {

torch::Tensor make_attn_mask(const torch::Tensor& input_mask, const torch::Tensor& ar_mask) {
  TORCH_CHECK(input_mask.dim() == 2, "input_mask must be [B,T]");
  auto ar = ar_mask.dim() == 1 ? ar_mask.unsqueeze(0).expand_as(input_mask) : ar_mask;
  auto cum = ar.to(torch::kInt64).cumsum(1);                               // [B,T]
  auto allowed = cum.unsqueeze(1) <= cum.unsqueeze(2);                     // [b,i,j] = cum[j] <= cum[i]
  auto valid = input_mask.to(torch::kBool);
  return allowed & valid.unsqueeze(2) & valid.unsqueeze(1);
}

torch::Tensor positions_from_mask(const torch::Tensor& input_mask) {
  return input_mask.to(torch::kInt64).cumsum(1) - 1;
}

torch::Tensor make_cached_attn_mask(const torch::Tensor& prefix_mask, const torch::Tensor& input_mask,
                                    const torch::Tensor& ar_mask) {
  const int64_t b = input_mask.size(0), t = input_mask.size(1), tp = prefix_mask.size(1);
  return torch::cat({prefix_mask.to(torch::kBool).unsqueeze(1).expand({b, t, tp}), make_attn_mask(input_mask, ar_mask)},
                    2);
}

torch::Tensor positions_after(const torch::Tensor& prefix_mask, const torch::Tensor& input_mask) {
  return prefix_mask.to(torch::kInt64).sum(1, /*keepdim=*/true) + positions_from_mask(input_mask);
}

}  // namespace pi0::nn
