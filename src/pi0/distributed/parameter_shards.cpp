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

void ParameterShards::broadcast_updates(int64_t bucket_bytes, int64_t window_bytes) {
  torch::NoGradGuard no_grad;
  std::vector<int> kinds;
  for (const auto& [name, p] : params_) kinds.push_back(static_cast<int>(p.scalar_type()));
  const auto& pieces = layout_.pieces();
  struct Sent {
    size_t bucket;
    torch::Tensor flat;
    std::unique_ptr<PendingWork> work;
    int64_t bytes = 0;
  };
  const auto buckets = layout_.buckets(bucket_bytes, kinds);
  auto view_of = [&](size_t k) {
    const auto& piece = pieces[k];
    return flat_range(params_[piece.param].second.data(), piece.begin, piece.end);
  };
  // Receivers copy each bucket out into their parameters once it has arrived.
  auto unpack = [&](Sent& sent) {
    sent.work->wait();
    const auto& bucket = buckets[sent.bucket];
    if (bucket.owner == pg_.rank()) return;
    for (size_t j = 0; j < bucket.pieces.size(); ++j)
      view_of(bucket.pieces[j]).copy_(sent.flat.narrow(0, bucket.offsets[j], pieces[bucket.pieces[j]].numel()));
  };
  std::deque<Sent> in_flight;
  int64_t bytes = 0;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const auto& bucket = buckets[b];
    const auto& first = params_[pieces[bucket.pieces.front()].param];
    Sent sent{b, torch::Tensor(), nullptr, 0};
    if (bucket.pieces.size() == 1) {
      sent.flat = view_of(bucket.pieces.front());  // one piece: straight from and into the parameter
    } else {
      sent.flat = torch::empty({bucket.numel}, first.second.options().requires_grad(false));
      if (bucket.owner == pg_.rank()) {
        for (size_t j = 0; j < bucket.pieces.size(); ++j)
          sent.flat.narrow(0, bucket.offsets[j], pieces[bucket.pieces[j]].numel()).copy_(view_of(bucket.pieces[j]));
      }
    }
    sent.work = pg_.broadcast_async(sent.flat, bucket.owner,
                                    "broadcast of updated weights (bucket " + std::to_string(b) + " of " +
                                        std::to_string(buckets.size()) + ", '" + first.first + "')");
    sent.bytes = static_cast<int64_t>(sent.flat.nbytes());
    bytes += sent.bytes;
    in_flight.push_back(std::move(sent));
    while (bytes > window_bytes && in_flight.size() > 1) {
      bytes -= in_flight.front().bytes;
      unpack(in_flight.front());
      in_flight.pop_front();
    }
  }
  for (auto& sent : in_flight) unpack(sent);
}

}  // namespace pi0::distributed
