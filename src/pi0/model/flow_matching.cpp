#include "pi0/model/flow_matching.h"

#include <cmath>
#include <vector>

#include "pi0/common/check.h"

namespace pi0::model {

torch::Tensor sample_flow_time(int64_t n, const torch::TensorOptions& options,
                               const std::optional<at::Generator>& generator, int64_t first, int64_t count) {
  auto u = generator ? torch::rand({n}, *generator, options) : torch::rand({n}, options);
  if (first != 0 || (count >= 0 && count != n)) u = u.narrow(0, first, count < 0 ? n - first : count);
  return u.pow(1.0 / 1.5) * 0.999 + 0.001;
}

torch::Tensor sample_rtc_delays(int64_t n, int64_t max_delay, const std::string& distribution, double exp_rate,
                                const torch::TensorOptions& options, const std::optional<at::Generator>& generator,
                                int64_t first, int64_t count) {
  PI0_CHECK(max_delay >= 0, "max_delay must be >= 0");
  const auto f64 = options.dtype(torch::kFloat64);
  auto u = generator ? torch::rand({n}, *generator, f64) : torch::rand({n}, f64);
  if (first != 0 || (count >= 0 && count != n)) u = u.narrow(0, first, count < 0 ? n - first : count);
  // d = the number of cumulative probabilities P(D ≤ k), k < max_delay, that u reaches.
  std::vector<double> cdf;
  double total = 0;
  for (int64_t d = 0; d <= max_delay; ++d) total += distribution == "exp" ? std::exp(-exp_rate * d) : 1.0;
  double acc = 0;
  for (int64_t d = 0; d < max_delay; ++d) {
    acc += (distribution == "exp" ? std::exp(-exp_rate * d) : 1.0) / total;
    cdf.push_back(acc);
  }
  PI0_CHECK(distribution == "uniform" || distribution == "exp", "unknown delay distribution '", distribution, "'");
  auto d = torch::zeros(u.sizes(), options.dtype(torch::kLong));
  for (double c : cdf) d += (u >= c).to(torch::kLong);
  return d;
}

torch::Tensor rtc_token_time(const torch::Tensor& time, const torch::Tensor& delays, int64_t horizon) {
  const auto rows = torch::arange(horizon, delays.options().dtype(torch::kLong)).unsqueeze(0);
  const auto committed = rows < delays.to(torch::kLong).view({-1, 1});
  return torch::where(committed, torch::zeros({}, time.options()), time.view({-1, 1}).expand({time.size(0), horizon}));
}

torch::Tensor rtc_loss_mask(const torch::Tensor& delays, int64_t horizon, const torch::TensorOptions& options) {
  const auto rows = torch::arange(horizon, delays.options().dtype(torch::kLong)).unsqueeze(0);
  return (rows >= delays.to(torch::kLong).view({-1, 1})).to(options.dtype());
}

torch::Tensor action_loss_mask(const torch::Tensor& action_rows, const torch::Tensor& action_dims, int64_t horizon,
                               int64_t dim, bool episode_end, bool action_padding,
                               const torch::TensorOptions& options) {
  TORCH_CHECK(!(episode_end || action_padding) || (action_rows.defined() && action_dims.defined()),
              "train.loss_mask needs the batch's action_rows and action_dims (set by the data pipeline)");
  const int64_t b = action_rows.defined() ? action_rows.size(0) : action_dims.size(0);
  auto mask = torch::ones({b, horizon, dim}, options);
  const auto dev = torch::TensorOptions().dtype(torch::kInt64).device(options.device());
  if (episode_end) {
    const auto rows = torch::arange(horizon, dev).unsqueeze(0) < action_rows.to(options.device()).unsqueeze(1);  // [B,H]
    mask = mask * rows.unsqueeze(-1).to(options);
  }
  if (action_padding) {
    const auto dims = torch::arange(dim, dev).unsqueeze(0) < action_dims.to(options.device()).unsqueeze(1);  // [B,D]
    mask = mask * dims.unsqueeze(1).to(options);
  }
  return mask;
}

torch::Tensor masked_mean(const torch::Tensor& elementwise, const torch::Tensor& mask) {
  // The count is a sum of 0/1 values: exact in float32 up to 2^24 elements, so with an RTC mask [B,H,1] it equals
  // the kept rows times D exactly.
  const auto count = mask.expand_as(elementwise).sum();
  return (elementwise * mask).sum() / count.clamp_min(1);
}

}  // namespace pi0::model
