#include "pi0/train/offload.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <thread>

#include "pi0/common/check.h"
#include "pi0/distributed/grad_hooks.h"
#include "pi0/model/pi0.h"
#include "pi0/train/ema.h"
#include "pi0/train/host_update.h"

#ifdef PI0_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace pi0::train {

void init_cuda_allocator(const torch::Device& device) {
  if (!device.is_cuda()) return;
  // CUDA and its caching allocator start lazily, at the first CUDA tensor; the allocator's memory-fraction calls
  // assert before that ("Allocator not initialized for device"). One small tensor starts them the official way.
  torch::empty({1}, torch::TensorOptions().device(device));
}

int64_t device_memory_bytes(const torch::Device& device) {
  if (!device.is_cuda()) return 0;
#ifdef PI0_WITH_CUDA
  const auto index = device.has_index() ? device.index() : c10::cuda::current_device();
  const auto total = static_cast<int64_t>(at::cuda::getDeviceProperties(index)->totalGlobalMem);
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
  // A cap on the caching allocator (setMemoryFraction: bench_train --gpu-gib emulating a smaller card) is what the
  // tensors may use, so the plans choose for it.
  init_cuda_allocator(torch::Device(torch::kCUDA, index));
  const double fraction = c10::cuda::CUDACachingAllocator::getMemoryFraction(index);
  if (fraction > 0 && fraction < 1) return static_cast<int64_t>(fraction * static_cast<double>(total));
#endif
  return total;
#else
  return 0;
#endif
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One host thread running queued work in order; drain() waits for all of it and rethrows the first failure. The
// gradients' host work runs here so the autograd thread only queues it and goes on with backward.
class HostThread {
 public:
  HostThread() : thread_([this] { loop(); }) {}
  ~HostThread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  void submit(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(fn));
    }
    wake_.notify_all();
  }
  void drain() {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_.wait(lock, [this] { return queue_.empty() && !busy_; });
    if (error_) {
      auto e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      auto fn = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      std::exception_ptr error;
      try {
        if (!error_) fn();  // after a failure the rest is skipped; drain() reports it
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      if (error && !error_) error_ = error;
      busy_ = false;
      if (queue_.empty()) idle_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<std::function<void()>> queue_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts after the members it uses
};

}  // namespace

std::optional<std::pair<model::LayerStack, int64_t>> update_layer_of(const std::string& name) {
  static const std::regex vision_layer(R"((^|\.)encoder\.layers\.(\d+)\.)"), joint_layer(R"((^|\.)layers\.(\d+)\.)");
  std::smatch m;
  if (std::regex_search(name, m, vision_layer)) return std::make_pair(model::LayerStack::kVision, std::stoll(m[2].str()));
  if (std::regex_search(name, m, joint_layer)) return std::make_pair(model::LayerStack::kJoint, std::stoll(m[2].str()));
  return std::nullopt;
}

struct OptimizerOffload::Impl {
  torch::Device device{torch::kCPU};
  std::vector<torch::Tensor> params;        // the model's parameters: the device copies
  std::vector<torch::Tensor> masters;       // aligned with params
  // CUDA: per parameter, pinned, in the device copy's dtype: the gradient lands here (D2H) and the next weights are
  // written here by the update and uploaded from here (H2D). Both on copy_stream, so they stay in order. Undefined
  // on the CPU, where the gradient is autograd's own tensor and the update writes the device copy directly.
  std::vector<torch::Tensor> transfer;
  std::vector<torch::Tensor> accumulation;  // float32, made on first need, kept for the next steps
  std::vector<torch::Tensor> grad;          // this step's gradient: transfer / autograd's tensor, or accumulation
  std::vector<char> have;                   // 0: none yet; 1: in grad as it arrived; 2: summed in accumulation
  std::vector<int> pieces;                  // gradients of this micro-batch so far (autograd thread)
  std::vector<double> sum_sq;               // per tensor, of grad after the last micro-batch
  std::vector<char> fresh;                  // sum_sq[i] is of the current grad
  std::vector<size_t> group_of;             // the update group of each parameter
  bool norms = false;       // norms_as_they_arrive
  int64_t n_micro = 1;      // micro-batches in this step
  bool last_micro = false;  // the micro-batch whose gradients are arriving is the step's last
  std::unique_ptr<distributed::GradAccumulationHooks> hooks;
  std::unique_ptr<HostThread> host;
  double grad_seconds = 0;     // host thread, this step's gradient tasks (written there, read after a drain)
  double update_seconds = 0;   // host thread, the last update task
  // Waits for landed groups since before_forward(0), in nanoseconds: the forward's (main thread) and a re-entrant
  // checkpoint's recomputation in backward (autograd thread).
  std::atomic<int64_t> forward_wait_ns{0};
  // The update in the forward's order (update_in_forward_order): groups of parameter indices, the group of each
  // layer, and how many groups have landed (all of them when no update is pending; groups land in order).
  std::vector<std::vector<size_t>> groups;
  std::map<std::pair<model::LayerStack, int64_t>, size_t> group_of_layer;
  std::mutex landed_mutex;
  std::condition_variable landed_cv;
  size_t landed = 0;
  bool update_failed = false;
#ifdef PI0_WITH_CUDA
  std::optional<c10::cuda::CUDAStream> copy_stream;
  std::vector<std::unique_ptr<at::cuda::CUDAEvent>> group_uploaded;  // recorded on copy_stream, one per group
#endif

  // Before the copies are overwritten (CUDA): the copy stream waits for what the compute stream has queued so far,
  // which may still read them.
  void copies_after_compute() {
#ifdef PI0_WITH_CUDA
    if (!device.is_cuda()) return;
    at::cuda::CUDAEvent idle;
    idle.record(c10::cuda::getCurrentCUDAStream(device.index()));
    idle.block(*copy_stream);
#endif
  }

  // Where host_update writes parameter i's next weights: its transfer buffer (CUDA) or the device copy itself.
  torch::Tensor out_of(size_t i) const { return transfer[i].defined() ? transfer[i] : params[i].detach(); }

  // The group's new weights, already in out_of(i), go to the device copies (CUDA: H2D on the copy stream).
  void send_group(size_t g) {
#ifdef PI0_WITH_CUDA
    if (device.is_cuda()) {
      c10::cuda::CUDAStreamGuard guard(*copy_stream);
      for (const size_t i : groups[g]) params[i].detach().copy_(transfer[i], /*non_blocking=*/true);
      group_uploaded[g]->record(*copy_stream);
    }
#endif
    (void)g;
  }

  // The device copies of one group take their masters' values as they are (after a load).
  void upload_group(size_t g) {
    torch::NoGradGuard no_grad;
    for (const size_t i : groups[g]) out_of(i).copy_(masters[i].detach());
    send_group(g);
  }

  // Host side only: the update has written group g's weights (and so has read its gradients).
  bool wait_written(size_t g) {
    std::unique_lock<std::mutex> lock(landed_mutex);
    landed_cv.wait(lock, [&] { return landed > g; });
    return update_failed;
  }

  void wait_landed(size_t g) {
    const auto t0 = Clock::now();
    if (wait_written(g)) host->drain();  // rethrows the update's failure
#ifdef PI0_WITH_CUDA
    if (device.is_cuda()) group_uploaded[g]->block(c10::cuda::getCurrentCUDAStream(device.index()));
#endif
    forward_wait_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  }

  // On the host thread: one gradient of parameter i (in the device copy's dtype) arrived in `g`. Where nothing is
  // summed (one micro-batch, one piece, no data parallelism) it stays as it is; otherwise it is added into the
  // float32 accumulation, in the order and dtype the plain path's float32 .grad sums (a.copy_(g1); a.add_(g2)).
  void accumulate(size_t i, const torch::Tensor& g) {
    torch::NoGradGuard no_grad;
    auto& pool = host_pool();
    const bool want_sum = norms && last_micro;
    const bool direct = norms && n_micro == 1;
    double sum = 0;
    if (direct && !have[i]) {
      grad[i] = g;
      have[i] = 1;
      if (want_sum) sum = host_sum_of_squares(g, pool);
    } else {
      auto& a = accumulation[i];
      if (!a.defined()) a = torch::empty(masters[i].sizes(), masters[i].options().dtype(torch::kFloat32));
      if (have[i] == 1) host_accumulate(a, grad[i], /*first=*/true, /*want_sum=*/false, pool);
      sum = host_accumulate(a, g, /*first=*/have[i] == 0, want_sum, pool);
      grad[i] = a;
      have[i] = 2;
    }
    fresh[i] = want_sum;
    if (want_sum) sum_sq[i] = sum;
  }

  void submit_gradient(size_t i, std::function<torch::Tensor()> arrive) {
    host->submit([this, i, arrive = std::move(arrive)] {
      const auto t0 = Clock::now();
      accumulate(i, arrive());
      grad_seconds += seconds_since(t0);
    });
  }

  // On the autograd thread, after params[i]'s .grad was accumulated: hand it to the host, free it on the device.
  void on_accumulated(size_t i) {
    auto& p = params[i];
    torch::Tensor g = p.grad();
    if (!g.defined()) return;
    p.mutable_grad() = torch::Tensor();
#ifdef PI0_WITH_CUDA
    if (device.is_cuda()) {
      // The first piece of a micro-batch lands in the transfer buffer once the update has written the weights out of
      // it (their upload was queued on the copy stream before, so it reads them first); a later piece of the same
      // micro-batch in a staging block of its own (the first may not be summed yet).
      if (wait_written(group_of[i])) return;  // the update failed: the step's drain reports it
      torch::Tensor dest = pieces[i]++ == 0 ? transfer[i]
                                            : torch::empty(g.sizes(), g.options().device(torch::kCPU).pinned_memory(true));
      at::cuda::CUDAEvent produced;
      produced.record(c10::cuda::getCurrentCUDAStream(device.index()));
      produced.block(*copy_stream);
      {
        c10::cuda::CUDAStreamGuard guard(*copy_stream);
        dest.copy_(g, /*non_blocking=*/true);
      }
      // The allocator keeps g's memory until the copy is done; the host thread reads dest once it has landed.
      c10::cuda::CUDACachingAllocator::recordStream(g.storage().data_ptr(), *copy_stream);
      auto copied = std::make_shared<at::cuda::CUDAEvent>();
      copied->record(*copy_stream);
      submit_gradient(i, [dest, copied] {
        copied->synchronize();
        return dest;
      });
      return;
    }
#endif
    submit_gradient(i, [g] { return g; });
  }

  void attach_hooks() {
    if (hooks) return;
    hooks = std::make_unique<distributed::GradAccumulationHooks>(params, [this](size_t i) { on_accumulated(i); });
  }

  // One group of a step's update, on the host thread: host_update over every parameter it takes (float32 master,
  // moments and EMA; float32 or bf16 gradient and copy), the plain sequence (AdamW::step_part, Ema::update, a copy)
  // for any other; then the group's upload.
  void update_group(size_t g, const HostStep& st) {
    torch::NoGradGuard no_grad;
    const auto& opt = *st.optimizer;
    const auto& o = opt.options();
    std::vector<HostUpdateTensor> fused;
    std::vector<size_t> other;
    for (const size_t i : groups[g]) {
      const auto& gi = st.grads[i];
      const auto out = out_of(i);
      const bool takes = o.fused_host && masters[i].scalar_type() == torch::kFloat32 &&
                         masters[i].is_contiguous() && (!gi.defined() || host_update_takes(masters[i], gi)) &&
                         out.is_contiguous() &&
                         (out.scalar_type() == torch::kFloat32 || out.scalar_type() == torch::kBFloat16) &&
                         (!st.ema || st.ema->averages()[i].scalar_type() == torch::kFloat32);
      if (!takes) {
        other.push_back(i);
        continue;
      }
      HostUpdateTensor t;
      t.param = masters[i].detach();
      if (gi.defined()) t.grad = gi, t.exp_avg = opt.exp_avgs()[i], t.exp_avg_sq = opt.exp_avg_sqs()[i];
      if (st.ema) t.ema = st.ema->averages()[i];
      t.out = out;
      fused.push_back(std::move(t));
    }
    if (!fused.empty()) {
      HostUpdateScalars sc;
      sc.lr = st.lr, sc.beta1 = o.beta1, sc.beta2 = o.beta2, sc.eps = o.eps, sc.weight_decay = o.weight_decay;
      sc.step = opt.step_count(), sc.grad_scale = st.grad_scale, sc.ema_decay = st.ema ? st.ema->decay() : 0.0;
      host_update(fused, sc, host_pool());
    }
    if (!other.empty()) {
      st.optimizer->step_part(st.lr, st.grads, other, st.grad_scale);
      if (st.ema) st.ema->update(other);
      for (const size_t i : other) out_of(i).copy_(masters[i].detach());
    }
    send_group(g);
  }
};

OptimizerOffload::OptimizerOffload(model::Pi0Impl& model, const PlacementTable& table, torch::Device device,
                                   bool norms_as_they_arrive)
    : impl_(std::make_unique<Impl>()) {
  auto& s = *impl_;
  s.device = device;
  s.norms = norms_as_they_arrive;
#ifdef PI0_WITH_CUDA
  if (device.is_cuda()) {
    if (!device.has_index()) s.device = torch::Device(torch::kCUDA, c10::cuda::current_device());
    s.copy_stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, s.device.index());
  }
#else
  PI0_CHECK(!device.is_cuda(), "train.offload: a CUDA device in a build without CUDA");
#endif
  torch::NoGradGuard no_grad;
  for (auto& [placement, p] : placed_parameters(model, table, "OptimizerOffload")) {
    const auto& place = *placement;
    if (!place.on_host()) continue;
    PI0_CHECK(p.device().is_cpu() && p.scalar_type() == place.storage, "OptimizerOffload: '", place.name,
              "' must be built on the host in its storage dtype");
    // The master keeps the weight as loaded (pageable: only the transfer buffers are DMA'd); the model's parameter
    // becomes a separate tensor on the device (a new tensor even on the CPU, so the offloaded path runs there exactly
    // as on a GPU).
    torch::Tensor master = p.data();
    master.set_requires_grad(true);  // a leaf the gradient sync may hook; never part of a graph
    p.set_data(master.detach().to(s.device, place.device_copy, /*non_blocking=*/false, /*copy=*/true));
    torch::Tensor transfer;
#ifdef PI0_WITH_CUDA
    if (s.device.is_cuda()) {
      // Exactly its size (the caching host allocator would round each block up to a power of two: 2.1 GB of
      // embedding becoming 4.3), pinned once for the run.
      const auto bytes = static_cast<size_t>(master.numel()) * c10::elementSize(place.device_copy);
      void* ptr = nullptr;
      C10_CUDA_CHECK(cudaHostAlloc(&ptr, std::max<size_t>(bytes, 1), cudaHostAllocDefault));
      transfer = torch::from_blob(ptr, master.sizes(), [](void* q) { cudaFreeHost(q); },
                                  torch::TensorOptions().dtype(place.device_copy));
    }
#endif
    masters_.emplace_back(place.name, master);
    s.params.push_back(p);
    s.masters.push_back(master);
    s.transfer.push_back(transfer);
  }
  PI0_CHECK(!s.params.empty(), "train.offload=optimizer: nothing trains");
  const size_t n = s.params.size();
  s.accumulation.resize(n);
  s.grad.resize(n);
  s.have.assign(n, 0);
  s.pieces.assign(n, 0);
  s.sum_sq.assign(n, 0.0);
  s.fresh.assign(n, 0);
  s.group_of.assign(n, 0);
  s.host = std::make_unique<HostThread>();

  // Update groups in the forward's order: what lies outside the transformer layers (embeddings, projections, the
  // final norms: the forward reads most of it first), then each SigLIP layer, then each joint layer (both experts).
  std::map<std::pair<model::LayerStack, int64_t>, std::vector<size_t>> layered;
  std::vector<size_t> outside;
  for (size_t i = 0; i < masters_.size(); ++i) {
    if (const auto layer = update_layer_of(masters_[i].first))
      layered[*layer].push_back(i);
    else
      outside.push_back(i);
  }
  s.groups.push_back(std::move(outside));  // may be empty: before_forward waits for it all the same
  for (auto& [layer, indices] : layered) {  // kVision sorts before kJoint, layers in ascending order
    s.group_of_layer[layer] = s.groups.size();
    s.groups.push_back(std::move(indices));
  }
  for (size_t g = 0; g < s.groups.size(); ++g)
    for (const size_t i : s.groups[g]) s.group_of[i] = g;
  s.landed = s.groups.size();
#ifdef PI0_WITH_CUDA
  if (s.device.is_cuda())
    for (size_t g = 0; g < s.groups.size(); ++g) s.group_uploaded.push_back(std::make_unique<at::cuda::CUDAEvent>());
#endif
}

