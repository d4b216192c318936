// Shared by the libFuzzer targets: each input goes through the real file reader (written to a scratch file, since
// the readers take paths), and only pi0::UserError is an acceptable way to refuse it. Any other exception escapes
// LLVMFuzzerTestOneInput and libFuzzer reports it as a crash: bad input must never be an internal error.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <spdlog/spdlog.h>

#include "pi0/common/check.h"

namespace pi0::fuzz {

/// A per-process scratch directory under $PI0_FUZZ_SCRATCH (scripts/fuzz.sh removes it after each target: libFuzzer
/// may end with _Exit, skipping atexit), else tmpfs when there is one; removed at a normal exit too.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const char* env = std::getenv("PI0_FUZZ_SCRATCH");
    const char* shm = "/dev/shm";
    const std::filesystem::path base = env && *env                          ? std::filesystem::path(env)
                                       : std::filesystem::is_directory(shm) ? std::filesystem::path(shm)
                                                                            : std::filesystem::temp_directory_path();
    auto d = base / ("pi0_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return d;
  }();
  return dir;
}

/// Writes the input to `<scratch>/<name>` and returns the path.
inline std::string write_input(const uint8_t* data, size_t size, const std::string& name) {
  const std::string path = (scratch_dir() / name).string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

/// Runs `f`; a pi0::UserError is the reader refusing the input (fine), anything else propagates (a finding).
template <typename F>
int refuse_only_with_user_error(F&& f) {
  try {
    f();
  } catch (const pi0::UserError&) {
  }
  return 0;
}

/// Quiet logging: warnings about odd inputs would otherwise be most of the run's time.
inline void quiet() { spdlog::set_level(spdlog::level::off); }

}  // namespace pi0::fuzz
