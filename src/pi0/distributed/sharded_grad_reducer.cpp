#include "pi0/distributed/sharded_grad_reducer.h"

#include <chrono>
#include <deque>
#include <mutex>

#include "pi0/common/check.h"
#include "pi0/distributed/grad_hooks.h"
#include "pi0/distributed/parameter_shards.h"

namespace pi0::distributed {
namespace {
using Clock = std::chrono::steady_clock;

struct InFlight {
  size_t piece = 0;  ///< index into layout pieces
  torch::Tensor data;
  std::unique_ptr<PendingWork> work;
  int64_t bytes = 0;
};
}  // namespace

struct ShardedGradReducer::State {
  ProcessGroup* pg = nullptr;
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  std::vector<Piece> pieces;                 ///< layout order
  std::vector<std::vector<size_t>> pieces_of;  ///< per parameter, indices into pieces
  std::vector<int64_t> owned_slot;           ///< per piece: index into accum, or -1 when another rank owns it
  std::vector<torch::Tensor> accum;          ///< owned pieces' sums over ranks
  std::vector<bool> seen, launched, again;   ///< per parameter, this backward
  size_t next_launch = 0;
  std::deque<InFlight> in_flight;
  int64_t in_flight_bytes = 0, window_bytes = 0;
  bool any_launched = false;
  Clock::time_point first_launch, last_done;
  GradReducerStats stats;
  std::unique_ptr<GradAccumulationHooks> hooks;
  std::mutex mutex;

  void complete_oldest() {
    auto entry = std::move(in_flight.front());
    in_flight.pop_front();
    in_flight_bytes -= entry.bytes;
    entry.work->wait();
    last_done = std::max(last_done, entry.work->completed_at());
    const int64_t slot = owned_slot[entry.piece];
    if (slot < 0) return;  // another rank's piece: this rank's copy was scratch
    torch::NoGradGuard no_grad;
    auto& acc = accum[static_cast<size_t>(slot)];
    if (acc.defined()) {
      acc.add_(entry.data);
    } else if (entry.data.numel() * static_cast<int64_t>(entry.data.element_size()) ==
               static_cast<int64_t>(entry.data.storage().nbytes())) {
      acc = entry.data;  // the whole released .grad: keep it, no copy
    } else {
      acc = entry.data.clone();  // part of a split parameter's .grad: do not keep the rest alive
    }
  }

  void launch_param(size_t i) {
    auto g = params[i].grad();
    launched[i] = true;
    if (!g.defined()) return;
    if (!g.is_contiguous()) g = g.contiguous();
    if (!any_launched) {
      any_launched = true;
      first_launch = Clock::now();
    }
    for (size_t k : pieces_of[i]) {
      const auto& piece = pieces[k];
      InFlight entry;
      entry.piece = k;
      entry.data = flat_range(g, piece.begin, piece.end);
      entry.bytes = entry.data.numel() * static_cast<int64_t>(entry.data.element_size());
      entry.work = pg->reduce_sum_async(entry.data, piece.owner, "gradient reduce ('" + names[i] + "')");
      in_flight_bytes += entry.bytes;
      in_flight.push_back(std::move(entry));
      while (in_flight_bytes > window_bytes && in_flight.size() > 1) complete_oldest();
    }
    params[i].mutable_grad() = torch::Tensor();  // the reductions hold what they need
  }

  // Launches, in layout order, every parameter whose gradient is complete; stops at the first that is not.
  void launch_ready() {
    while (next_launch < pieces.size()) {
      const size_t i = pieces[next_launch].param;
      if (!seen[i]) return;
      if (!launched[i]) launch_param(i);
      next_launch += 1;
    }
  }

  void on_grad_accumulated(size_t i) {
    std::lock_guard<std::mutex> lock(mutex);
    if (seen[i]) {
      if (launched[i]) again[i] = true;
      return;
    }
    seen[i] = true;
    launch_ready();
  }
};

ShardedGradReducer::ShardedGradReducer(ProcessGroup& pg, std::vector<std::pair<std::string, torch::Tensor>> params,
                                       const ShardLayout& layout, int64_t window_bytes)
    : state_(std::make_shared<State>()) {
  auto& s = *state_;
  s.pg = &pg;
  s.window_bytes = window_bytes;
  for (auto& [name, p] : params) {
    PI0_CHECK(p.device() == pg.device(), "ShardedGradReducer: '", name, "' is on ", p.device().str(), ", expected ",
              pg.device().str());
    s.names.push_back(name);
    s.params.push_back(p);
  }
  PI0_CHECK(layout.world_size() == pg.world_size(), "ShardedGradReducer: layout for another world size");
  s.pieces = layout.pieces();
  s.pieces_of.resize(s.params.size());
  for (size_t k = 0; k < s.pieces.size(); ++k) {
    PI0_CHECK(s.pieces[k].param < s.params.size(), "ShardedGradReducer: layout for other parameters");
    s.pieces_of[s.pieces[k].param].push_back(k);
    s.owned_slot.push_back(s.pieces[k].owner == pg.rank() ? static_cast<int64_t>(s.accum.size()) : -1);
    if (s.pieces[k].owner == pg.rank()) s.accum.emplace_back();
  }
  s.seen.assign(s.params.size(), false);
  s.launched = s.again = s.seen;
  std::weak_ptr<State> weak = state_;
  s.hooks = std::make_unique<GradAccumulationHooks>(s.params, [weak](size_t i) {
    if (auto state = weak.lock()) state->on_grad_accumulated(i);
  });
}

ShardedGradReducer::~ShardedGradReducer() { state_->hooks.reset(); }

void ShardedGradReducer::wait() {
  auto& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  const auto start = Clock::now();
  s.last_done = start;
  // Parameters that got no gradient are skipped alike on every rank; the rest launch in layout order.
  for (size_t i = 0; i < s.seen.size(); ++i) s.seen[i] = true;
  s.launch_ready();
  while (!s.in_flight.empty()) s.complete_oldest();
  for (size_t k = 0; k < s.pieces.size(); ++k) {
    const size_t i = s.pieces[k].param;
    if (!s.again[i]) continue;
    s.again[i] = false;
    ++s.stats.rereductions;
    s.launch_param(i);
  }
  while (!s.in_flight.empty()) s.complete_oldest();
  const auto end = Clock::now();
  s.stats.wait_seconds += std::chrono::duration<double>(end - start).count();
  if (s.any_launched) s.stats.comm_seconds += std::chrono::duration<double>(s.last_done - s.first_launch).count();
  ++s.stats.steps;
  std::fill(s.seen.begin(), s.seen.end(), false);
  std::fill(s.launched.begin(), s.launched.end(), false);
  s.next_launch = 0;
  s.any_launched = false;
}

std::vector<torch::Tensor> ShardedGradReducer::finish_step() {
  auto& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  torch::NoGradGuard no_grad;
  const double world = static_cast<double>(s.pg->world_size());
  for (auto& a : s.accum)
    if (a.defined()) a.div_(world);
  return s.accum;
}

void ShardedGradReducer::clear() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  for (auto& a : state_->accum) a = torch::Tensor();
}

int64_t ShardedGradReducer::held_bytes() const {
  int64_t n = 0;
  for (const auto& a : state_->accum)
    if (a.defined()) n += a.numel() * static_cast<int64_t>(a.element_size());
  return n;
}

const GradReducerStats& ShardedGradReducer::stats() const { return state_->stats; }

}  // namespace pi0::distributed
