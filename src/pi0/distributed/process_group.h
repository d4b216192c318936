// A c10d process group for data-parallel training: rendezvous through a TCPStore (rank 0 hosts it, or torchrun's
// agent does), Gloo for CPU tensors, NCCL for CUDA tensors (each rank on cuda:LOCAL_RANK). Every collective is
// bounded by dist.timeout_s: a dead or hung peer makes it throw DistError instead of hanging the job.
// Gloo has no bfloat16 reductions (LibTorch 1.13): bfloat16 tensors travel as float32 there.
// The c10d headers stay in process_group.cpp so the trainer does not compile them.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pi0/distributed/dist_env.h"

namespace pi0::distributed {

/// A collective failed or timed out (a peer died, hung, or the network broke). Names the operation and rank.
class DistError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// An all-reduce in flight. wait() blocks until it completes (or throws DistError).
class PendingWork {
 public:
  virtual ~PendingWork() = default;
  virtual void wait() = 0;
  /// Steady-clock time at which the collective completed, known after wait() (Gloo: measured by the completion
  /// callback; NCCL: the time wait() returned, since completion is on the GPU stream).
  virtual std::chrono::steady_clock::time_point completed_at() const = 0;
};

class ProcessGroup {
 public:
  /// Rendezvous and connect. `device` CPU → Gloo; CUDA → NCCL (only in builds with PI0_WITH_CUDA). `timeout`
  /// bounds the rendezvous and every collective. Blocks until all env.world_size ranks joined.
  ProcessGroup(const DistEnv& env, torch::Device device, std::chrono::milliseconds timeout);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int64_t rank() const { return rank_; }
  int64_t world_size() const { return world_size_; }
  /// Where collective tensors must live: CPU (Gloo) or cuda:local_rank (NCCL).
  torch::Device device() const { return device_; }
  std::string backend_name() const;

  /// Blocks until every rank reached the barrier named `what` (the name appears in the error on timeout).
  void barrier(const std::string& what);
  /// Replaces `tensors` (on device(), contiguous) by rank `root`'s values, in place.
  void broadcast(std::vector<torch::Tensor>& tensors, int64_t root, const std::string& what);
  /// Element-wise sum over ranks, in place. `t` may be on any device; it is moved to device() and back.
  void all_reduce_sum(torch::Tensor& t, const std::string& what);
  /// Every rank's `t` (same shape and dtype everywhere), as CPU tensors indexed by rank.
  std::vector<torch::Tensor> all_gather(const torch::Tensor& t, const std::string& what);
  /// Starts a sum all-reduce of `t` (contiguous, on device()) in place; the caller keeps `t` alive until wait().
  std::unique_ptr<PendingWork> all_reduce_sum_async(torch::Tensor t, const std::string& what);
  /// Starts a sum reduction of every rank's `t` (contiguous, on device(), same shape everywhere) into rank
  /// `root`'s `t`; on the other ranks `t` is scratch afterwards. The caller keeps `t` alive until wait().
  std::unique_ptr<PendingWork> reduce_sum_async(torch::Tensor t, int64_t root, const std::string& what);
  /// Starts a broadcast of rank `root`'s `t` (contiguous, on device()) into every other rank's `t`, in place.
  std::unique_ptr<PendingWork> broadcast_async(torch::Tensor t, int64_t root, const std::string& what);
  /// Rank `root`'s `text`, on every rank.
  std::string broadcast_text(const std::string& text, int64_t root, const std::string& what);

  /// Seconds of dist.timeout_s, for messages.
  double timeout_seconds() const { return static_cast<double>(timeout_.count()) / 1000.0; }

  struct Impl;  ///< the c10d objects (opaque outside process_group.cpp)

 private:
  enum class Collective { kAllReduceSum, kReduceSum, kBroadcast };
  /// Converts `t` for the wire, starts the collective on it and returns the pending work (the async calls above).
  std::unique_ptr<PendingWork> start(Collective collective, torch::Tensor t, int64_t root, const std::string& what);

  std::unique_ptr<Impl> impl_;
  int64_t rank_ = 0, world_size_ = 1;
  torch::Device device_{torch::kCPU};
  std::chrono::milliseconds timeout_;
};

}  // namespace pi0::distributed
