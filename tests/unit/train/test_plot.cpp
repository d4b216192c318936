// pi0-plot's axes (issue 27): both axes end on labelled ticks that enclose the data (a falling loss never drops
// below the lowest tick, steps start at a 0 tick), loss on a log scale, and panel titles above the frames, never
// over a curve. And which panels pi0-plot draws without --keys (metric_panels).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "pi0/train/metric_panels.h"
#include "pi0/train/plot.h"

using namespace pi0::train;

TEST_CASE("fit_axis: linear axes start and end on ticks enclosing the data", "[unit][train]") {
  // The quickstart's steps (records from step 1, or from 20 with log_interval 20): the axis starts at a 0 tick.
  for (double first : {1.0, 20.0}) {
    const auto a = fit_axis(first, 300, false, 8);
    CHECK(a.lo == 0);
    CHECK(a.hi == 300);
    REQUIRE(a.ticks.size() >= 4);
    CHECK(a.ticks.front() == a.lo);
    CHECK(a.ticks.back() == a.hi);
  }
  const auto lr = fit_axis(4.5e-5, 1e-3, false, 5);
  CHECK(lr.lo == 0);
  CHECK(lr.hi == Approx(1e-3));
  CHECK_FALSE(lr.log);
  const auto flat = fit_axis(2.0, 2.0, false, 5);
  CHECK(flat.lo < 2.0);
  CHECK(flat.hi > 2.0);
}

TEST_CASE("fit_axis: log axes tick at 1, 2, 5 x 10^k and reach below the smallest value", "[unit][train]") {
  // The quickstart's loss: 1.675 -> 0.109. The old linear axis's lowest tick was 0.5, above the final loss.
  const auto a = fit_axis(0.109, 1.675, true, 5);
  CHECK(a.log);
  REQUIRE(a.ticks.size() == 5);
  const std::vector<double> want = {0.1, 0.2, 0.5, 1, 2};
  for (size_t i = 0; i < want.size(); ++i) CHECK(a.ticks[i] == Approx(want[i]));
  CHECK(a.lo <= 0.109);
  CHECK(a.hi >= 1.675);
  // Over many decades only powers of ten; a value on a tick is its own end.
  const auto wide = fit_axis(3e-7, 40, true, 5);
  CHECK(wide.lo == Approx(1e-7));
  CHECK(wide.hi == Approx(100));
  for (double t : wide.ticks) CHECK(std::abs(std::log10(t) - std::round(std::log10(t))) < 1e-9);
  const auto exact = fit_axis(0.5, 0.5, true, 5);
  CHECK(exact.lo == Approx(0.5));
  CHECK(exact.hi > 0.5);
  // Not positive: stays linear.
  CHECK_FALSE(fit_axis(0.0, 1.0, true, 5).log);
}

TEST_CASE("plot_panels: each panel's title sits above its frame, not over its curve", "[unit][train]") {
  const Rgb blue{31, 119, 180}, axis{40, 40, 40};
  // A curve that starts in the frame's top-left corner, where the title used to be drawn.
  PlotSeries s{"learning rate", {}, {}, blue};
  for (int x = 0; x <= 100; ++x) s.x.push_back(x), s.y.push_back(100 - x);
  const auto c = plot_panels({s}, 600, 400, "step");
  // The frame's top edge: the first row with a long run of the axis colour.
  int top = -1;
  for (int y = 0; y < c.height() && top < 0; ++y) {
    int run = 0;
    for (int x = 0; x < c.width(); ++x) {
      const auto p = c.pixel(x, y);
      run = (p.r == axis.r && p.g == axis.g && p.b == axis.b) ? run + 1 : 0;
      if (run > 300) top = y;
    }
  }
  REQUIRE(top > 0);
  int title_pixels = 0;
  for (int y = 0; y < top; ++y)
    for (int x = 0; x < c.width(); ++x) {
      const auto p = c.pixel(x, y);
      title_pixels += p.r == blue.r && p.g == blue.g && p.b == blue.b;
    }
  CHECK(title_pixels > 100);  // "learning rate" in the 5x7 font at scale 2
}

