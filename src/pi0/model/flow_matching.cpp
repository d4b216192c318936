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

}  // namespace pi0::model
