// The host stages of a training step (host_update.h). Compiled with -O3 -ffp-contract=off -fno-math-errno
// (CMakeLists.txt): loops vectorize, no multiply-add is fused (the bits must not depend on the vector width), and √
// is the instruction (errno is never read).
#include "pi0/train/host_update.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "pi0/common/check.h"
#include "pi0/common/threads.h"

namespace pi0::train {

// ---- the pool ----

HostPool::HostPool(int threads) {
  for (int i = 1; i < std::max(threads, 1); ++i) workers_.emplace_back([this] { loop(); });
}

HostPool::~HostPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void HostPool::work() {
  for (;;) {
    const int64_t t = next_.fetch_add(1, std::memory_order_relaxed);
    if (t >= tasks_) return;
    try {
      (*fn_)(t);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
      next_.store(tasks_, std::memory_order_relaxed);  // the others stop taking tasks
    }
  }
}

void HostPool::loop() {
  int64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    work();
    std::lock_guard<std::mutex> lock(mutex_);
    if (--active_ == 0) done_.notify_all();
  }
}

void HostPool::run(int64_t tasks, const std::function<void(int64_t)>& fn) {
  if (tasks <= 0) return;
  if (workers_.empty() || tasks == 1) {
    for (int64_t t = 0; t < tasks; ++t) fn(t);
    return;
  }
  std::lock_guard<std::mutex> job(job_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fn_ = &fn;
    tasks_ = tasks;
    next_.store(0, std::memory_order_relaxed);
    error_ = nullptr;
    active_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  wake_.notify_all();
  work();
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return active_ == 0; });
    error = error_;
    error_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

namespace {
std::mutex g_pool_mutex;
std::unique_ptr<HostPool> g_pool;
int g_pool_threads = 0;  // 0: default_num_threads()
}  // namespace

int host_pool_threads() {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  return g_pool_threads > 0 ? g_pool_threads : default_num_threads();
}

void set_host_pool_threads(int n) {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  g_pool_threads = n;
  const int want = n > 0 ? n : default_num_threads();
  if (g_pool && g_pool->threads() != want) g_pool = std::make_unique<HostPool>(want);
}

HostPool& host_pool() {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  if (!g_pool) g_pool = std::make_unique<HostPool>(g_pool_threads > 0 ? g_pool_threads : default_num_threads());
  return *g_pool;
}

// ---- per-block kernels ----

namespace {

inline float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// c10::BFloat16's conversion (round to nearest even; NaN → the canonical quiet NaN), so an uploaded copy equals
// ATen's master.to(bf16).
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t rounded = (u + (((u >> 16) & 1u) + 0x7FFFu)) >> 16;
  return f != f ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
}

// Elements per chunk inside a block: a bf16 operand is converted to float32 into a stack buffer first and the bf16
// output written from the updated float32 weights after, so each loop has one element width and vectorizes (GCC
// vectorizes none of the mixed-width loop). 2 KiB per buffer: it stays in L1.
constexpr int64_t kChunk = 512;

inline void bf16_to_float_n(const uint16_t* __restrict__ in, float* __restrict__ out, int64_t n) {
  for (int64_t k = 0; k < n; ++k) out[k] = bf16_to_float(in[k]);
}
inline void float_to_bf16_n(const float* __restrict__ in, uint16_t* __restrict__ out, int64_t n) {
  for (int64_t k = 0; k < n; ++k) out[k] = float_to_bf16(in[k]);
}

enum class Kind { kNone, kF32, kBF16 };

Kind kind_of(const torch::Tensor& t, const char* what) {
  if (!t.defined()) return Kind::kNone;
  if (t.scalar_type() == torch::kFloat32) return Kind::kF32;
  if (t.scalar_type() == torch::kBFloat16) return Kind::kBF16;
  PI0_CHECK(false, "host stages: ", what, " must be float32 or bfloat16, got ", t.scalar_type());
  return Kind::kNone;
}

// Elements [offset, offset + n) of a float32 or bf16 operand as float32: the operand itself, or (bf16) its conversion
// into `buf` (kChunk floats).
template <Kind K>
const float* chunk_as_float(const void* src, int64_t offset, int64_t n, float* buf) {
  if constexpr (K == Kind::kBF16) {
    bf16_to_float_n(static_cast<const uint16_t*>(src) + offset, buf, n);
    return buf;
  } else {
    return static_cast<const float*>(src) + offset;
  }
}

