// Counts the ATen operations a piece of code dispatches, through LibTorch's RecordFunction callbacks. A device-free
// proxy for what a pass costs in launches: on a GPU every operation that computes is at least one kernel launch
// (or one node of a CUDA graph), and at batch 1 the small passes of sampling are bound by their number, not by
// arithmetic. `all` counts every dispatch, views and the operations composite ones dispatch to included; `top`
// only those the calling code made itself (not nested in another one); `kernels` those of `top` that compute: views,
// shape and allocation operations left out, and a cast, reshape or contiguous counted only when it copies (when
// something other than a view is dispatched inside it) — the closest of the three to the launches a GPU makes.
#pragma once
#include <cstdint>

namespace pi0 {

struct OpCount {
  int64_t all = 0;
  int64_t top = 0;
  int64_t kernels = 0;
};

/// Counts on the constructing thread while alive (one counter at a time per thread).
class OpCounter {
 public:
  OpCounter();
  ~OpCounter();
  OpCounter(const OpCounter&) = delete;
  OpCounter& operator=(const OpCounter&) = delete;
  OpCount count() const { return count_; }

 private:
  OpCount count_;
  uint64_t handle_ = 0;
};

}  // namespace pi0
