// dist.shard's pieces in one process: the element layout (pure), and the ZeRO-2 gradient reducer and weight
// broadcast with two ranks on two threads (Gloo on 127.0.0.1), checked against gradients averaged by hand.
#include <catch2/catch.hpp>

#include <map>
#include <numeric>

#include "pi0/distributed/parameter_shards.h"
#include "pi0/distributed/process_group.h"
#include "pi0/distributed/shard_layout.h"
#include "pi0/distributed/sharded_grad_reducer.h"
#include "support/distributed_support.h"

using pi0::distributed::Piece;
using pi0::distributed::ShardLayout;
using pi0::testing::Replica;

namespace {

// Every element of every parameter is owned exactly once; pieces are in backward order; shares are balanced.
void check_layout(const std::vector<int64_t>& numels, const std::vector<int64_t>& sizes, int64_t world) {
  const ShardLayout layout(numels, sizes, world);
  std::vector<int64_t> next(numels.size(), 0);  // next unowned element per parameter
  size_t last_param = numels.size();
  int64_t last_owner = 0, total = 0, largest = 0;
  for (const auto& p : layout.pieces()) {
    INFO("piece of parameter " << p.param << " [" << p.begin << ", " << p.end << ") owner " << p.owner);
    CHECK(p.begin == next[p.param]);  // contiguous, in order, no overlap
    CHECK(p.end > p.begin);
    next[p.param] = p.end;
    CHECK(p.param <= last_param);  // reverse registration order
    last_param = p.param;
    CHECK(p.owner >= last_owner);  // ranks own consecutive ranges
    last_owner = p.owner;
  }
  for (size_t i = 0; i < numels.size(); ++i) {
    CHECK(next[i] == numels[i]);
    total += numels[i] * sizes[i];
    largest = std::max(largest, sizes[i]);
  }
  int64_t sum = 0;
  for (int64_t r = 0; r < world; ++r) {
    sum += layout.bytes_of(r);
    CHECK(layout.bytes_of(r) <= total / world + largest);
    CHECK(layout.bytes_of(r) >= total / world - largest);
    for (const auto& p : layout.owned_by(r)) CHECK(p.owner == r);
  }
  CHECK(sum == total);
}

}  // namespace

TEST_CASE("shard layout: every element owned once, in backward order, balanced to an element", "[unit][dist][shard]") {
  check_layout({10, 1000, 7, 0, 33}, {4, 4, 4, 4, 4}, 1);
  check_layout({10, 1000, 7, 0, 33}, {4, 4, 4, 4, 4}, 2);
  check_layout({10, 1000, 7, 0, 33}, {4, 2, 8, 4, 2}, 3);
  check_layout({5}, {4}, 8);  // fewer elements than ranks: some own nothing
  check_layout({1, 1, 1}, {2, 4, 2}, 2);
  // One parameter holding 16 % of the bytes (pi0's embedding) is split over the ranks it straddles.
  std::vector<int64_t> numels(20, 100);
  numels[0] = 400;
  check_layout(numels, std::vector<int64_t>(20, 4), 8);
  const ShardLayout layout(numels, std::vector<int64_t>(20, 4), 8);
  int64_t pieces_of_first = 0;
  for (const auto& p : layout.pieces()) pieces_of_first += p.param == 0;
  CHECK(pieces_of_first >= 2);
  CHECK(layout.max_bytes() - 2400 * 4 / 8 <= 4);
  // Deterministic: the same sizes give the same layout.
  CHECK((ShardLayout(numels, std::vector<int64_t>(20, 4), 8).pieces() == layout.pieces()));
  // Buckets: every piece once, in layout order, one owner and one kind each, within the byte bound unless alone.
  for (const int64_t max_bytes : {int64_t{1}, int64_t{300}, int64_t{1} << 20}) {
    std::vector<int> kinds(20, 0);
    kinds[5] = 1;  // another dtype never shares a bucket
    size_t next = 0;
    for (const auto& b : layout.buckets(max_bytes, kinds)) {
      int64_t bytes = 0, offset = 0;
      for (size_t j = 0; j < b.pieces.size(); ++j) {
        const auto& p = layout.pieces()[b.pieces[j]];
        CHECK(b.pieces[j] == next++);
        CHECK(p.owner == b.owner);
        CHECK(kinds[p.param] == kinds[layout.pieces()[b.pieces[0]].param]);
        CHECK(b.offsets[j] == offset);
        offset += p.numel();
        bytes += p.numel() * 4;
      }
      CHECK(b.numel == offset);
      CHECK((bytes <= max_bytes || b.pieces.size() == 1));
    }
    CHECK(next == layout.pieces().size());
  }
  // One rank owns everything, one piece per (non-empty) parameter.
  const ShardLayout single({3, 0, 5}, {4, 4, 4}, 1);
  REQUIRE(single.pieces().size() == 2);
  CHECK((single.pieces()[0] == Piece{2, 0, 5, 0}));
  CHECK((single.pieces()[1] == Piece{0, 0, 3, 0}));
}

