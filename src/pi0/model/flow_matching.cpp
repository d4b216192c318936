#include "pi0/model/flow_matching.h"

namespace pi0::model {

torch::Tensor sample_flow_time(int64_t n, const torch::TensorOptions& options,
                               const std::optional<at::Generator>& generator, int64_t first, int64_t count) {
  auto u = generator ? torch::rand({n}, *generator, options) : torch::rand({n}, options);
  if (first != 0 || (count >= 0 && count != n)) u = u.narrow(0, first, count < 0 ? n - first : count);
  return u.pow(1.0 / 1.5) * 0.999 + 0.001;
}

}  // namespace pi0::model