OptimizerOffload::~OptimizerOffload() {
  impl_->hooks.reset();
  try {
    impl_->host->drain();
#ifdef PI0_WITH_CUDA
    // The transfer buffers are freed with this object: no copy may still use them.
    if (impl_->copy_stream) impl_->copy_stream->synchronize();
#endif
  } catch (...) {
  }
}

void OptimizerOffload::before_forward(int64_t micro, int64_t n) {
  auto& s = *impl_;
  s.attach_hooks();
  // Read by the host thread's tasks, queued from now on (it is idle: after_backward and MasterWeightsScope drain it).
  s.last_micro = micro + 1 == n;
  s.n_micro = n;
  std::fill(s.pieces.begin(), s.pieces.end(), 0);
  if (micro != 0) return;
  std::fill(s.have.begin(), s.have.end(), 0);
  std::fill(s.fresh.begin(), s.fresh.end(), 0);
  for (auto& g : s.grad) g = torch::Tensor();
  s.grad_seconds = 0;
  s.forward_wait_ns = 0;
  for (auto& m : s.masters)
    if (m.grad().defined()) m.mutable_grad() = torch::Tensor();
  s.wait_landed(0);  // the weights outside the layers; each layer's own wait in the model's layer gate
}

void OptimizerOffload::after_backward(int64_t micro, int64_t n) {
  auto& s = *impl_;
  s.host->drain();  // backward has returned, so every hook has queued its gradient: all are in after this
  const bool last = micro + 1 == n;
  if (last && s.norms) {
    // A parameter whose gradient came only in earlier micro-batches has no norm yet: computed here, on the host
    // thread as well.
    s.host->submit([&s] {
      for (size_t i = 0; i < s.params.size(); ++i)
        if (s.have[i] && !s.fresh[i]) {
          s.sum_sq[i] = host_sum_of_squares(s.grad[i], host_pool());
          s.fresh[i] = 1;
        }
    });
    s.host->drain();
  }
  if (!last) return;
  // Accumulations are the masters' .grad (what the gradient sync all-reduces under data parallelism); a gradient kept
  // in the copy's dtype is not (a float32 leaf takes no bf16 .grad): gradients() hands both to the trainer.
  for (size_t i = 0; i < s.params.size(); ++i)
    if (s.have[i] == 2) s.masters[i].mutable_grad() = s.grad[i];
}

