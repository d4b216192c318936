#include "pi0/distributed/grad_reducer.h"

#include <map>
#include <mutex>

#include "pi0/common/check.h"
#include "pi0/distributed/grad_hooks.h"

namespace pi0::distributed {
namespace {
using Clock = std::chrono::steady_clock;

struct Bucket {
  std::vector<size_t> params;  ///< indices into State::params
  std::vector<int64_t> offsets;
  int64_t numel = 0;
  torch::TensorOptions options;  ///< one dtype, on the process group's device
  torch::Tensor flat;            ///< from launch to wait(); then the gradients are views of it
  int64_t pending = 0;           ///< gradients not yet accumulated in this backward
  bool launched = false, rerun = false;
  std::unique_ptr<PendingWork> work;
};
}  // namespace

struct GradReducer::State {
  ProcessGroup* pg = nullptr;
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  std::vector<size_t> bucket_of;
  std::vector<bool> seen;
  std::vector<bool> had_grad;  ///< per parameter: a gradient was packed this step
  std::vector<Bucket> buckets;
  size_t next_launch = 0;
  bool sync = true;
  bool any_launched = false;
  Clock::time_point first_launch;
  GradReducerStats stats;
  std::unique_ptr<GradAccumulationHooks> hooks;
  std::mutex mutex;

  // The bucket's gradients, copied into a new flat buffer and released: from here until wait() hands the averages
  // back as views of the buffer, a rank holds each gradient once (not a gradient and a bucket copy of it).
  torch::Tensor pack(Bucket& bucket) {
    torch::NoGradGuard no_grad;
    auto flat = torch::empty({bucket.numel}, bucket.options);
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      auto& p = params[bucket.params[k]];
      auto slice = flat.narrow(0, bucket.offsets[k], p.numel());
      if (p.grad().defined()) {
        slice.copy_(p.grad().reshape({-1}));
        had_grad[bucket.params[k]] = true;
        p.mutable_grad() = torch::Tensor();
      } else {
        slice.zero_();  // unused on this rank this step; all ranks run the same graph, so unused everywhere
      }
    }
    return flat;
  }

  void launch(size_t b) {
    auto& bucket = buckets[b];
    bucket.flat = pack(bucket);
    if (!any_launched) {
      any_launched = true;
      first_launch = Clock::now();
    }
    bucket.work = pg->all_reduce_sum_async(bucket.flat, "gradient all-reduce (bucket " + std::to_string(b) + " of " +
                                                            std::to_string(buckets.size()) + ")");
    bucket.launched = true;
  }

  void on_grad_accumulated(size_t i) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!sync) return;
    auto& bucket = buckets[bucket_of[i]];
    if (seen[i]) {
      // Accumulated again in the same backward (re-entrant checkpointing): if the bucket already left, the new
      // .grad holds only the later part; wait() reduces it too and adds it.
      if (bucket.launched) bucket.rerun = true;
      return;
    }
    seen[i] = true;
    --bucket.pending;
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) launch(next_launch++);
  }
};


