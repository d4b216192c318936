#include "pi0/common/interrupt.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

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

void test_pause_until_interrupt(const char* point) {
  const char* env = std::getenv("PI0_TEST_PAUSE");
  if (!env || std::strcmp(env, point) != 0) return;
  std::fprintf(stderr, "PI0_TEST_PAUSE: paused at %s until a stop signal\n", point);
  std::fflush(stderr);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!g_interrupt.load() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

}  // namespace pi0
