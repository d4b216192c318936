#include "pi0/train/offload.h"

#include <time.h>

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

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

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
  /// CPU seconds this thread spent on work since the last call.
  double take_cpu_seconds() {
    std::lock_guard<std::mutex> lock(mutex_);
    const double s = cpu_seconds_;
    cpu_seconds_ = 0;
    return s;
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
      const double t0 = cpu_seconds();
      std::exception_ptr error;
      try {
        if (!error_) fn();  // after a failure the rest is skipped; drain() reports it
      } catch (...) {
        error = std::current_exception();
      }
      const double spent = cpu_seconds() - t0;
      lock.lock();
      cpu_seconds_ += spent;
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
  double cpu_seconds_ = 0;
  std::thread thread_;  // last: starts after the members it uses
};

}  // namespace

struct OptimizerOffload::Impl {
  torch::Device device{torch::kCPU};
  std::vector<torch::Tensor> params;        // the model's parameters: the device copies
  std::vector<torch::Tensor> masters;       // aligned with params
  std::vector<torch::Tensor> accumulation;  // host, master dtype
  std::vector<torch::Tensor> sum_sq;        // per tensor, of the accumulation after the last micro-batch
  std::vector<char> got;                    // a gradient reached the accumulation this step
  std::vector<char> fresh;                  // sum_sq[i] is of the current accumulation
  bool norms = false;       // norms_as_they_arrive
  bool last_micro = false;  // the micro-batch whose gradients are arriving is the step's last
  std::unique_ptr<distributed::GradAccumulationHooks> hooks;
  std::unique_ptr<HostThread> host;
  double grad_seconds = 0;
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

  // The device copies of one group take their masters' values (on the host thread during an update).
  void upload_group(size_t g) {
    torch::NoGradGuard no_grad;
#ifdef PI0_WITH_CUDA
    if (device.is_cuda()) {
      c10::cuda::CUDAStreamGuard guard(*copy_stream);
      for (const size_t i : groups[g]) {
        // Converted on the host into pinned memory (the caching host allocator reuses it once the copy is done),
        // then copied asynchronously: half the bytes of a float32 transfer for bf16 copies.
        auto& dev = params[i];
        auto staging = torch::empty(dev.sizes(), dev.options().device(torch::kCPU).pinned_memory(true));
        staging.copy_(masters[i].detach());
        dev.detach().copy_(staging, /*non_blocking=*/true);
      }
      group_uploaded[g]->record(*copy_stream);
      return;
    }
#endif
    for (const size_t i : groups[g]) params[i].detach().copy_(masters[i].detach());
  }

  void wait_landed(size_t g) {
    std::unique_lock<std::mutex> lock(landed_mutex);
    landed_cv.wait(lock, [&] { return landed > g; });
    if (update_failed) {
      lock.unlock();
      host->drain();  // rethrows the update's failure
    }
#ifdef PI0_WITH_CUDA
    if (device.is_cuda()) group_uploaded[g]->block(c10::cuda::getCurrentCUDAStream(device.index()));
#endif
  }

  // On the host thread: one gradient into its accumulation (in the dtype and order the plain path's .grad sums).
  void accumulate(size_t i, const torch::Tensor& g) {
    torch::NoGradGuard no_grad;
    auto& a = accumulation[i];
    if (!got[i]) {
      a.copy_(g);
      got[i] = 1;
    } else {
      a.add_(g);
    }
    fresh[i] = 0;
    if (norms && last_micro) {
      sum_sq[i] = tensor_sum_of_squares(a);
      fresh[i] = 1;
    }
  }

  // On the autograd thread, after params[i]'s .grad was accumulated: hand it to the host, free it on the device.
  void on_accumulated(size_t i) {
    auto& p = params[i];
    torch::Tensor g = p.grad();
    if (!g.defined()) return;
    p.mutable_grad() = torch::Tensor();
#ifdef PI0_WITH_CUDA
    if (device.is_cuda()) {
      // Copied on the side stream once the compute stream has produced it; the allocator keeps its memory until the
      // copy is done (recordStream), and the host thread adds it once the copy has landed.
      at::cuda::CUDAEvent produced;
      produced.record(c10::cuda::getCurrentCUDAStream(device.index()));
      produced.block(*copy_stream);
      auto staging = torch::empty(g.sizes(), g.options().device(torch::kCPU).pinned_memory(true));
      {
        c10::cuda::CUDAStreamGuard guard(*copy_stream);
        staging.copy_(g, /*non_blocking=*/true);
      }
      c10::cuda::CUDACachingAllocator::recordStream(g.storage().data_ptr(), *copy_stream);
      auto landed = std::make_shared<at::cuda::CUDAEvent>();
      landed->record(*copy_stream);
      host->submit([this, i, staging, landed] {
        landed->synchronize();
        accumulate(i, staging);
      });
      return;
    }
#endif
    host->submit([this, i, g] { accumulate(i, g); });
  }

  void attach_hooks() {
    if (hooks) return;
    hooks = std::make_unique<distributed::GradAccumulationHooks>(params, [this](size_t i) { on_accumulated(i); });
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
    // The master keeps the weight as loaded; the model's parameter becomes a separate tensor on the device (a new
    // tensor even on the CPU, so the offloaded path runs there exactly as on a GPU).
    torch::Tensor master = device.is_cuda() ? p.data().pin_memory() : p.data();
    master.set_requires_grad(true);  // a leaf the gradient sync may hook; never part of a graph
    p.set_data(master.detach().to(s.device, place.device_copy, /*non_blocking=*/false, /*copy=*/true));
    masters_.emplace_back(place.name, master);
    s.params.push_back(p);
    s.masters.push_back(master);
    s.accumulation.push_back(torch::empty_like(master.detach()));
  }
  PI0_CHECK(!s.params.empty(), "train.offload=optimizer: nothing trains");
  s.sum_sq.resize(s.params.size());
  s.got.assign(s.params.size(), 0);
  s.fresh.assign(s.params.size(), 0);
  s.host = std::make_unique<HostThread>();

