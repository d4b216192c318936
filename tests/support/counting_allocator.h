// Peak CPU allocation of a block of code, for small-model versions of the full-size memory checks: the default
// CPU allocator is wrapped by one that counts live bytes. Tensors viewing a memory-mapped file do not go through
// the allocator, so what this measures is exactly the owned memory (parameters, optimizer state, copies).
#pragma once
#include <atomic>
#include <cstring>

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
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  int64_t current() const { return current_.load(); }
  int64_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(current_.load()); }

 private:
  struct Ctx {
    c10::DataPtr inner;
    size_t bytes;
  };
  static void release(void* p) {
    auto* ctx = static_cast<Ctx*>(p);
    instance().current_ -= static_cast<int64_t>(ctx->bytes);
    delete ctx;  // frees through the wrapped allocator
  }
  c10::DataPtr allocate_counted(size_t n) const {
    auto inner = base_->allocate(n);
    void* data = inner.get();
    const auto device = inner.device();
    auto* ctx = new Ctx{std::move(inner), n};
    const int64_t now = current_ += static_cast<int64_t>(n);
    int64_t p = peak_.load();
    while (now > p && !peak_.compare_exchange_weak(p, now)) {
    }
    return {data, ctx, &release, device};
  }
  CountingCpuAllocator() : base_(c10::GetCPUAllocator()) {}
  c10::Allocator* base_;
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

 private:
  c10::Allocator* previous_;
  int64_t start_ = 0;
};

}  // namespace pi0::testing