torch::Tensor OptimizerOffload::gradient_sum_of_squares() const {
  const auto& s = *impl_;
  PI0_CHECK(s.norms, "OptimizerOffload: gradient norms were not summed as they arrived");
  // Added in list order in float64, as gradient_sum_of_squares adds the plain path's per-tensor sums.
  double total = 0;
  bool any = false;
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (!s.have[i]) continue;
    PI0_CHECK(s.fresh[i], "OptimizerOffload: gradient norm of parameter ", i, " not computed");
    total += s.sum_sq[i];
    any = true;
  }
  return any ? torch::tensor(total, torch::kFloat64) : torch::Tensor();
}

std::vector<torch::Tensor> OptimizerOffload::gradients() const {
  const auto& s = *impl_;
  std::vector<torch::Tensor> out(s.params.size());
  for (size_t i = 0; i < s.params.size(); ++i)
    if (s.have[i]) out[i] = s.grad[i];
  return out;
}

bool OptimizerOffload::norms_as_they_arrive() const { return impl_->norms; }

void OptimizerOffload::upload() {
  auto& s = *impl_;
  s.copies_after_compute();
  for (size_t g = 0; g < s.groups.size(); ++g) s.upload_group(g);  // the forward waits per group, as after an update
}

void OptimizerOffload::update_in_forward_order(HostStep step) {
  auto& s = *impl_;
  PI0_CHECK(step.optimizer && step.grads.size() == s.params.size() &&
                step.optimizer->params().size() == s.params.size() &&
                (!step.ema || step.ema->averages().size() == s.params.size()),
            "OptimizerOffload::update_in_forward_order: the optimizer, EMA and gradients must cover the masters");
  s.host->drain();  // idle already (after_backward drains it); rethrows what an earlier task left
  s.copies_after_compute();
  {
    std::lock_guard<std::mutex> lock(s.landed_mutex);
    s.landed = 0;
    s.update_failed = false;
  }
  // Queued before any of the next step's gradients (the thread runs its work in order), so the buffers the update
  // reads as gradients are not overwritten under it.
  s.host->submit([&s, step = std::move(step)] {
    const auto t0 = Clock::now();
    try {
      for (size_t g = 0; g < s.groups.size(); ++g) {
        if (!s.groups[g].empty()) s.update_group(g, step);
        {
          std::lock_guard<std::mutex> lock(s.landed_mutex);
          ++s.landed;
        }
        s.landed_cv.notify_all();
      }
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(s.landed_mutex);
        s.landed = s.groups.size();
        s.update_failed = true;
      }
      s.landed_cv.notify_all();
      throw;  // kept by the host thread; drain() rethrows it
    }
    s.update_seconds = seconds_since(t0);
  });
}

