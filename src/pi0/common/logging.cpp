#include "pi0/common/logging.h"

namespace pi0 {

void set_log_rank(int rank) {
  spdlog::set_pattern(rank == 0 ? "[%H:%M:%S] %^%l%$ %v" : "[%H:%M:%S] [rank " + std::to_string(rank) + "] %^%l%$ %v");
  spdlog::set_level(rank == 0 ? spdlog::level::info : spdlog::level::warn);
}

}  // namespace pi0

#include "pi0/common/log_line.h"

namespace pi0 {
void log_info_line(const std::string& line) { spdlog::info("{}", line); }
void log_warn_line(const std::string& line) { spdlog::warn("{}", line); }
}  // namespace pi0