// Sum of squares of one block: 8 lanes, lane j taking elements j, j + 8, ... (and the tail element k in lane k % 8),
// added as a fixed tree. Independent lanes let the compiler vectorize without reassociating. lanes_add may be called
// on consecutive pieces of a block whose lengths are multiples of 8 (all but the last): the order is the same.
template <class T>
void lanes_add(double* __restrict__ lane, const T* __restrict__ x, int64_t n) {
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int j = 0; j < 8; ++j) {
      const double v = static_cast<double>(x[k + j]);
      lane[j] += v * v;
    }
  for (; k < n; ++k) {
    const double v = static_cast<double>(x[k]);
    lane[k & 7] += v * v;
  }
}
double lanes_total(const double* lane) {
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}
template <class T>
double block_sum_of_squares(const T* x, int64_t n) {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  lanes_add(lane, x, n);
  return lanes_total(lane);
}

// A block [b, e) of a float32 or bf16 tensor, a chunk at a time (bf16 converted first, so each loop has one
// element width and vectorizes): the same values in the same order whichever the dtype.
template <Kind K>
double chunked_sum_of_squares(const void* src, int64_t b, int64_t e) {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  alignas(64) float buf[kChunk];
  for (int64_t c0 = b; c0 < e; c0 += kChunk) {
    const int64_t cn = std::min(kChunk, e - c0);
    lanes_add(lane, chunk_as_float<K>(src, c0, cn, buf), cn);
  }
  return lanes_total(lane);
}

int64_t blocks_of(int64_t n) { return (n + kHostBlock - 1) / kHostBlock; }

// Runs fn(block, begin, end) over a tensor's blocks (one task each), then adds the per-block results in block order.
template <class Fn>
double over_blocks(int64_t n, HostPool& pool, Fn fn) {
  const int64_t blocks = blocks_of(n);
  if (blocks <= 1) return n > 0 ? fn(int64_t{0}, n) : 0.0;
  std::vector<double> partial(static_cast<size_t>(blocks));
  pool.run(blocks, [&](int64_t b) {
    const int64_t begin = b * kHostBlock;
    partial[static_cast<size_t>(b)] = fn(begin, std::min(n, begin + kHostBlock));
  });
  double total = 0;
  for (const double p : partial) total += p;
  return total;
}

void check_host_contiguous(const torch::Tensor& t, const char* what) {
  PI0_CHECK(t.device().is_cpu() && t.is_contiguous(), "host stages: ", what, " must be contiguous in host memory");
}

}  // namespace

double host_sum_of_squares(const torch::Tensor& t, HostPool& pool) {
  check_host_contiguous(t, "the tensor");
  const int64_t n = t.numel();
  const void* p = t.data_ptr();
  switch (t.scalar_type()) {
    case torch::kFloat32:
      return over_blocks(n, pool, [&](int64_t b, int64_t e) { return chunked_sum_of_squares<Kind::kF32>(p, b, e); });
    case torch::kBFloat16:
      return over_blocks(n, pool, [&](int64_t b, int64_t e) { return chunked_sum_of_squares<Kind::kBF16>(p, b, e); });
    case torch::kFloat64:
      return over_blocks(n, pool, [&](int64_t b, int64_t e) {
        return block_sum_of_squares(static_cast<const double*>(p) + b, e - b);
      });
    default:
      PI0_CHECK(false, "host_sum_of_squares: float32, bfloat16 or float64 expected, got ", t.scalar_type());
  }
  return 0;
}

namespace {

template <Kind S>
double accumulate_block(float* a, const void* src, int64_t b, int64_t e, bool first, bool want_sum) {
  alignas(64) float buf[kChunk];
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t c0 = b; c0 < e; c0 += kChunk) {
    const int64_t cn = std::min(kChunk, e - c0);
    float* __restrict__ acc = a + c0;
    const float* __restrict__ x = chunk_as_float<S>(src, c0, cn, buf);
    if (first) {
      for (int64_t k = 0; k < cn; ++k) acc[k] = x[k];
    } else {
      for (int64_t k = 0; k < cn; ++k) acc[k] = acc[k] + x[k];
    }
    // Read back while the chunk is in cache: the same values, in the same order, as host_sum_of_squares(acc).
    if (want_sum) lanes_add(lane, acc, cn);
  }
  return want_sum ? lanes_total(lane) : 0.0;
}

}  // namespace

