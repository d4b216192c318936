// Peak CPU allocation of a block of code, for small-model versions of the full-size memory checks: the default
// CPU allocator is wrapped by one that counts live bytes. Tensors viewing a memory-mapped file do not go through
// the allocator, so what this measures is exactly the owned memory (parameters, optimizer state, copies).
#pragma once
#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <utility>

#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>
#include <torch/version.h>

namespace pi0::testing {

class CountingCpuAllocator final : public c10::Allocator {
 public:
  static CountingCpuAllocator& instance() {
    static CountingCpuAllocator* a = new CountingCpuAllocator();  // never destroyed: deleters may run late
    return *a;
  }
#if TORCH_VERSION_MAJOR >= 2
  c10::DataPtr allocate(size_t n) override { return allocate_counted(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
#else
  c10::DataPtr allocate(size_t n) const override { return allocate_counted(n); }
#endif
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  int64_t current() const { return current_.load(); }
  int64_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(current_.load()); }

 private:
  // The wrapped allocation of each pointer we handed out (context == data, as raw_allocate requires).
  static void release(void* p) {
    auto& self = instance();
    c10::DataPtr inner;
    {
      std::lock_guard<std::mutex> lock(self.mutex_);
      auto it = self.live_.find(p);
      if (it == self.live_.end()) return;
      self.current_ -= static_cast<int64_t>(it->second.second);
      inner = std::move(it->second.first);
      self.live_.erase(it);
    }
    // `inner` frees through the wrapped allocator here.
  }
  c10::DataPtr allocate_counted(size_t n) const {
    auto inner = base_->allocate(n);
    void* data = inner.get();
    const auto device = inner.device();
    if (data == nullptr) return inner;  // zero-size allocations
    {
      std::lock_guard<std::mutex> lock(mutex_);
      live_.emplace(data, std::make_pair(std::move(inner), n));
    }
    const int64_t now = current_ += static_cast<int64_t>(n);
    int64_t p = peak_.load();
    while (now > p && !peak_.compare_exchange_weak(p, now)) {
    }
    return {data, data, &release, device};
  }
  CountingCpuAllocator() : base_(c10::GetCPUAllocator()) {}
  c10::Allocator* base_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<void*, std::pair<c10::DataPtr, size_t>> live_;
  mutable std::atomic<int64_t> current_{0}, peak_{0};
};

/// Counts CPU allocations while alive; peak() is the highest number of live counted bytes since construction
/// (bytes allocated before it are not counted).
class PeakAllocation {
 public:
  PeakAllocation() : previous_(c10::GetCPUAllocator()) {
    auto& a = CountingCpuAllocator::instance();
    c10::SetCPUAllocator(&a, /*priority=*/100);
    start_ = a.current();
    a.reset_peak();
  }
  ~PeakAllocation() { c10::SetCPUAllocator(previous_, /*priority=*/100); }
  int64_t peak() const { return CountingCpuAllocator::instance().peak() - start_; }
  /// Live counted bytes now, beyond those at construction (e.g. what a forward keeps for backward).
  int64_t held() const { return CountingCpuAllocator::instance().current() - start_; }

 private:
  c10::Allocator* previous_;
  int64_t start_ = 0;
};

}  // namespace pi0::testing
