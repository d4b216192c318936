// nn/fp8.h's simulated E4M3 against an independent oracle: the 254 finite E4M3 values decoded from their bits, the
// nearest one found by search (ties to the even code), and, on LibTorch >= 2.1, LibTorch's own float8_e4m3fn cast.
#include <catch2/catch.hpp>

#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "pi0/nn/fp8.h"

using namespace pi0;

namespace {

// The non-negative finite E4M3 values in code order (0x00 .. 0x7E; 0x7F is NaN): value, and whether the code is even.
std::vector<std::pair<double, bool>> e4m3_values() {
  std::vector<std::pair<double, bool>> v;
  for (int code = 0; code < 0x7F; ++code) {
    const int e = code >> 3, m = code & 7;
    const double value = e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
    v.emplace_back(value, code % 2 == 0);
  }
  return v;
}

double nearest_e4m3(double x, const std::vector<std::pair<double, bool>>& values) {
  const double a = std::min(std::fabs(x), 448.0);  // saturating, as round_to_e4m3 documents
  auto it = std::lower_bound(values.begin(), values.end(), std::make_pair(a, false),
                             [](const auto& p, const auto& q) { return p.first < q.first; });
  double best;
  if (it == values.begin()) {
    best = it->first;
  } else if (it == values.end()) {
    best = values.back().first;
  } else {
    const auto& hi = *it;
    const auto& lo = *(it - 1);
    const double dl = a - lo.first, dh = hi.first - a;
    best = dl < dh ? lo.first : dh < dl ? hi.first : (lo.second ? lo.first : hi.first);
  }
  return std::copysign(best, x);
}

}  // namespace

TEST_CASE("round_to_e4m3 rounds to the nearest E4M3 value, ties to even, saturating at 448", "[unit][nn][fp8]") {
  const auto values = e4m3_values();
  REQUIRE(values.size() == 127);
  CHECK(values.back().first == 448.0);
  CHECK(values[1].first == std::ldexp(1.0, -9));
  std::vector<float> xs;
  // Every value, every midpoint between neighbours (the ties), and points just beside them.
  for (size_t i = 0; i < values.size(); ++i) {
    const double v = values[i].first;
    xs.push_back(static_cast<float>(v));
    if (i + 1 < values.size()) {
      const double mid = 0.5 * (v + values[i + 1].first);
      xs.push_back(static_cast<float>(mid));
      xs.push_back(std::nextafter(static_cast<float>(mid), 0.0f));
      xs.push_back(std::nextafter(static_cast<float>(mid), 1e9f));
    }
    // Just below a power of two (where log2 would put a value in the wrong binade).
    xs.push_back(std::nextafter(static_cast<float>(v), 0.0f));
  }
  torch::manual_seed(1);
  for (double scale : {1e-4, 1e-2, 1.0, 30.0, 300.0, 1e4}) {
    const auto r = torch::randn({500}) * scale;
    for (int64_t i = 0; i < r.size(0); ++i) xs.push_back(r[i].item<float>());
  }
  const auto n = static_cast<int64_t>(xs.size());
  auto x = torch::from_blob(xs.data(), {n}, torch::kFloat32).clone();
  x = torch::cat({x, -x});
  const auto got = nn::round_to_e4m3(x);
  int64_t mismatches = 0;
  for (int64_t i = 0; i < x.size(0); ++i) {
    const double xi = x[i].item<float>(), want = nearest_e4m3(xi, values), g = got[i].item<float>();
    if (g != want) {
      if (++mismatches <= 5) FAIL_CHECK("x = " << xi << ": got " << g << ", nearest E4M3 " << want);
    }
  }
  CHECK(mismatches == 0);
  CHECK(nn::round_to_e4m3(torch::tensor({1e6f, -500.0f})).equal(torch::tensor({448.0f, -448.0f})));
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  // LibTorch's own cast agrees wherever it is defined (within the finite range).
  const auto in_range = x.clamp(-448.0, 448.0);
  CHECK(torch::equal(nn::round_to_e4m3(in_range), in_range.to(at::kFloat8_e4m3fn).to(torch::kFloat32)));
#endif
}

TEST_CASE("fake_quantize_e4m3_rows scales each row to its amax and keeps E4M3's relative precision",
          "[unit][nn][fp8]") {
  torch::manual_seed(2);
  auto x = torch::randn({6, 64}) * torch::logspace(-3, 3, 6).unsqueeze(1);
  x[3].zero_();
  const auto q = nn::fake_quantize_e4m3_rows(x);
  CHECK(q[3].abs().max().item<float>() == 0.0f);
  for (int64_t r : {0, 1, 2, 4, 5}) {
    const auto amax = x[r].abs().max().item<double>();
    INFO("row " << r);
    // The largest element maps to 448 exactly and back (to float32 rounding of amax/448·448).
    CHECK(std::fabs(q[r].abs().max().item<double>() - amax) <= 1e-6 * amax);
    // Normal E4M3 values (≥ 2^-6 after scaling) are within half a spacing: 2^-4 relative; below that absolute
    // 2^-10 of the scale.
    const auto err = (q[r] - x[r]).abs();
    const auto bound = torch::max(x[r].abs() * std::ldexp(1.0, -4), torch::full_like(x[r], std::ldexp(amax / 448.0, -10)));
    CHECK((err <= bound * (1 + 1e-6)).all().item<bool>());
    CHECK(err.max().item<double>() > 0.0);  // it did quantize
  }
  CHECK(nn::fake_quantize_e4m3_rows(x.to(torch::kBFloat16)).scalar_type() == torch::kBFloat16);
}