TEST_CASE("plot_panels: an overlay is drawn on its panel's axes, which widen to hold it, and named in the title row",
          "[unit][train]") {
  const Rgb blue{31, 119, 180}, orange{255, 127, 14}, axis{40, 40, 40};
  PlotSeries s{"loss", {}, {}, blue};
  for (int x = 0; x <= 100; ++x) s.x.push_back(x), s.y.push_back(1.0 + x / 100.0);  // in [1, 2]
  // A validation loss above every training value: an axis fitted to the training loss alone puts it off the canvas.
  s.overlays.push_back({"val_loss", {25, 50, 75, 100}, {5.0, 5.5, 6.0, 6.5}, orange});
  const auto c = plot_panels({s}, 600, 400, "step");
  // The frame's top and bottom edges: the rows with a long run of the axis colour.
  std::vector<int> edges;
  for (int y = 0; y < c.height(); ++y) {
    int run = 0, longest = 0;
    for (int x = 0; x < c.width(); ++x) {
      const auto p = c.pixel(x, y);
      run = (p.r == axis.r && p.g == axis.g && p.b == axis.b) ? run + 1 : 0;
      longest = std::max(longest, run);
    }
    if (longest > 300) edges.push_back(y);
  }
  REQUIRE(edges.size() == 2);
  int inside = 0, above = 0;
  for (int y = 0; y < c.height(); ++y)
    for (int x = 0; x < c.width(); ++x) {
      const auto p = c.pixel(x, y);
      if (p.r != orange.r || p.g != orange.g || p.b != orange.b) continue;
      inside += y > edges[0] && y < edges[1];
      above += y < edges[0];
    }
  CHECK(inside > 100);  // the line and its dots
  CHECK(above > 50);    // "val_loss" after the panel's title
}

TEST_CASE("metric_panels: without --keys a run's recorded metrics get panels and held-out values sit over theirs",
          "[unit][train]") {
  std::vector<nlohmann::json> records;
  for (int step = 1; step <= 4; ++step) {
    records.push_back({{"step", step}, {"loss", 1.0 / step}, {"lr", 1e-4}, {"ce_subtask", 2.0 / step},
                       {"subtask_acc", 0.2 * step}, {"fast_acc", 0.1 * step}, {"fast_undecodable", 1.0 - 0.2 * step}});
  }
  records.push_back({{"step", 4}, {"val_loss", 0.3}, {"val_action_mse", 0.1}, {"val_ce_subtask", 0.7},
                     {"val_subtask_acc", 0.6}, {"val_fast_undecodable", 0.9}});
  const auto keys = pi0::train::default_panel_keys(records);
  CHECK(keys == std::vector<std::string>{"loss", "val_action_mse", "fast_acc", "fast_undecodable", "ce_subtask",
                                         "subtask_acc", "lr"});
  const auto chosen = pi0::train::metric_panels(records, keys, {"loss"}, /*overlays=*/true);
  CHECK(chosen.missing.empty());
  REQUIRE(chosen.panels.size() == keys.size());
  const auto overlay_of = [&](const std::string& title) -> std::vector<std::string> {
    for (const auto& p : chosen.panels) {
      if (p.title != title) continue;
      std::vector<std::string> labels;
      for (const auto& o : p.overlays) labels.push_back(o.label);
      return labels;
    }
    FAIL("no panel " << title);
    return {};
  };
  CHECK(overlay_of("loss") == std::vector<std::string>{"val_loss"});
  CHECK(overlay_of("ce_subtask") == std::vector<std::string>{"val_ce_subtask"});
  CHECK(overlay_of("subtask_acc") == std::vector<std::string>{"val_subtask_acc"});
  CHECK(overlay_of("fast_undecodable") == std::vector<std::string>{"val_fast_undecodable"});
  CHECK(overlay_of("fast_acc").empty());
  const auto& sub = chosen.panels[static_cast<size_t>(std::find(keys.begin(), keys.end(), "subtask_acc") - keys.begin())];
  REQUIRE(sub.overlays.size() == 1);
  CHECK(sub.overlays[0].x == std::vector<double>{4});
  CHECK(sub.overlays[0].y == std::vector<double>{0.6});
  CHECK(sub.y.size() == 4);
  CHECK(chosen.panels.front().log_y);
  CHECK(chosen.panels.back().title == "learning rate");

  SECTION("with --keys: those panels alone, no overlays, the absent ones named") {
    const auto given = pi0::train::metric_panels(records, {"loss", "ce_fast"}, {}, /*overlays=*/false);
    CHECK(given.panels[0].overlays.empty());
    CHECK(given.missing == std::vector<std::string>{"ce_fast"});
  }
  SECTION("a knowledge-insulation run adds its loss parts") {
    records.front()["ce_fast"] = 1.0, records.front()["flow_loss"] = 0.5;
    CHECK(pi0::train::default_panel_keys(records) ==
          std::vector<std::string>{"loss", "val_action_mse", "ce_fast", "flow_loss", "fast_acc", "fast_undecodable",
                                   "ce_subtask", "subtask_acc", "lr"});
  }
}
