// c10d glue. LibTorch 1.13 (Debian) and 2.x differ in one place that matters here: the backends (Gloo, NCCL)
// derive from c10d::ProcessGroup in 1.x and from c10d::Backend in 2.x; both expose the same collective calls.
// The backend headers are guarded by USE_C10D_GLOO / USE_C10D_NCCL; LibTorch's CMake config exports them for some
// builds only, so they are defined here (for this file) when the headers they need are present.
#include "pi0/distributed/process_group.h"

#include <torch/version.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <sstream>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#if __has_include(<gloo/context.h>)
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#define PI0_HAVE_GLOO 1
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

#ifdef PI0_WITH_CUDA
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL 1
#endif
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "pi0/common/check.h"
#include "pi0/common/log_line.h"

namespace pi0::distributed {
namespace {

#if TORCH_VERSION_MAJOR >= 2
using C10dBackend = c10d::Backend;
#else
using C10dBackend = c10d::ProcessGroup;
#endif

using Clock = std::chrono::steady_clock;

std::string error_text(const std::exception& e) {
  if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) return ce->what_without_backtrace();
  return e.what();
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

}  // namespace

struct ProcessGroup::Impl {
  /// The dtype a tensor travels in: Gloo (1.13 at least) has no bfloat16 reductions, so bfloat16 goes as float32
  /// (exact for broadcasts; sums are then rounded once, at the end).
  c10::ScalarType wire_dtype(c10::ScalarType t) const {
    return backend_name == "gloo" && t == c10::kBFloat16 ? c10::kFloat : t;
  }

  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<C10dBackend> backend;
  std::string backend_name;
  std::string where;  ///< "rank r of N" for messages

  [[noreturn]] void fail(const std::string& what, const std::exception& e, double timeout_s) const {
    throw DistError(what + " failed on " + where + " (" + backend_name + "): " + error_text(e) +
                    ". A peer rank probably exited, crashed or hung: look at the other ranks' logs. Collectives give "
                    "up after dist.timeout_s = " + std::to_string(static_cast<int64_t>(timeout_s)) + " s");
  }

  void wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what, double timeout_s,
            std::chrono::milliseconds timeout) const {
    try {
      work->wait(timeout);
    } catch (const std::exception& e) {
      fail(what, e, timeout_s);
    }
  }
};

namespace {

class PendingWorkImpl final : public PendingWork {
 public:
  /// `wire`: the tensor being reduced; `t`: the caller's tensor, which receives the result in wait() when the
  /// two differ (dtype converted for the backend).
  PendingWorkImpl(const ProcessGroup::Impl* impl, c10::intrusive_ptr<c10d::Work> work, torch::Tensor wire,
                  torch::Tensor t, std::string what, double timeout_s, std::chrono::milliseconds timeout, bool cpu)
      : impl_(impl), work_(std::move(work)), wire_(std::move(wire)), tensor_(std::move(t)), what_(std::move(what)),
        timeout_s_(timeout_s), timeout_(timeout), done_(std::make_shared<std::atomic<int64_t>>(0)) {
    if (cpu) {
      // Gloo completes on its own threads: the callback records when, so callers can tell how much of the
      // communication ran hidden behind other work.
      auto done = done_;
      work_->getFuture()->addCallback([done](c10::ivalue::Future&) {
        done->store(Clock::now().time_since_epoch().count());
      });
    }
  }
  void wait() override {
    impl_->wait(work_, what_, timeout_s_, timeout_);
    if (!wire_.is_same(tensor_)) tensor_.copy_(wire_);
    if (done_->load() == 0) done_->store(Clock::now().time_since_epoch().count());
  }
  Clock::time_point completed_at() const override { return Clock::time_point(Clock::duration(done_->load())); }

 private:
  const ProcessGroup::Impl* impl_;
  c10::intrusive_ptr<c10d::Work> work_;
  torch::Tensor wire_, tensor_;  // kept alive while the collective runs
  std::string what_;
  double timeout_s_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<std::atomic<int64_t>> done_;
};

}  // namespace

