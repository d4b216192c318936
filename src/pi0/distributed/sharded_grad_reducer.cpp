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
  size_t bucket = 0;
  torch::Tensor flat;
  std::unique_ptr<PendingWork> work;
  int64_t bytes = 0;
};
}  // namespace

struct ShardedGradReducer::State {
  ProcessGroup* pg = nullptr;
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  std::vector<Piece> pieces;                   ///< layout order
  std::vector<PieceBucket> buckets;            ///< layout order
  std::vector<size_t> bucket_of_piece;         ///< piece → bucket
  std::vector<int64_t> offset_of_piece;        ///< piece → element offset in its bucket
  std::vector<std::vector<size_t>> buckets_of;  ///< per parameter, the buckets holding its pieces (1 or 2)
  std::vector<int64_t> slot_of_bucket;         ///< bucket → index into accum, or -1 when another rank owns it
  std::vector<torch::Tensor> accum;            ///< owned buckets' sums over ranks
  std::vector<bool> seen, again, had_grad;     ///< per parameter: seen/again this backward, a gradient this step
  std::vector<int64_t> piece_count;            ///< per parameter, its pieces in the layout
  std::vector<int64_t> unpacked;               ///< per parameter, pieces not yet packed this backward
  size_t next_launch = 0;                      ///< next bucket to launch
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
    const int64_t slot = slot_of_bucket[entry.bucket];
    if (slot < 0) return;  // another rank's bucket: this rank's copy was scratch
    torch::NoGradGuard no_grad;
    auto& acc = accum[static_cast<size_t>(slot)];
    if (acc.defined()) acc.add_(entry.flat);
    else acc = entry.flat;
  }

  // The bucket's gradient ranges, copied into a new flat buffer (zeros where a parameter has no gradient: all ranks
  // run the same graph, so it has none anywhere); a parameter's .grad is released once all its pieces are packed.
  torch::Tensor pack(size_t b) {
    torch::NoGradGuard no_grad;
    const auto& bucket = buckets[b];
    const auto& first = params[pieces[bucket.pieces.front()].param];
    auto flat = torch::empty({bucket.numel}, first.options().requires_grad(false));
    for (size_t j = 0; j < bucket.pieces.size(); ++j) {
      const auto& piece = pieces[bucket.pieces[j]];
      auto& p = params[piece.param];
      auto slice = flat.narrow(0, bucket.offsets[j], piece.numel());
      const auto& g = p.grad();
      if (g.defined()) {
        PI0_CHECK(g.is_contiguous(), "ShardedGradReducer: gradient of '", names[piece.param], "' is not contiguous");
        auto range = flat_range(g, piece.begin, piece.end);
        slice.copy_(range);
        had_grad[piece.param] = true;
        // A parameter split over two buckets keeps its .grad until both are packed: clear the range that left, so
        // a later accumulation into it (re-entrant checkpointing) holds only what the re-reduction must add.
        if (unpacked[piece.param] > 1) range.zero_();
      } else {
        slice.zero_();
      }
      if (--unpacked[piece.param] == 0) p.mutable_grad() = torch::Tensor();
    }
    return flat;
  }

  void launch(size_t b) {
    // No gradient in the whole bucket (on this rank, hence on all: the same graph): nothing to send or keep.
    bool any = false;
    for (size_t k : buckets[b].pieces) any = any || params[pieces[k].param].grad().defined();
    if (!any) {
      for (size_t k : buckets[b].pieces)
        if (--unpacked[pieces[k].param] == 0) params[pieces[k].param].mutable_grad() = torch::Tensor();
      return;
    }
    if (!any_launched) {
      any_launched = true;
      first_launch = Clock::now();
    }
    InFlight entry;
    entry.bucket = b;
    entry.flat = pack(b);
    entry.bytes = entry.flat.numel() * static_cast<int64_t>(entry.flat.element_size());
    entry.work = pg->reduce_sum_async(entry.flat, buckets[b].owner,
                                      "gradient reduce (bucket " + std::to_string(b) + " of " +
                                          std::to_string(buckets.size()) + ", '" +
                                          names[pieces[buckets[b].pieces.front()].param] + "')");
    in_flight_bytes += entry.bytes;
    in_flight.push_back(std::move(entry));
    while (in_flight_bytes > window_bytes && in_flight.size() > 1) complete_oldest();
  }

  bool ready(size_t b) const {
    for (size_t k : buckets[b].pieces)
      if (!seen[pieces[k].param]) return false;
    return true;
  }

  // Launches, in bucket order, every bucket whose gradients are complete; stops at the first that is not.
  void launch_ready() {
    while (next_launch < buckets.size() && ready(next_launch)) launch(next_launch++);
  }

  void on_grad_accumulated(size_t i) {
    std::lock_guard<std::mutex> lock(mutex);
    if (seen[i]) {
      // Accumulated again after its bucket left (re-entrant checkpointing): reduced again in wait().
      for (size_t b : buckets_of[i])
        if (b < next_launch) again[i] = true;
      return;
    }
    seen[i] = true;
    launch_ready();
  }
};

