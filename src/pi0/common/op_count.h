// Counts the ATen operations a piece of code dispatches, through LibTorch's RecordFunction callbacks. A device-free
// proxy for what a pass costs in launches: on a GPU every operation that computes is at least one kernel launch
// (or one node of a CUDA graph), and at batch 1 the small passes of sampling are bound by their number, not by
// arithmetic. `all` counts every dispatch, views and the operations composite ones dispatch to included; `top`
// only those the calling code made itself (not nested in another one); `kernels` those of `top` that compute: views,
// shape and allocation operations left out, and a cast, reshape or contiguous counted only when it copies (when
// something other than a view is dispatched inside it) — the closest of the three to the launches a GPU makes.
// An operation run by an autograd node in backward is "top" (the node is no operation), so a training step's count
// holds the backward's products too, gradient checkpointing's recomputation included (on the CPU, where backward
// runs on the calling thread).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>

namespace pi0 {

struct OpCount {
  int64_t all = 0;
  int64_t top = 0;
  int64_t kernels = 0;
};

/// Kernels (OpCount::kernels) by where and what: (phase, operation name) → count. The phase is the innermost
/// ProfileScope range open when the operation started (common/profiler.h: "pi0::forward", "pi0::backward", and
/// "pi0::recompute" inside backward), "" outside every range; a cast or reshape that copies counts under its own
/// name ("aten::to"), not the copy it dispatches.
using KernelTally = std::map<std::pair<std::string, std::string>, int64_t>;

/// Counts on the constructing thread while alive (one counter at a time per thread).
class OpCounter {
 public:
  /// `tally`: also count kernels by phase and name (tally(); a string map update per kernel).
  explicit OpCounter(bool tally = false);
  ~OpCounter();
  OpCounter(const OpCounter&) = delete;
  OpCounter& operator=(const OpCounter&) = delete;
  OpCount count() const { return count_; }
  /// Empty unless constructed with `tally`.
  const KernelTally& tally() const { return tally_; }
  /// Whether an OpCounter is counting on this thread (a second one would be refused).
  static bool active();

 private:
  OpCount count_;
  KernelTally tally_;
  uint64_t handle_ = 0;
};

/// The tally's kernels per phase (summed over names), and per name within `phase` (all phases when empty).
std::map<std::string, int64_t> kernels_per_phase(const KernelTally& tally);
std::map<std::string, int64_t> kernels_per_name(const KernelTally& tally, const std::string& phase = "");

}  // namespace pi0