ProcessGroup::ProcessGroup(const DistEnv& env, torch::Device device, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()),
      rank_(env.rank),
      world_size_(env.world_size),
      device_(device),
      timeout_(timeout) {
  impl_->where = "rank " + std::to_string(rank_) + " of " + std::to_string(world_size_);
  const std::string endpoint = env.master_addr + ":" + std::to_string(env.master_port);
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(env.master_port);
    // Under torchrun (TORCHELASTIC_USE_AGENT_STORE=True) the agent already serves a store on MASTER_PORT; a
    // second server on the same port would fail, so every rank is a client then.
    so.isServer = env.rank == 0 && !env.agent_store;
    if (so.isServer) so.numWorkers = static_cast<size_t>(env.world_size);
    so.waitWorkers = false;  // the backend's own rendezvous below waits for everyone, within the timeout
    so.timeout = timeout;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
    impl_->store = c10::make_intrusive<c10d::PrefixStore>("pi0/attempt" + std::to_string(env.restart_count), tcp);
  } catch (const std::exception& e) {
    throw DistError("rendezvous at MASTER_ADDR:MASTER_PORT = " + endpoint + " failed on " + impl_->where + ": " +
                    error_text(e) + (env.rank == 0 ? " (is the port already in use? set MASTER_PORT)"
                                                   : " (is rank 0 running and reachable? check MASTER_ADDR)"));
  }
  try {
    if (device.is_cpu()) {
#ifdef PI0_HAVE_GLOO
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
      if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
      } else if (is_loopback(env.master_addr)) {
        // Single-node job on loopback: do not depend on the hostname resolving to a reachable address.
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      } else {
        opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      }
      opts->threads = 2;
      impl_->backend = c10::make_intrusive<c10d::ProcessGroupGloo>(impl_->store, static_cast<int>(rank_),
                                                                   static_cast<int>(world_size_), opts);
      impl_->backend_name = "gloo";
#else
      throw UserError("train.device is cpu with WORLD_SIZE > 1, but this LibTorch build has no Gloo headers; "
                      "use a LibTorch with Gloo (Debian libtorch-dev + libgloo-dev, or the official LibTorch)");
#endif
    } else if (device.is_cuda()) {
#ifdef PI0_WITH_CUDA
      c10::cuda::set_device(device.has_index() ? device.index() : 0);
      // Without async error handling a dead peer leaves NCCL kernels spinning forever; with it the watchdog
      // aborts the communicator after the timeout. Both spellings (1.x and 2.x); a user's setting wins.
      setenv("NCCL_ASYNC_ERROR_HANDLING", "1", 0);
      setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1", 0);
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = timeout;
      impl_->backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(impl_->store, static_cast<int>(rank_),
                                                                   static_cast<int>(world_size_), opts);
      impl_->backend_name = "nccl";
#else
      throw UserError("train.device is '" + device.str() + "' but this build has no CUDA/NCCL support");
#endif
    } else {
      throw UserError("distributed training supports train.device cpu (Gloo) or cuda (NCCL) (got '" +
                      device.str() + "')");
    }
  } catch (const UserError&) {
    throw;
  } catch (const std::exception& e) {
    throw DistError("creating the process group failed on " + impl_->where + ": " + error_text(e));
  }
  // The first collective completes the backend's connection set-up with every peer.
  barrier("start-up rendezvous");
  std::ostringstream line;
  line << "process group ready: " << world_size_ << " ranks, backend " << impl_->backend_name << ", rendezvous "
       << endpoint << ", timeout " << timeout_seconds() << " s";
  log_info_line(line.str());
}

ProcessGroup::~ProcessGroup() = default;

std::string ProcessGroup::backend_name() const { return impl_->backend_name; }

void ProcessGroup::barrier(const std::string& what) {
  // An all-reduce on our own device, not backend->barrier(): NCCL's barrier guesses the GPU from the rank.
  auto t = torch::ones({1}, torch::TensorOptions().dtype(torch::kFloat32).device(device_));
  all_reduce_sum(t, "barrier '" + what + "'");
}