  // Update groups in the forward's order: what lies outside the transformer layers (embeddings, projections, the
  // final norms: the forward reads most of it first), then each SigLIP layer, then each joint layer (both experts).
  const std::regex vision_layer(R"((^|\.)encoder\.layers\.(\d+)\.)"), joint_layer(R"((^|\.)layers\.(\d+)\.)");
  std::map<std::pair<model::LayerStack, int64_t>, std::vector<size_t>> layered;
  std::vector<size_t> outside;
  for (size_t i = 0; i < masters_.size(); ++i) {
    std::smatch m;
    const auto& name = masters_[i].first;
    if (std::regex_search(name, m, vision_layer))
      layered[{model::LayerStack::kVision, std::stoll(m[2].str())}].push_back(i);
    else if (std::regex_search(name, m, joint_layer))
      layered[{model::LayerStack::kJoint, std::stoll(m[2].str())}].push_back(i);
    else
      outside.push_back(i);
  }
  s.groups.push_back(std::move(outside));  // may be empty: before_forward waits for it all the same
  for (auto& [layer, indices] : layered) {  // kVision sorts before kJoint, layers in ascending order
    s.group_of_layer[layer] = s.groups.size();
    s.groups.push_back(std::move(indices));
  }
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
  } catch (...) {
  }
}

void OptimizerOffload::before_forward(int64_t micro, int64_t n) {
  auto& s = *impl_;
  s.attach_hooks();
  // Read by the host thread's tasks, queued from now on (it is idle: after_backward and MasterWeightsScope drain it).
  s.last_micro = micro + 1 == n;
  if (micro != 0) return;
  std::fill(s.got.begin(), s.got.end(), 0);
  std::fill(s.fresh.begin(), s.fresh.end(), 0);
  s.grad_seconds = 0;
  for (auto& m : s.masters)
    if (m.grad().defined()) m.mutable_grad() = torch::Tensor();
  s.wait_landed(0);  // the weights outside the layers; each layer's own wait in the model's layer gate
}

void OptimizerOffload::after_backward(int64_t micro, int64_t n) {
  auto& s = *impl_;
  s.host->drain();  // backward has returned, so every hook has queued its gradient: all are accumulated after this
  const bool last = micro + 1 == n;
  if (last && s.norms) {
    // A parameter whose gradient came only in earlier micro-batches has no norm yet: computed here, on the host
    // thread as well.
    s.host->submit([&s] {
      for (size_t i = 0; i < s.params.size(); ++i)
        if (s.got[i] && !s.fresh[i]) {
          s.sum_sq[i] = tensor_sum_of_squares(s.accumulation[i]);
          s.fresh[i] = 1;
        }
    });
    s.host->drain();
  }
  s.grad_seconds += s.host->take_cpu_seconds();
  if (!last) return;
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (s.got[i]) s.masters[i].mutable_grad() = s.accumulation[i];
  }
}

torch::Tensor OptimizerOffload::gradient_sum_of_squares() const {
  const auto& s = *impl_;
  PI0_CHECK(s.norms, "OptimizerOffload: gradient norms were not summed as they arrived");
  torch::Tensor total;
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (!s.got[i]) continue;
    PI0_CHECK(s.fresh[i], "OptimizerOffload: gradient norm of parameter ", i, " not computed");
    total = total.defined() ? total.add(s.sum_sq[i]) : s.sum_sq[i];
  }
  return total;
}

bool OptimizerOffload::norms_as_they_arrive() const { return impl_->norms; }

void OptimizerOffload::upload() {
  auto& s = *impl_;
  s.copies_after_compute();
  for (size_t g = 0; g < s.groups.size(); ++g) s.upload_group(g);  // the forward waits per group, as after an update
}

void OptimizerOffload::update_in_forward_order(std::function<void(const std::vector<size_t>&)> update) {
  auto& s = *impl_;
  s.host->drain();  // idle already (after_backward drains it); rethrows what an earlier task left
  s.copies_after_compute();
  {
    std::lock_guard<std::mutex> lock(s.landed_mutex);
    s.landed = 0;
    s.update_failed = false;
  }
  // Queued before any of the next step's gradients (the thread runs its work in order), so the accumulation
  // buffers the update reads as gradients are not overwritten under it.
  s.host->submit([&s, update = std::move(update)] {
    try {
      for (size_t g = 0; g < s.groups.size(); ++g) {
        if (!s.groups[g].empty()) {
          update(s.groups[g]);
          s.upload_group(g);
        }
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
  for (const auto& a : impl_->accumulation) n += a.numel() * static_cast<int64_t>(a.element_size());
  return n;
}

int64_t OptimizerOffload::device_copy_bytes() const {
  int64_t n = 0;
  for (const auto& p : impl_->params) n += p.numel() * static_cast<int64_t>(p.element_size());
  return n;
}

double OptimizerOffload::host_grad_seconds() const { return impl_->grad_seconds; }

}  // namespace pi0::train
