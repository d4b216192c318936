// Graceful stop on SIGINT / SIGTERM: the first signal only sets a flag that the training loop polls between
// steps (so it can save a checkpoint and exit cleanly); it also restores the default action for both signals,
// so a second Ctrl-C / SIGTERM terminates the process immediately. pi0-train installs the handlers first thing
// in main(): the same signal also sets pi0::request_interrupt() (common/interrupt.h), so start-up (model build,
// weight load, resume) stops at its next interruption point instead of the process dying with no message.
// pi0-serve installs them first thing too, with its own message (stopped before serving), until its server takes
// the signals over. The handlers replace any disposition, an inherited SIG_IGN included: a stop is never lost.
#pragma once

namespace pi0::train {

/// What the first signal writes to stderr in pi0-train.
extern const char* const kTrainingStopMessage;

/// Installs the handlers (idempotent); remembers the previous dispositions for uninstall. `message` (a string
/// that outlives the handlers) is written to stderr on the first signal.
void install_stop_signal_handlers(const char* message = kTrainingStopMessage);
/// Restores the dispositions that were active before install_stop_signal_handlers().
void uninstall_stop_signal_handlers();
/// True once SIGINT or SIGTERM arrived after installation.
bool stop_requested();
/// The signal number that requested the stop, or 0.
int stop_signal();
/// Clears the flag and the interrupt (tests, or a trainer that handles several runs in one process).
void reset_stop_request();

}  // namespace pi0::train