GradReducer::GradReducer(ProcessGroup& pg, std::vector<std::pair<std::string, torch::Tensor>> params,
                         int64_t bucket_bytes)
    : state_(std::make_shared<State>()) {
  auto& s = *state_;
  s.pg = &pg;
  for (auto& [name, p] : params) {
    PI0_CHECK(p.requires_grad() && p.is_leaf(), "GradReducer: '", name, "' is not a trainable leaf parameter");
    PI0_CHECK(p.device() == pg.device(), "GradReducer: '", name, "' is on ", p.device().str(), ", expected ",
              pg.device().str());
    s.names.push_back(name);
    s.params.push_back(p);
  }
  s.bucket_of.resize(s.params.size());
  s.seen.assign(s.params.size(), false);
  s.had_grad = s.seen;
  // Reverse registration order ≈ the order backward produces gradients; one open bucket per dtype.
  std::map<c10::ScalarType, size_t> open;
  std::vector<int64_t> bytes;
  for (size_t i = s.params.size(); i-- > 0;) {
    const auto& p = s.params[i];
    const auto dtype = p.scalar_type();
    const int64_t nbytes = p.numel() * static_cast<int64_t>(p.element_size());
    auto it = open.find(dtype);
    if (it == open.end() || (bytes[it->second] > 0 && bytes[it->second] + nbytes > bucket_bytes)) {
      s.buckets.emplace_back();
      bytes.push_back(0);
      it = open.insert_or_assign(dtype, s.buckets.size() - 1).first;
    }
    auto& bucket = s.buckets[it->second];
    bucket.offsets.push_back(bytes[it->second] / static_cast<int64_t>(p.element_size()));
    bucket.params.push_back(i);
    bytes[it->second] += nbytes;
    s.bucket_of[i] = it->second;
  }
  for (size_t b = 0; b < s.buckets.size(); ++b) {
    auto& bucket = s.buckets[b];
    const auto& last = s.params[bucket.params.back()];
    bucket.numel = bucket.offsets.back() + last.numel();
    bucket.options = last.options().requires_grad(false);
    bucket.pending = static_cast<int64_t>(bucket.params.size());
  }
  std::weak_ptr<State> weak = state_;
  s.hooks = std::make_unique<GradAccumulationHooks>(s.params, [weak](size_t i) {
    if (auto state = weak.lock()) state->on_grad_accumulated(i);
  });
}

GradReducer::~GradReducer() { state_->hooks.reset(); }

void GradReducer::enable_sync(bool sync) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->sync = sync;
}

void GradReducer::wait() {
  auto& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  const auto start = Clock::now();
  // Buckets whose gradients never all arrived (unused parameters), in index order like every other launch.
  while (s.next_launch < s.buckets.size()) {
    ++s.stats.late_launches;
    s.launch(s.next_launch++);
  }
  Clock::time_point last_done = start;
  for (size_t b = 0; b < s.buckets.size(); ++b) {
    auto& bucket = s.buckets[b];
    bucket.work->wait();
    last_done = std::max(last_done, bucket.work->completed_at());
    if (bucket.rerun) {
      ++s.stats.rereductions;
      auto extra = s.pack(bucket);
      auto work = s.pg->all_reduce_sum_async(extra, "gradient re-reduction (bucket " + std::to_string(b) + ")");
      work->wait();
      last_done = std::max(last_done, work->completed_at());
      torch::NoGradGuard no_grad;
      bucket.flat.add_(extra);
    }
  }
  const double world = static_cast<double>(s.pg->world_size());
  {
    // The averages become the gradients, as views of the buckets (no copy back, no second buffer).
    torch::NoGradGuard no_grad;
    for (auto& bucket : s.buckets) {
      bucket.flat.div_(world);
      for (size_t k = 0; k < bucket.params.size(); ++k) {
        const size_t i = bucket.params[k];
        auto& p = s.params[i];
        if (s.had_grad[i]) p.mutable_grad() = bucket.flat.narrow(0, bucket.offsets[k], p.numel()).view(p.sizes());
      }
      bucket.flat = torch::Tensor();  // the gradients keep it alive until they are dropped
      bucket.work.reset();
      bucket.launched = bucket.rerun = false;
      bucket.pending = static_cast<int64_t>(bucket.params.size());
    }
  }
  const auto end = Clock::now();
  s.stats.wait_seconds += std::chrono::duration<double>(end - start).count();
  s.stats.comm_seconds += std::chrono::duration<double>(last_done - s.first_launch).count();
  ++s.stats.steps;
  std::fill(s.seen.begin(), s.seen.end(), false);
  std::fill(s.had_grad.begin(), s.had_grad.end(), false);
  s.next_launch = 0;
  s.any_launched = false;
}

int64_t GradReducer::num_buckets() const { return static_cast<int64_t>(state_->buckets.size()); }

std::vector<std::vector<std::string>> GradReducer::bucket_names() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : state_->buckets) {
    out.emplace_back();
    for (size_t i : b.params) out.back().push_back(state_->names[i]);
  }
  return out;
}

const GradReducerStats& GradReducer::stats() const { return state_->stats; }

}  // namespace pi0::distributed
