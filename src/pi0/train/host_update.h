// The host side of a training step over float32 master weights in host memory: the stages train.offload=optimizer
// runs for every step (and the plain CPU path runs too, so both stay bit for bit equal), each one pass over memory
// on a pool of threads of its own. bench_host_optimizer --pi0-step replays the same functions on pi0's shapes.
//
//   host_sum_of_squares   a gradient's sum of squares in float64, no temporaries, in an order fixed by the tensor's
//                         size alone (blocks of kHostBlock elements, 8 lanes each, blocks added in order), so any
//                         thread count, and a gradient read as bf16 or as the float32 it converts to, give one value
//   host_accumulate       acc ← src or acc + src (float32 or bf16 src) with the result's sum of squares in the same pass
//   host_update           clipping (a gradient scale), AdamW, the EMA and the next step's compute-dtype weights
//                         (bf16 or float32, written into the staging the device copy is uploaded from) in one pass:
//                         ~30-38 B per parameter instead of the ~120 B of separate passes (docs/memory.md)
//
// Why our own loops and not ATen's: at::_fused_adamw_ cannot take a clip scale without writing the gradient back
// (it divides by grad_scale), nor the EMA or the bf16 copy; a fused pass must then define the arithmetic, so the
// plain path uses the same loops. Elementwise float32 operations (+, ×, ÷, √, each correctly rounded) in a fixed order
// compiled without contraction into FMAs (CMakeLists.txt: -ffp-contract=off for this file) give the same bits at any
// vector width and thread count.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <torch/torch.h>

namespace pi0::train {

/// Elements per task of the host stages: 64 Ki (256 KiB of float32: enough to amortize a hand-off, small enough to
/// spread one Gemma matrix of 33.5 M elements over every thread). Also the block of host_sum_of_squares' fixed order.
constexpr int64_t kHostBlock = int64_t{1} << 16;

/// Threads of its own for the host stages (DeepSpeed's CPU Adam runs on such a pool): `threads` - 1 workers plus the
/// calling thread, independent of ATen's OpenMP teams (each thread calling ATen gets a team of train.num_threads, so
/// teams multiply instead of sharing the cores; this pool is one set).
class HostPool {
 public:
  explicit HostPool(int threads);
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  /// fn(task) for every task in [0, tasks), spread over the pool's threads and the caller's; returns when all are
  /// done and rethrows the first failure. One job at a time (a second caller waits).
  void run(int64_t tasks, const std::function<void(int64_t)>& fn);

 private:
  void work();
  void loop();

  std::mutex job_mutex_;  // one run() at a time
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t tasks_ = 0;
  std::atomic<int64_t> next_{0};
  int64_t generation_ = 0;
  int active_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::vector<std::thread> workers_;  // last: they start after the members they use
};

/// The process's pool for host updates (created at first use with host_pool_threads() threads).
HostPool& host_pool();
/// Its size: set_host_pool_threads(n) (n <= 0: pi0::default_num_threads()); takes effect for a pool not yet created
/// or re-creates it (not while a job runs on it).
void set_host_pool_threads(int n);
int host_pool_threads();

/// Sum of squares of a contiguous host tensor (float32, bfloat16 or float64) in float64, in the fixed order above.
double host_sum_of_squares(const torch::Tensor& t, HostPool& pool);
/// acc (contiguous float32) ← src (first) or acc + src, src contiguous float32 or bfloat16 of acc's size (the sums
/// in float32, as a float32 .grad accumulates); returns acc's new sum of squares (host_sum_of_squares' bits) when
/// `want_sum`, else 0.
double host_accumulate(const torch::Tensor& acc, const torch::Tensor& src, bool first, bool want_sum,
                       HostPool& pool);

/// One parameter of host_update: float32 master, its AdamW moments and EMA average, the gradient (float32 or
/// bfloat16; undefined: no AdamW step for it, as torch skips a parameter without .grad) and `out`, where the new
/// weights go in the compute dtype (bfloat16 or float32; undefined: none). exp_avg/exp_avg_sq undefined: no AdamW;
/// ema undefined: no EMA. All contiguous, in host memory, of one size.
struct HostUpdateTensor {
  torch::Tensor param, grad, exp_avg, exp_avg_sq, ema, out;
};

struct HostUpdateScalars {
  double lr = 0, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0;
  int64_t step = 1;          ///< 1-based AdamW update count (bias corrections)
  double grad_scale = 1.0;   ///< clipping: max_norm / (norm + 1e-6), or 1 (multiplying by 1 changes no bit)
  double ema_decay = 0;      ///< d of ema ← d·ema + (1 − d)·param, after the AdamW step
};

/// Per element, in this order: g·scale (float32); AdamW as torch.optim.AdamW computes it in float32 (p·(1 − lr·wd),
/// m lerped towards g by 1 − β1, v·β2 + (1 − β2)·g², p − lr/(1 − β1ᵗ)·m/(√v/√(1 − β2ᵗ) + ε)); ema·d + p·(1 − d); out
/// ← p in out's dtype (bf16 rounded to nearest even, as ATen converts). Threaded over blocks of kHostBlock elements.
void host_update(const std::vector<HostUpdateTensor>& tensors, const HostUpdateScalars& scalars, HostPool& pool);
/// Whether host_update takes this tensor as `param` (contiguous float32 in host memory) and `grad` (the same size,
/// float32 or bfloat16, contiguous, host memory).
bool host_update_takes(const torch::Tensor& param, const torch::Tensor& grad);

}  // namespace pi0::train
