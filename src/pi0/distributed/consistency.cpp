#include "pi0/distributed/consistency.h"

#include <sstream>

#include "pi0/common/check.h"

namespace pi0::distributed {

uint64_t fingerprint(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string parameter_layout_text(const torch::OrderedDict<std::string, torch::Tensor>& named_parameters) {
  std::ostringstream out;
  for (const auto& item : named_parameters) {
    const auto& p = item.value();
    out << item.key() << " " << p.sizes() << " " << p.scalar_type() << " " << p.requires_grad() << "\n";
  }
  return out.str();
}

void check_same_on_all_ranks(ProcessGroup& pg, const std::string& config_text, const std::string& layout_text) {
  auto mine = torch::tensor({static_cast<int64_t>(fingerprint(config_text)), static_cast<int64_t>(fingerprint(layout_text))},
                            torch::kInt64);
  const auto all = pg.all_gather(mine, "config/parameter consistency check");
  const char* what[2] = {"resolved config (config::to_yaml, train.device normalized)",
                         "parameter layout (names, shapes, dtypes, requires_grad)"};
  for (int k = 0; k < 2; ++k) {
    std::string differing;
    const int64_t ref = all[0][k].item<int64_t>();
    for (size_t r = 1; r < all.size(); ++r) {
      if (all[r][k].item<int64_t>() != ref) differing += (differing.empty() ? "" : ", ") + std::to_string(r);
    }
    if (!differing.empty()) {
      throw UserError("the " + std::string(what[k]) + " of rank(s) " + differing + " differs from rank 0's; every " +
                      "rank must run the same config file, overrides and build (this is rank " +
                      std::to_string(pg.rank()) + ")");
    }
  }
}

}  // namespace pi0::distributed
