#include "pi0/common/logging.h"

namespace pi0 {

std::string log_pattern(int rank) {
  // Date and time to the second: a training run spans days, and a sub-second stamp adds nothing a reader uses.
  return rank == 0 ? "[%Y-%m-%d %H:%M:%S] %^%l%$ %v" : "[%Y-%m-%d %H:%M:%S] [rank " + std::to_string(rank) + "] %^%l%$ %v";
}

void set_log_rank(int rank) {
  spdlog::set_pattern(log_pattern(rank));
  spdlog::set_level(rank == 0 ? spdlog::level::info : spdlog::level::warn);
}

}  // namespace pi0

#include <map>
#include <mutex>

#include "pi0/common/log_line.h"
#include "pi0/common/strings.h"

namespace pi0 {
void log_info_line(const std::string& line) { spdlog::info("{}", line); }
void log_warn_line(const std::string& line) { spdlog::warn("{}", line); }

namespace {
std::mutex warn_once_mutex;
std::map<std::string, int64_t> warn_once_counts;
}  // namespace

void warn_once(const std::string& key, const std::string& message) {
  int64_t n = 0;
  {
    std::lock_guard<std::mutex> lock(warn_once_mutex);
    n = ++warn_once_counts[key];
  }
  if (n == 1) {
    spdlog::warn("{} (said once; repeats are counted)", printable(message));
    return;
  }
  int64_t p = 10;
  while (p < n && p <= INT64_MAX / 10) p *= 10;
  if (p == n) spdlog::warn("{}: {} times so far", printable(key), n);
}

int64_t warn_once_count(const std::string& key) {
  std::lock_guard<std::mutex> lock(warn_once_mutex);
  auto it = warn_once_counts.find(key);
  return it == warn_once_counts.end() ? 0 : it->second;
}
}  // namespace pi0