TEST_CASE("sharded gradients: each owner gets the average of its pieces, the others keep nothing",
          "[unit][dist][shard]") {
  const bool with_unused = GENERATE(true, false);
  const int64_t window = GENERATE(int64_t{1}, int64_t{1} << 20);  // one reduction in flight, or all of them
  // Buckets of one piece each, or of several (d, unused and w2 share rank 0's first bucket, w1's pieces follow).
  const int64_t bucket = GENERATE(int64_t{1}, int64_t{600});
  torch::Tensor xs[2][2];
  for (int r = 0; r < 2; ++r)
    for (int micro = 0; micro < 2; ++micro) xs[r][micro] = torch::randn({5, 16});
  std::map<std::string, torch::Tensor> expected;  // averaged over ranks of 2 accumulated micro-steps
  for (int r = 0; r < 2; ++r) {
    Replica m(with_unused);
    for (int micro = 0; micro < 2; ++micro) m.loss(xs[r][micro]).backward();
    for (auto& [n, p] : m.params)
      if (p.grad().defined()) expected[n] = expected.count(n) ? expected[n] + p.grad() / 2 : p.grad() / 2;
  }
  std::vector<Piece> owned[2];
  std::vector<torch::Tensor> got[2];
  int64_t held[2] = {0, 0}, owned_bytes[2] = {0, 0};
  bool grads_released[2] = {false, false};
  std::map<std::string, torch::Tensor> after_broadcast[2];
  const auto errors = pi0::testing::run_two_ranks([&](pi0::distributed::ProcessGroup& pg, int rank) {
    Replica m(with_unused);
    pi0::distributed::ParameterShards shards(pg, m.params);
    pi0::distributed::ShardedGradReducer reducer(pg, m.params, shards.layout(), bucket, window);
    for (int step = 0; step < 2; ++step) {  // twice: per-step state must reset
      reducer.clear();
      for (int micro = 0; micro < 2; ++micro) {
        m.loss(xs[rank][micro]).backward();
        reducer.wait();
      }
      got[rank] = reducer.finish_step();
    }
    grads_released[rank] = true;
    for (auto& [n, p] : m.params) grads_released[rank] = grads_released[rank] && !p.grad().defined();
    held[rank] = reducer.held_bytes();
    owned_bytes[rank] = shards.layout().bytes_of(rank);
    owned[rank] = shards.owned();
    // Each rank changes its own elements; the broadcast makes both replicas equal again.
    {
      torch::NoGradGuard no_grad;
      for (auto& [name, view] : shards.owned_views()) view.add_(static_cast<double>(rank + 1));
    }
    shards.broadcast_updates(bucket, window);
    for (auto& [n, p] : m.params) after_broadcast[rank][n] = p.detach().clone();
  });
  REQUIRE(errors[0].empty());
  REQUIRE(errors[1].empty());
  INFO("with_unused " << with_unused << ", window " << window << ", bucket " << bucket);
  Replica names(with_unused);
  for (int r = 0; r < 2; ++r) {
    CHECK(grads_released[r]);
    REQUIRE(got[r].size() == owned[r].size());
    int64_t expected_held = 0;
    for (size_t k = 0; k < owned[r].size(); ++k) {
      const auto& piece = owned[r][k];
      const auto& name = names.params[piece.param].first;
      INFO("rank " << r << " " << name << " [" << piece.begin << ", " << piece.end << ")");
      if (!expected.count(name)) {
        CHECK_FALSE(got[r][k].defined());  // no rank used it
        continue;
      }
      REQUIRE(got[r][k].defined());
      const auto want = expected[name].reshape({-1}).narrow(0, piece.begin, piece.numel());
      // Summed per micro-step over ranks, not per rank over micro-steps as `expected` is: float32 rounding of that
      // other order, relative to the tensor's scale (an element-wise bound fails where terms cancel).
      const double err = (got[r][k] - want).abs().max().item<double>();
      CHECK(err <= 1e-6 * want.abs().max().item<double>() + 1e-12);
      expected_held += piece.numel() * static_cast<int64_t>(want.element_size());
    }
    // Held: the owned buckets that carried a gradient (a bucket may also hold zeros of a parameter without one).
    CHECK(held[r] >= expected_held);
    CHECK(held[r] <= owned_bytes[r]);
  }
  // Broadcast: both replicas hold the initial values plus, per element, its owner's rank + 1.
  for (const auto& [name, p] : names.params) {
    INFO(name);
    CHECK(torch::equal(after_broadcast[0][name], after_broadcast[1][name]));
  }
  for (int r = 0; r < 2; ++r) {
    for (const auto& piece : owned[r]) {
      const auto& [name, p] = names.params[piece.param];
      const auto want = p.detach().reshape({-1}).narrow(0, piece.begin, piece.numel()) + (r + 1);
      CHECK(torch::equal(after_broadcast[0][name].reshape({-1}).narrow(0, piece.begin, piece.numel()), want));
    }
  }
}