void OptimizerOffload::finish_update() const { impl_->host->drain(); }

void OptimizerOffload::wait_for_layer(model::LayerStack stack, int64_t layer) {
  auto& s = *impl_;
  const auto it = s.group_of_layer.find({stack, layer});
  if (it != s.group_of_layer.end()) s.wait_landed(it->second);
}

void OptimizerOffload::wait_for_weights() {
  auto& s = *impl_;
  for (size_t g = 0; g < s.groups.size(); ++g) s.wait_landed(g);
}

std::vector<std::vector<size_t>> OptimizerOffload::update_groups() const {
  std::vector<std::vector<size_t>> out;
  for (const auto& g : impl_->groups)
    if (!g.empty()) out.push_back(g);
  return out;
}

OptimizerOffload::MasterWeightsScope::MasterWeightsScope(OptimizerOffload* offload) : offload_(offload) {
  if (!offload_) return;
  auto& s = *offload_->impl_;
  s.host->drain();
  // Changing a parameter's data to another dtype or device drops its gradient accumulator, and the hooks with it:
  // they are attached again before the next forward.
  s.hooks.reset();
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < s.params.size(); ++i) {
    device_.push_back(s.params[i].data());
    s.params[i].set_data(s.masters[i].detach());
  }
}

OptimizerOffload::MasterWeightsScope::~MasterWeightsScope() noexcept(false) {
  if (!offload_) return;
  auto& s = *offload_->impl_;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < s.params.size(); ++i) {
    // A load may have given the parameter new storage instead of writing into the master's.
    auto now = s.params[i].data();
    if (now.data_ptr() != s.masters[i].data_ptr()) s.masters[i].detach().copy_(now);
    s.params[i].set_data(device_[i]);
  }
  if (!std::uncaught_exceptions()) offload_->upload();
}

int64_t OptimizerOffload::master_bytes() const {
  int64_t n = 0;
  for (const auto& m : impl_->masters) n += m.numel() * static_cast<int64_t>(m.element_size());
  return n;
}

int64_t OptimizerOffload::accumulation_bytes() const {
  int64_t n = 0;
  for (const auto& a : impl_->accumulation)
    if (a.defined()) n += a.numel() * static_cast<int64_t>(a.element_size());
  for (const auto& t : impl_->transfer)
    if (t.defined()) n += t.numel() * static_cast<int64_t>(t.element_size());
  return n;
}

int64_t OptimizerOffload::device_copy_bytes() const {
  int64_t n = 0;
  for (const auto& p : impl_->params) n += p.numel() * static_cast<int64_t>(p.element_size());
  return n;
}

OptimizerOffload::StepTimes OptimizerOffload::step_times() const {
  const auto& s = *impl_;
  return {s.grad_seconds, s.update_seconds, 1e-9 * static_cast<double>(s.forward_wait_ns.load())};
}

std::string OptimizerOffload::describe_threads() const {
  return "host update on a pool of " + std::to_string(host_pool_threads()) +
         " threads (train.num_threads), gradients and the update queued on one host thread";
}

}  // namespace pi0::train
