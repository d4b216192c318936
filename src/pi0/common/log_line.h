// Logging for translation units that must not see spdlog: LibTorch 2.x's c10d headers include the fmt bundled with
// LibTorch (fmt 11+), which cannot coexist in one translation unit with the fmt that the system's spdlog is built
// against. Such files log pre-formatted lines through these functions (implemented in logging.cpp).
// Also here, for every file: warnings that may repeat per sample or per request go through warn_once().
#pragma once
#include <cstdint>
#include <string>

namespace pi0 {

void log_info_line(const std::string& line);
void log_warn_line(const std::string& line);

/// A warning that may repeat (per sample, per request): logged the first time `key` is seen, then only counted;
/// the count is logged when it reaches 10, 100, 1000, ... (so a million repeats give 7 lines, not a million). The
/// message is passed through printable() (no raw bytes or line breaks in the log); quote values in it with
/// quote_value(). Thread-safe. `key` names the kind of warning, e.g. "tokenizer: prompt truncated".
void warn_once(const std::string& key, const std::string& message);
/// How many times warn_once(key, ...) was called (tests).
int64_t warn_once_count(const std::string& key);

}  // namespace pi0
