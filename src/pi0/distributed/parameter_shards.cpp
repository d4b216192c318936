#include "pi0/distributed/parameter_shards.h"

#include <deque>

#include "pi0/common/check.h"

namespace pi0::distributed {
namespace {
ShardLayout make_layout(const std::vector<std::pair<std::string, torch::Tensor>>& params, int64_t world_size) {
  std::vector<int64_t> numels, sizes;
  for (const auto& [name, p] : params) {
    numels.push_back(p.numel());
    sizes.push_back(static_cast<int64_t>(p.element_size()));
  }
  return ShardLayout(numels, sizes, world_size);
}
}  // namespace

torch::Tensor flat_range(const torch::Tensor& t, int64_t begin, int64_t end) {
  PI0_CHECK(t.is_contiguous(), "flat_range: tensor is not contiguous");
  return t.view({-1}).narrow(0, begin, end - begin);
}

ParameterShards::ParameterShards(ProcessGroup& pg, std::vector<std::pair<std::string, torch::Tensor>> params)
    : pg_(pg), params_(std::move(params)), layout_(make_layout(params_, pg.world_size())) {
  owned_ = layout_.owned_by(pg.rank());
  for (const auto& piece : owned_) {
    const auto& [name, p] = params_[piece.param];
    // A view of the parameter's storage: in-place updates (AdamW, EMA reads) act on the parameter itself.
    owned_views_.emplace_back(name, flat_range(p.data(), piece.begin, piece.end));
  }
}

std::vector<torch::Tensor> ParameterShards::owned_grad_views() const {
  std::vector<torch::Tensor> out;
  for (const auto& piece : owned_) {
    const auto& g = params_[piece.param].second.grad();
    out.push_back(g.defined() ? flat_range(g.is_contiguous() ? g : g.contiguous(), piece.begin, piece.end)
                              : torch::Tensor());
  }
  return out;
}

void ParameterShards::broadcast_updates(int64_t window_bytes) {
  torch::NoGradGuard no_grad;
  std::deque<std::pair<std::unique_ptr<PendingWork>, int64_t>> in_flight;
  int64_t bytes = 0;
  const auto& pieces = layout_.pieces();
  for (size_t k = 0; k < pieces.size(); ++k) {
    const auto& piece = pieces[k];
    const auto& p = params_[piece.param].second;
    auto view = flat_range(p.data(), piece.begin, piece.end);
    const int64_t nbytes = view.numel() * static_cast<int64_t>(view.element_size());
    in_flight.emplace_back(pg_.broadcast_async(view, piece.owner, "broadcast of updated weights ('" +
                                                                      params_[piece.param].first + "')"),
                           nbytes);
    bytes += nbytes;
    // Bounded: on Gloo a bfloat16 piece travels through a float32 copy.
    while (bytes > window_bytes && in_flight.size() > 1) {
      in_flight.front().first->wait();
      bytes -= in_flight.front().second;
      in_flight.pop_front();
    }
  }
  for (auto& [work, n] : in_flight) work->wait();
}

}  // namespace pi0::distributed
