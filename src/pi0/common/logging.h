// Logging through spdlog. Every program logs lines of one form, "[2026-11-24 23:14:26] info message" (rank N of a
// multi-process run: "[...] [rank N] warning message"); only rank 0 logs at info level in multi-process runs.
#pragma once
#include <string>

#include <spdlog/spdlog.h>

namespace pi0 {

/// The spdlog pattern of every program's log lines (rank > 0 names its rank).
std::string log_pattern(int rank = 0);

/// Call once per process (app::run_app does, with rank 0): sets log_pattern(rank); ranks other than 0 only log
/// warnings and errors.
void set_log_rank(int rank);

}  // namespace pi0