double host_accumulate(const torch::Tensor& acc, const torch::Tensor& src, bool first, bool want_sum,
                       HostPool& pool) {
  check_host_contiguous(acc, "the accumulation");
  check_host_contiguous(src, "the gradient");
  PI0_CHECK(acc.scalar_type() == torch::kFloat32 && acc.numel() == src.numel(),
            "host_accumulate: a float32 accumulation of the gradient's size expected");
  auto* a = acc.data_ptr<float>();
  const void* s = src.data_ptr();
  const Kind k = kind_of(src, "the gradient");
  return over_blocks(acc.numel(), pool, [&](int64_t b, int64_t e) {
    return k == Kind::kBF16 ? accumulate_block<Kind::kBF16>(a, s, b, e, first, want_sum)
                            : accumulate_block<Kind::kF32>(a, s, b, e, first, want_sum);
  });
}

namespace {

struct Derived {
  float scale, decay, w1, b2, w2, eps, bc2, neg_step_size, ema_d, ema_w;
};

// One block of one parameter. G: the gradient's kind (kNone: no AdamW); O: the output's kind; ema: whether there
// is an average. The AdamW lines are host_adamw_step's of LibTorch 1.13 (the loop before this file), unchanged.
template <Kind G, Kind O, bool kEma>
void update_block(const HostUpdateTensor& t, const Derived& c, int64_t b, int64_t e) {
  float* const p0 = t.param.data_ptr<float>() + b;
  float* const m0 = G != Kind::kNone ? t.exp_avg.data_ptr<float>() + b : nullptr;
  float* const v0 = G != Kind::kNone ? t.exp_avg_sq.data_ptr<float>() + b : nullptr;
  float* const avg0 = kEma ? t.ema.data_ptr<float>() + b : nullptr;
  void* const out0 = O != Kind::kNone ? t.out.data_ptr() : nullptr;
  const void* const g0 = G != Kind::kNone ? t.grad.data_ptr() : nullptr;
  alignas(64) float gbuf[kChunk];
  const int64_t n = e - b;
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t cn = std::min(kChunk, n - c0);
    float* __restrict__ p = p0 + c0;
    if constexpr (G != Kind::kNone) {
      const float* __restrict__ g = chunk_as_float<G>(g0, b + c0, cn, gbuf);
      float* __restrict__ m = m0 + c0;
      float* __restrict__ v = v0 + c0;
      for (int64_t k = 0; k < cn; ++k) {
        const float gk = g[k] * c.scale;
        const float mk = m[k] + c.w1 * (gk - m[k]);  // lerp with a weight below 1/2, as ATen computes it
        const float vk = v[k] * c.b2 + c.w2 * gk * gk;
        m[k] = mk;
        v[k] = vk;
        p[k] = p[k] * c.decay + c.neg_step_size * mk / (std::sqrt(vk) / c.bc2 + c.eps);
      }
    }
    if constexpr (kEma) {
      float* __restrict__ avg = avg0 + c0;
      for (int64_t k = 0; k < cn; ++k) avg[k] = avg[k] * c.ema_d + p[k] * c.ema_w;
    }
    if constexpr (O == Kind::kF32) std::memcpy(static_cast<float*>(out0) + b + c0, p, static_cast<size_t>(cn) * 4);
    if constexpr (O == Kind::kBF16) float_to_bf16_n(p, static_cast<uint16_t*>(out0) + b + c0, cn);
  }
}

using BlockFn = void (*)(const HostUpdateTensor&, const Derived&, int64_t, int64_t);

