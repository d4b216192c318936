#include "pi0/train/signals.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "pi0/common/interrupt.h"

namespace pi0::train {

namespace {

std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "signal flag must be lock-free");
struct sigaction g_previous_int, g_previous_term;
bool g_installed = false;
std::atomic<const char*> g_message{nullptr};

void restore_default(int sig) {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = SIG_DFL;
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, nullptr);  // async-signal-safe
}

void on_stop_signal(int sig) {
  g_stop_signal.store(sig);
  request_interrupt();
  restore_default(SIGINT);
  restore_default(SIGTERM);
  const char* msg = g_message.load();
  if (msg) {
    ssize_t ignored = ::write(STDERR_FILENO, msg, std::strlen(msg));  // strlen and write: async-signal-safe
    (void)ignored;
  }
}

}  // namespace

const char* const kTrainingStopMessage =
    "\npi0: stop requested; once training has started, the current step finishes and a checkpoint is saved (send "
    "the signal again to exit immediately)\n";

void install_stop_signal_handlers(const char* message) {
  g_message.store(message);
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  if (!g_installed) {
    sigaction(SIGINT, &sa, &g_previous_int);
    sigaction(SIGTERM, &sa, &g_previous_term);
    g_installed = true;
  } else {
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
  }
}

void uninstall_stop_signal_handlers() {
  if (!g_installed) return;
  sigaction(SIGINT, &g_previous_int, nullptr);
  sigaction(SIGTERM, &g_previous_term, nullptr);
  g_installed = false;
}

bool stop_requested() { return g_stop_signal.load() != 0; }
int stop_signal() { return g_stop_signal.load(); }
void reset_stop_request() {
  g_stop_signal.store(0);
  clear_interrupt();
}

}  // namespace pi0::train
