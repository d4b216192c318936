// Running a built app (build/<app>) as a separate process: exit code, stdout and stderr, for the tests of what
// users see (exit codes, one-line errors, --help).
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <string>

#include <catch2/catch.hpp>

#include "support/skip.h"
#include "support/test_support.h"

namespace pi0::testing {

/// The directory the tests run the apps (pi0-train, pi0-serve, ...) from: $PI0_APP_DIR when set and not empty
/// (e.g. installed binaries, or an older build to show that a test fails on it), else this build's directory.
/// Only the apps: what the tests build there themselves (the Python venvs) stays in PI0_BINARY_DIR.
inline std::string app_dir() {
  const char* env = std::getenv("PI0_APP_DIR");
  return env && *env ? std::string(env) : std::string(PI0_BINARY_DIR);
}

struct AppResult {
  int code = -1;           ///< exit status; -1 when killed by a signal
  int signal = 0;          ///< the signal that killed it, or 0
  std::string out, err;    ///< stdout, stderr
};

/// Runs `<app_dir()>/<app> <args>` through the shell (quote `args` for it); `prefix` goes before the executable.
inline AppResult run_app_process(const std::string& app, const std::string& args, const TempDir& dir,
                                 const std::string& prefix = "") {
  const std::string out = dir.str("app_stdout.txt"), err = dir.str("app_stderr.txt");
  const std::string cmd =
      prefix + app_dir() + "/" + app + " " + args + " > " + out + " 2> " + err + " < /dev/null";
  const int status = std::system(cmd.c_str());
  AppResult r;
  if (WIFEXITED(status)) r.code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  auto slurp = [](const std::string& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

/// True when every app in `apps` is built in app_dir(). Otherwise a skip naming the missing ones (a multi-process
/// test cannot run without them; `cmake --build build` builds them all) and false.
inline bool apps_built(std::initializer_list<const char*> apps) {
  std::string missing;
  for (const char* app : apps)
    if (::access((app_dir() + "/" + app).c_str(), X_OK) != 0) missing += std::string(" ") + app;
  if (missing.empty()) return true;
  skip("not built in " + app_dir() + ":" + missing);
  return false;
}

/// A command prefix under which file modes are enforced: "" for a normal user; as root (which bypasses them),
/// setpriv without the capabilities that override them. nullopt when neither is possible (the caller skips
/// visibly).
inline std::optional<std::string> permission_checked_prefix() {
  if (::geteuid() != 0) return std::string();
  const std::string setpriv = "setpriv --bounding-set=-dac_override,-dac_read_search ";
  if (std::system((setpriv + "true > /dev/null 2>&1").c_str()) == 0) return setpriv;
  return std::nullopt;
}

/// While alive, the apps this test starts wait at start-up point `point` until they get a stop signal
/// (PI0_TEST_PAUSE, test_pause_until_interrupt in pi0/common/interrupt.h; docs/testing.md), so a test of a stop
/// during start-up sends its signal while the app is provably there, however fast or loaded the machine.
class TestPause {
 public:
  explicit TestPause(const std::string& point) : point_(point) { ::setenv("PI0_TEST_PAUSE", point.c_str(), 1); }
  ~TestPause() { ::unsetenv("PI0_TEST_PAUSE"); }
  TestPause(const TestPause&) = delete;
  TestPause& operator=(const TestPause&) = delete;
  /// What the app prints on stderr once it waits there.
  std::string paused_line() const { return "PI0_TEST_PAUSE: paused at " + point_; }

 private:
  std::string point_;
};

/// Exit code 2 and exactly one stderr line "<app>: error: ..." containing `text`; nothing about a stack trace.
inline void check_user_error(const AppResult& r, const std::string& app, const std::string& text) {
  INFO("stdout: " << r.out);
  INFO("stderr: " << r.err);
  CHECK(r.code == 2);
  CHECK(r.err.rfind(app + ": error: ", 0) == 0);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK_THAT(r.err, Catch::Contains(text));
  CHECK_THAT(r.err + r.out, !Catch::Contains("frame #"));
}

}  // namespace pi0::testing