template <Kind G, Kind O>
BlockFn pick_ema(bool ema) {
  return ema ? &update_block<G, O, true> : &update_block<G, O, false>;
}
template <Kind G>
BlockFn pick_out(Kind o, bool ema) {
  switch (o) {
    case Kind::kF32: return pick_ema<G, Kind::kF32>(ema);
    case Kind::kBF16: return pick_ema<G, Kind::kBF16>(ema);
    default: return pick_ema<G, Kind::kNone>(ema);
  }
}
BlockFn pick(Kind g, Kind o, bool ema) {
  switch (g) {
    case Kind::kF32: return pick_out<Kind::kF32>(o, ema);
    case Kind::kBF16: return pick_out<Kind::kBF16>(o, ema);
    default: return pick_out<Kind::kNone>(o, ema);
  }
}

}  // namespace

bool host_update_takes(const torch::Tensor& param, const torch::Tensor& grad) {
  auto host = [](const torch::Tensor& t) { return t.device().is_cpu() && t.is_contiguous(); };
  return host(param) && param.scalar_type() == torch::kFloat32 && host(grad) &&
         (grad.scalar_type() == torch::kFloat32 || grad.scalar_type() == torch::kBFloat16) &&
         grad.numel() == param.numel();
}

void host_update(const std::vector<HostUpdateTensor>& tensors, const HostUpdateScalars& s, HostPool& pool) {
  // Scalars rounded to float once, as ATen's float kernels round theirs.
  const double step = static_cast<double>(s.step);
  Derived c{};
  c.scale = static_cast<float>(s.grad_scale);
  c.decay = static_cast<float>(1.0 - s.lr * s.weight_decay);
  c.w1 = static_cast<float>(1.0 - s.beta1);
  c.b2 = static_cast<float>(s.beta2);
  c.w2 = static_cast<float>(1.0 - s.beta2);
  c.eps = static_cast<float>(s.eps);
  c.bc2 = static_cast<float>(std::sqrt(1.0 - std::pow(s.beta2, step)));
  c.neg_step_size = static_cast<float>(-s.lr / (1.0 - std::pow(s.beta1, step)));
  c.ema_d = static_cast<float>(s.ema_decay);
  c.ema_w = static_cast<float>(1.0 - s.ema_decay);
  // Every block of every tensor is one task: one pool job for the whole list (a layer group: 16-18 tensors).
  std::vector<BlockFn> fns;
  std::vector<int64_t> first_task;
  int64_t tasks = 0;
  for (const auto& t : tensors) {
    check_host_contiguous(t.param, "a master weight");
    PI0_CHECK(t.param.scalar_type() == torch::kFloat32, "host_update: float32 master weights expected");
    const int64_t n = t.param.numel();
    const bool adamw = t.grad.defined() && t.exp_avg.defined() && t.exp_avg_sq.defined();
    for (const auto* x : {&t.grad, &t.exp_avg, &t.exp_avg_sq, &t.ema, &t.out}) {
      if (!x->defined()) continue;
      check_host_contiguous(*x, "an operand");
      PI0_CHECK(x->numel() == n, "host_update: operand of ", x->numel(), " elements for a parameter of ", n);
    }
    for (const auto* x : {&t.exp_avg, &t.exp_avg_sq, &t.ema})
      PI0_CHECK(!x->defined() || x->scalar_type() == torch::kFloat32, "host_update: float32 state expected");
    fns.push_back(pick(adamw ? kind_of(t.grad, "the gradient") : Kind::kNone, kind_of(t.out, "the output"),
                       t.ema.defined()));
    first_task.push_back(tasks);
    tasks += blocks_of(n);
  }
  first_task.push_back(tasks);
  pool.run(tasks, [&](int64_t task) {
    const size_t i = static_cast<size_t>(std::upper_bound(first_task.begin(), first_task.end(), task) -
                                         first_task.begin() - 1);
    const int64_t begin = (task - first_task[i]) * kHostBlock;
    fns[i](tensors[i], c, begin, std::min(tensors[i].param.numel(), begin + kHostBlock));
  });
  // Written through pointers, not ATen ops: the version counters must still say so (the simplified inference weights
  // are remade when a parameter's version changes).
  for (const auto& t : tensors) {
    if (t.grad.defined() && t.exp_avg.defined()) t.param.unsafeGetTensorImpl()->bump_version();
    if (t.out.defined()) t.out.unsafeGetTensorImpl()->bump_version();
  }
}

}  // namespace pi0::train
