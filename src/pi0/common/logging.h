// Logging through spdlog. Only rank 0 logs at info level in multi-process runs (set by set_log_rank).
#pragma once
#include <spdlog/spdlog.h>

namespace pi0 {

/// Call once per process: ranks other than 0 only log warnings and errors.
void set_log_rank(int rank);

}  // namespace pi0
