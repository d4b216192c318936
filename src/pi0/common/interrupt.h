// Interruption points: long start-up work (building a model, reading weights) checks between units of work
// whether the process was asked to stop, so a SIGINT/SIGTERM during a minute-long weight load ends it within one
// tensor instead of after it. pi0-train and pi0-serve arm this (src/pi0/train/signals.h sets the flag from its
// handler); in every other program the flag stays clear and interruption_point() costs one atomic load.
#pragma once
#include <stdexcept>

namespace pi0 {

/// Thrown by interruption_point() once an interrupt was requested. Not an error: the program stops on request.
class Interrupted : public std::runtime_error {
 public:
  Interrupted() : std::runtime_error("interrupted: a stop was requested (SIGINT/SIGTERM)") {}
};

/// Sets the flag. Async-signal-safe (one lock-free atomic store).
void request_interrupt() noexcept;
/// Clears the flag (tests, or a process that goes on after handling a stop).
void clear_interrupt() noexcept;
bool interrupt_requested() noexcept;
/// Throws Interrupted when the flag is set.
void interruption_point();

/// Test-only (docs/testing.md): when the environment variable PI0_TEST_PAUSE equals `point` (e.g. "bundle_load"),
/// prints "PI0_TEST_PAUSE: paused at <point> until a stop signal" to stderr and waits until a stop is requested (60 s
/// at most), so that a test of a stop during start-up sends its signal while the process provably is at `point`,
/// however fast the machine. Does nothing otherwise.
void test_pause_until_interrupt(const char* point);

}  // namespace pi0
