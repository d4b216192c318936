// Logging for translation units that must not see spdlog: LibTorch 2.x's c10d headers include the fmt bundled with
// LibTorch (fmt 11+), which cannot coexist in one translation unit with the fmt that the system's spdlog is built
// against. Such files log pre-formatted lines through these functions (implemented in logging.cpp).
#pragma once
#include <string>

namespace pi0 {

void log_info_line(const std::string& line);
void log_warn_line(const std::string& line);

}  // namespace pi0
