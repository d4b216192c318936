// Visible skips. Catch2 2.x has no SKIP, so a test case that cannot run here (no fixtures, no GPU, a LibTorch
// without the feature, a missing prerequisite) calls testing::skip(reason) and returns. tests/main.cpp then exits
// with kSkipReturnCode when every test case it ran skipped and none failed, and tests/CMakeLists.txt maps that
// code to CTest's SKIP_RETURN_CODE: CTest lists the case as "Not Run (skipped)" instead of "Passed", and the
// reason stays in its output.
#pragma once
#include <catch2/catch.hpp>

#include <string>
#include <vector>

namespace pi0::testing {

/// The exit code of a run whose test cases all skipped (77: the automake convention CTest users know).
constexpr int kSkipReturnCode = 77;

/// What the Catch2 listener in tests/main.cpp tallies.
struct SkipTally {
  int cases_run = 0;
  bool current_skipped = false;
  std::vector<std::string> skipped;  ///< "name: reason" per skipped test case
  std::string current_reason;
};

inline SkipTally& skip_tally() {
  static SkipTally tally;
  return tally;
}

/// Marks the running test case skipped, with `reason` shown in its output; the caller then returns, or goes on
/// with what it can still check. Either way the case is reported skipped unless a check fails: part of it did not
/// run. Call from the test's own thread.
inline void skip(const std::string& reason) {
  auto& t = skip_tally();
  t.current_skipped = true;
  if (!t.current_reason.empty()) t.current_reason += "; ";
  t.current_reason += reason;
  WARN("skipped: " << reason);
}

}  // namespace pi0::testing
