// Norm stats against a direct computation over the same rows; the norm_stats.json format.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "data_test_util.h"
#include "pi0/data/dataset.h"
#include "pi0/data/example_data.h"
#include "pi0/data/norm_stats.h"
#include "pi0/data/transforms.h"

using namespace pi0::data;

namespace {

/// Direct statistics over rows [N,D] (double): mean, population std, exact order-statistic quantile.
KeyStats direct(const std::vector<std::vector<double>>& rows) {
  KeyStats ks;
  const size_t n = rows.size(), d = rows[0].size();
  for (size_t j = 0; j < d; ++j) {
    std::vector<double> col;
    double s = 0, s2 = 0;
    for (const auto& r : rows) {
      col.push_back(r[j]);
      s += r[j];
    }
    const double mean = s / n;
    for (double v : col) s2 += (v - mean) * (v - mean);
    std::sort(col.begin(), col.end());
    ks.mean.push_back(mean);
    ks.std.push_back(std::sqrt(s2 / n));
    ks.q01.push_back(col[static_cast<size_t>(std::ceil(0.01 * n)) - 1]);
    ks.q99.push_back(col[static_cast<size_t>(std::ceil(0.99 * n)) - 1]);
  }
  return ks;
}

void compare(const KeyStats& got, const KeyStats& want, const std::vector<std::vector<double>>& rows, int64_t bins) {
  for (size_t j = 0; j < want.mean.size(); ++j) {
    double lo = INFINITY, hi = -INFINITY;
    for (const auto& r : rows) { lo = std::min(lo, r[j]); hi = std::max(hi, r[j]); }
    const double width = (hi - lo + 2e-10) / static_cast<double>(bins);
    CHECK(got.mean[j] == Approx(want.mean[j]).margin(1e-9));
    CHECK(got.std[j] == Approx(want.std[j]).margin(1e-9));
    // Histogram quantile = left edge of the bin holding the exact order statistic.
    CHECK(got.q01[j] <= want.q01[j] + 1e-9);
    CHECK(got.q01[j] >= want.q01[j] - width - 1e-9);
    CHECK(got.q99[j] <= want.q99[j] + 1e-9);
    CHECK(got.q99[j] >= want.q99[j] - width - 1e-9);
  }
}

}  // namespace

TEST_CASE("norm stats match a direct computation over states and action chunks", "[unit][data]") {
  pi0::test::TempDir dir;
  ExampleDataOptions eo;
  eo.episodes = 3;
  eo.steps = 30;
  eo.image_size = 8;
  DatasetOptions o;
  o.paths = {write_example_libero(dir.str(), eo)};
  o.action_horizon = 7;
  RobotDataset ds(o);

  std::vector<std::vector<double>> states, actions, delta_rows;
  const std::vector<bool> mask = {true, true, true, false};
  for (int64_t i = 0; i < ds.size(); ++i) {
    RawSample s = ds.get(i);
    states.emplace_back(s.state.data_ptr<float>(), s.state.data_ptr<float>() + 8);
    torch::Tensor d = delta_actions(s.actions, s.state, mask, "t").contiguous();
    for (int64_t h = 0; h < 7; ++h) {
      actions.emplace_back(s.actions[h].data_ptr<float>(), s.actions[h].data_ptr<float>() + 7);
      delta_rows.emplace_back(d[h].data_ptr<float>(), d[h].data_ptr<float>() + 7);
    }
  }
  NormStatsOptions no;
  no.num_bins = 5000;
  NormStats got = compute_norm_stats(ds, no);
  compare(got.at("state"), direct(states), states, 5000);
  compare(got.at("actions"), direct(actions), actions, 5000);

  no.delta_action_mask = mask;
  NormStats got_delta = compute_norm_stats(ds, no);
  compare(got_delta.at("actions"), direct(delta_rows), delta_rows, 5000);
}

TEST_CASE("norm_stats.json round trip in openpi's format", "[unit][data]") {
  pi0::test::TempDir dir;
  NormStats s;
  s.keys["state"] = {{1, 2}, {0.5, 0.25}, {-1, -2}, {3, 4}};
  s.keys["actions"] = {{0}, {1}, {}, {}};
  save_norm_stats(s, dir.file("norm_stats.json"));
  NormStats r = load_norm_stats(dir.file("norm_stats.json"));
  CHECK(r.at("state").mean == std::vector<double>{1, 2});
  CHECK(r.at("state").q99 == std::vector<double>{3, 4});
  CHECK(r.at("actions").q01.empty());
  CHECK(r.source == dir.file("norm_stats.json"));
  std::ifstream in(dir.file("norm_stats.json"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text.find("\"norm_stats\": {") != std::string::npos);
}

TEST_CASE("near-constant dimensions are reported", "[unit][data]") {
  NormStats s;
  s.keys["actions"] = {{0, 0}, {1, 1e-7}, {-1, 0.5}, {1, 0.5001}};
  auto w = near_constant_dims(s);
  REQUIRE(w.size() == 1);
  CHECK_THAT(w[0], Catch::Contains("actions dim 1 is near constant"));
}