ShardedGradReducer::ShardedGradReducer(ProcessGroup& pg, std::vector<std::pair<std::string, torch::Tensor>> params,
                                       const ShardLayout& layout, int64_t bucket_bytes, int64_t window_bytes)
    : state_(std::make_shared<State>()) {
  auto& s = *state_;
  s.pg = &pg;
  s.window_bytes = window_bytes;
  std::vector<int> kinds;  // one dtype per bucket
  for (auto& [name, p] : params) {
    PI0_CHECK(p.device() == pg.device(), "ShardedGradReducer: '", name, "' is on ", p.device().str(), ", expected ",
              pg.device().str());
    s.names.push_back(name);
    s.params.push_back(p);
    kinds.push_back(static_cast<int>(p.scalar_type()));
  }
  PI0_CHECK(layout.world_size() == pg.world_size(), "ShardedGradReducer: layout for another world size");
  s.pieces = layout.pieces();
  s.buckets = layout.buckets(bucket_bytes, kinds);
  s.bucket_of_piece.resize(s.pieces.size());
  s.offset_of_piece.resize(s.pieces.size());
  s.buckets_of.resize(s.params.size());
  for (size_t b = 0; b < s.buckets.size(); ++b) {
    const auto& bucket = s.buckets[b];
    for (size_t j = 0; j < bucket.pieces.size(); ++j) {
      const size_t k = bucket.pieces[j];
      PI0_CHECK(s.pieces[k].param < s.params.size(), "ShardedGradReducer: layout for other parameters");
      s.bucket_of_piece[k] = b;
      s.offset_of_piece[k] = bucket.offsets[j];
      auto& of = s.buckets_of[s.pieces[k].param];
      if (of.empty() || of.back() != b) of.push_back(b);
    }
    s.slot_of_bucket.push_back(bucket.owner == pg.rank() ? static_cast<int64_t>(s.accum.size()) : -1);
    if (bucket.owner == pg.rank()) s.accum.emplace_back();
  }
  s.seen.assign(s.params.size(), false);
  s.again = s.had_grad = s.seen;
  s.piece_count.assign(s.params.size(), 0);
  for (const auto& piece : s.pieces) ++s.piece_count[piece.param];
  s.unpacked = s.piece_count;
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
  // Parameters that got no gradient count as zeros, alike on every rank; the rest launch in bucket order.
  std::fill(s.seen.begin(), s.seen.end(), true);
  s.launch_ready();
  while (!s.in_flight.empty()) s.complete_oldest();
  // Parameters accumulated again after their bucket left hold only the later part: reduce their buckets again
  // (the other gradients in them were released, so they add zeros).
  std::vector<bool> rerun(s.buckets.size(), false);
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (!s.again[i]) continue;
    for (size_t b : s.buckets_of[i]) rerun[b] = true;
    s.unpacked[i] = s.piece_count[i];  // its buckets hold all its pieces: released once they are packed again
  }
  for (size_t b = 0; b < s.buckets.size(); ++b) {
    if (!rerun[b]) continue;
    ++s.stats.rereductions;
    s.launch(b);
  }
  while (!s.in_flight.empty()) s.complete_oldest();
  for (auto& p : s.params) p.mutable_grad() = torch::Tensor();
  const auto end = Clock::now();
  s.stats.wait_seconds += std::chrono::duration<double>(end - start).count();
  if (s.any_launched) s.stats.comm_seconds += std::chrono::duration<double>(s.last_done - s.first_launch).count();
  ++s.stats.steps;
  std::fill(s.seen.begin(), s.seen.end(), false);
  std::fill(s.again.begin(), s.again.end(), false);
  s.unpacked = s.piece_count;
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
  // One view per owned piece, in layout order (what ParameterShards::owned() lists).
  std::vector<torch::Tensor> out;
  for (size_t k = 0; k < s.pieces.size(); ++k) {
    const auto& piece = s.pieces[k];
    if (piece.owner != s.pg->rank()) continue;
    const auto& acc = s.accum[static_cast<size_t>(s.slot_of_bucket[s.bucket_of_piece[k]])];
    out.push_back(acc.defined() && s.had_grad[piece.param] ? acc.narrow(0, s.offset_of_piece[k], piece.numel())
                                                          : torch::Tensor());
  }
  return out;
}

void ShardedGradReducer::clear() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  for (auto& a : state_->accum) a = torch::Tensor();
  std::fill(state_->had_grad.begin(), state_->had_grad.end(), false);
}

int64_t ShardedGradReducer::held_bytes() const {
  int64_t n = 0;
  for (const auto& a : state_->accum)
    if (a.defined()) n += a.numel() * static_cast<int64_t>(a.element_size());
  return n;
}

const GradReducerStats& ShardedGradReducer::stats() const { return state_->stats; }

}  // namespace pi0::distributed
