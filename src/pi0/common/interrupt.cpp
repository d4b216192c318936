#include "pi0/common/interrupt.h"

#include <atomic>

namespace pi0 {
namespace {
std::atomic<bool> g_interrupt{false};
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler: must be lock-free");
}  // namespace

void request_interrupt() noexcept { g_interrupt.store(true); }
void clear_interrupt() noexcept { g_interrupt.store(false); }
bool interrupt_requested() noexcept { return g_interrupt.load(); }
void interruption_point() {
  if (g_interrupt.load()) throw Interrupted();
}

}  // namespace pi0
