// Test LeRobot datasets: tests/data/write_lerobot.py run in a venv under the build folder (pinned pyarrow, numpy and
// av, created once under a lock), and the content formulas that script writes, so tests know what to read back.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <string>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "pi0/data/parquet.h"
#include "pi0/data/video.h"
#include "support/skip.h"

namespace pi0::test {

/// True when this build reads format: lerobot (Arrow/Parquet C++, libpng, FFmpeg). Otherwise the test case skips
/// visibly (a CUDA build against pip's LibTorch has no Arrow unless -DPI0_ARROW_ROOT points at a pyarrow; its
/// writer venv would need PyPI too) and returns false. With PI0_REQUIRE_LEROBOT=1 (CI: scripts/setup.sh provides
/// all three) a missing reader is a failure instead.
inline bool lerobot_built() {
  if (data::parquet::available() && data::video_available()) return true;
  const std::string why = "format: lerobot is not built here (" + data::parquet::build_info() +
                          (data::video_available() ? "" : "; no FFmpeg") + ")";
  const char* require = std::getenv("PI0_REQUIRE_LEROBOT");
  if (require && std::string(require) == "1") {
    FAIL_CHECK(why << " and PI0_REQUIRE_LEROBOT=1");
  } else {
    testing::skip(why);
  }
  return false;
}

/// Versions the test datasets are written with (pinned: the files must not change between CI runs).
inline const char* kLeRobotWriterPackages = "pyarrow==26.0.1 numpy==2.4.6 av==18.1.0";

inline std::string run_capture(const std::string& cmd, int* rc) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  while (p && fgets(buf, sizeof(buf), p)) out += buf;
  *rc = p ? pclose(p) : -1;
  return out;
}

/// The writer venv's python; fails the test loudly when it cannot be created (needs python3-venv and PyPI).
inline std::string lerobot_python() {
  const std::string venv = std::string(PI0_BINARY_DIR) + "/lerobot_test_venv";
  const std::string cmd = "flock " + venv + ".lock sh -c '" + venv +
                          "/bin/python -c \"import pyarrow, av, numpy\" 2>/dev/null || { rm -rf " + venv +
                          " && python3 -m venv " + venv + " && " + venv +
                          "/bin/pip install -q --disable-pip-version-check " + kLeRobotWriterPackages + "; }'";
  int rc = 0;
  const std::string text = run_capture(cmd, &rc);
  INFO("creating the LeRobot writer venv failed (needs python3-venv and PyPI access): " << cmd << "\n" << text);
  REQUIRE(rc == 0);
  return venv + "/bin/python";
}

/// Writes a dataset with tests/data/write_lerobot.py (`args`: --version, --images, ...) into `dir`.
inline void write_lerobot(const std::string& dir, const std::string& args) {
  const std::string cmd = "SVT_LOG=1 " + lerobot_python() + " " + std::string(PI0_SOURCE_DIR) +
                          "/tests/data/write_lerobot.py --out " + dir + " " + args;
  int rc = 0;
  const std::string text = run_capture(cmd, &rc);
  INFO(cmd << "\n" << text);
  REQUIRE(rc == 0);
}

// The content formulas of write_lerobot.py.
inline torch::Tensor lerobot_state(int64_t e, int64_t t, int64_t dim) {
  return (100.0 * e + t + torch::arange(dim, torch::kFloat64) / 8).to(torch::kFloat32);
}
inline torch::Tensor lerobot_action(int64_t e, int64_t t, int64_t dim) {
  return (-(100.0 * e + t) - torch::arange(dim, torch::kFloat64) / 4).to(torch::kFloat32);
}
/// Camera 0 (image) uses episode e, camera 1 (wrist_image) e + 10.
inline torch::Tensor lerobot_png_pixels(int64_t e, int64_t t, int64_t hw) {
  auto y = torch::arange(hw).view({hw, 1, 1}), x = torch::arange(hw).view({1, hw, 1}), c = torch::arange(3).view({1, 1, 3});
  return ((50 * e + 7 * t + 3 * y + 5 * x + 80 * c) % 256).to(torch::kUInt8);
}
inline torch::Tensor lerobot_video_pixels(int64_t e, int64_t t, int64_t hw) {
  auto y = torch::arange(hw).view({hw, 1, 1}), x = torch::arange(hw).view({1, hw, 1}), c = torch::arange(3).view({1, 1, 3});
  const int64_t level = 20 + (37 * e + 9 * t) % 160;
  return (level + torch::div(y + x, 8, "floor") + 10 * c).clamp(0, 255).to(torch::kUInt8);
}
inline double psnr(const torch::Tensor& a, const torch::Tensor& b) {
  const double mse = (a.to(torch::kFloat64) - b.to(torch::kFloat64)).pow(2).mean().item<double>();
  return mse == 0 ? 99.0 : 10 * std::log10(255.0 * 255.0 / mse);
}

}  // namespace pi0::test