void ProcessGroup::broadcast(std::vector<torch::Tensor>& tensors, int64_t root, const std::string& what) {
  // Backends take one tensor per call (the list is for several devices), so flatten per dtype.
  std::map<c10::ScalarType, std::vector<size_t>> by_dtype;
  for (size_t i = 0; i < tensors.size(); ++i) by_dtype[tensors[i].scalar_type()].push_back(i);
  for (const auto& [dtype, idx] : by_dtype) {
    std::vector<torch::Tensor> flat;
    for (size_t i : idx) flat.push_back(tensors[i].detach().reshape({-1}).to(device_, impl_->wire_dtype(dtype)));
    std::vector<at::Tensor> buf{torch::cat(flat)};
    c10d::BroadcastOptions opts;
    opts.rootRank = static_cast<int64_t>(root);
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = impl_->backend->broadcast(buf, opts);
    } catch (const std::exception& e) {
      impl_->fail(what, e, timeout_seconds());
    }
    impl_->wait(work, what, timeout_seconds(), timeout_);
    int64_t offset = 0;
    torch::NoGradGuard no_grad;
    for (size_t i : idx) {
      auto& t = tensors[i];
      t.copy_(buf[0].narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

void ProcessGroup::all_reduce_sum(torch::Tensor& t, const std::string& what) {
  const auto original = t.device();
  std::vector<at::Tensor> buf{t.to(device_, impl_->wire_dtype(t.scalar_type())).contiguous()};
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = impl_->backend->allreduce(buf, c10d::AllreduceOptions());
  } catch (const std::exception& e) {
    impl_->fail(what, e, timeout_seconds());
  }
  impl_->wait(work, what, timeout_seconds(), timeout_);
  if (!buf[0].is_same(t)) t.copy_(buf[0].to(original, t.scalar_type()));
}

std::vector<torch::Tensor> ProcessGroup::all_gather(const torch::Tensor& t, const std::string& what) {
  std::vector<at::Tensor> in{t.to(device_, impl_->wire_dtype(t.scalar_type())).contiguous()};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int64_t r = 0; r < world_size_; ++r) out[0].push_back(torch::empty_like(in[0]));
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = impl_->backend->allgather(out, in, c10d::AllgatherOptions());
  } catch (const std::exception& e) {
    impl_->fail(what, e, timeout_seconds());
  }
  impl_->wait(work, what, timeout_seconds(), timeout_);
  std::vector<torch::Tensor> result;
  for (auto& x : out[0]) result.push_back(x.to(torch::kCPU, t.scalar_type()));
  return result;
}

std::unique_ptr<PendingWork> ProcessGroup::start(Collective collective, torch::Tensor t, int64_t root,
                                                 const std::string& what) {
  PI0_CHECK(t.device() == device_ && t.is_contiguous(), what, ": tensor must be contiguous on ", device_.str());
  std::vector<at::Tensor> buf{t.to(impl_->wire_dtype(t.scalar_type()))};
  c10::intrusive_ptr<c10d::Work> work;
  try {
    switch (collective) {
      case Collective::kAllReduceSum:
        work = impl_->backend->allreduce(buf, c10d::AllreduceOptions());
        break;
      case Collective::kReduceSum: {
        c10d::ReduceOptions opts;
        opts.rootRank = root;
        work = impl_->backend->reduce(buf, opts);
        break;
      }
      case Collective::kBroadcast: {
        c10d::BroadcastOptions opts;
        opts.rootRank = root;
        work = impl_->backend->broadcast(buf, opts);
        break;
      }
    }
  } catch (const std::exception& e) {
    impl_->fail(what, e, timeout_seconds());
  }
  return std::make_unique<PendingWorkImpl>(impl_.get(), std::move(work), buf[0], std::move(t), what, timeout_seconds(),
                                           timeout_, device_.is_cpu());
}

std::unique_ptr<PendingWork> ProcessGroup::all_reduce_sum_async(torch::Tensor t, const std::string& what) {
  return start(Collective::kAllReduceSum, std::move(t), 0, what);
}

std::unique_ptr<PendingWork> ProcessGroup::reduce_sum_async(torch::Tensor t, int64_t root, const std::string& what) {
  return start(Collective::kReduceSum, std::move(t), root, what);
}

std::unique_ptr<PendingWork> ProcessGroup::broadcast_async(torch::Tensor t, int64_t root, const std::string& what) {
  return start(Collective::kBroadcast, std::move(t), root, what);
}

std::string ProcessGroup::broadcast_text(const std::string& text, int64_t root, const std::string& what) {
  auto length = torch::tensor({static_cast<int64_t>(text.size())}, torch::kInt64);
  std::vector<torch::Tensor> l{length.to(device_)};
  broadcast(l, root, what);
  const int64_t n = l[0].to(torch::kCPU).item<int64_t>();
  auto bytes = torch::zeros({std::max<int64_t>(n, 1)}, torch::kUInt8);
  if (rank_ == root) std::memcpy(bytes.data_ptr<uint8_t>(), text.data(), text.size());
  std::vector<torch::Tensor> b{bytes.to(device_)};
  broadcast(b, root, what);
  const auto host = b[0].to(torch::kCPU);
  return std::string(reinterpret_cast<const char*>(host.data_ptr<uint8_t>()), static_cast<size_t>(n));
}

}  // namespace pi0::distributed
