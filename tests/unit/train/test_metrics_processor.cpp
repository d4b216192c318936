// The metrics processor (train/metrics_processor.h) on its own: which steps write a metrics.jsonl record and which
// log a progress line, each the mean over its own interval; records of an interrupted run dropped at a resume.
#include <catch2/catch.hpp>

#include <regex>

#include "pi0/train/metrics.h"
#include "pi0/train/metrics_processor.h"
#include "support/log_capture.h"
#include "support/test_support.h"

using namespace pi0;
using namespace pi0::train;

namespace {
std::vector<std::pair<int64_t, double>> progress_lines(const std::string& log) {
  std::vector<std::pair<int64_t, double>> out;
  const std::regex line(R"(step (\d+)/\d+ \| loss ([0-9.]+))");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator(); ++it)
    out.emplace_back(std::stoll((*it)[1]), std::stod((*it)[2]));
  return out;
}
}  // namespace

TEST_CASE("metrics processor: records every metrics_interval, progress every log_interval, means over each",
          "[unit][train]") {
  testing::TempDir dir;
  config::TrainConfig t;
  t.num_steps = 7;
  t.batch_size = 4;
  t.log_interval = 3;
  const auto path = dir.str("metrics.jsonl");
  for (int64_t metrics_interval : {0, 2}) {
    CAPTURE(metrics_interval);
    t.metrics_interval = metrics_interval;
    std::filesystem::remove(path);
    testing::LogCapture log;
    MetricsProcessor metrics(t, /*rank=*/0, /*world_size=*/1, nullptr, nullptr);
    metrics.start(0, path);
    for (int64_t step = 1; step <= t.num_steps; ++step) metrics.log(step, /*loss=*/static_cast<double>(step), 0.5, 1e-4);
    // The loss of step s is s: an interval's mean is the mean of its steps.
    const auto records = read_metrics(path);
    const std::vector<int64_t> record_steps = metrics_interval == 2 ? std::vector<int64_t>{2, 4, 6, 7}
                                                                    : std::vector<int64_t>{3, 6, 7};
    const std::vector<double> record_means = metrics_interval == 2 ? std::vector<double>{1.5, 3.5, 5.5, 7}
                                                                   : std::vector<double>{2, 5, 7};
    REQUIRE(records.size() == record_steps.size());
    for (size_t i = 0; i < records.size(); ++i) {
      CHECK(records[i].at("step").get<int64_t>() == record_steps[i]);
      CHECK(records[i].at("loss").get<double>() == Approx(record_means[i]).margin(1e-12));
      CHECK(records[i].at("lr").get<double>() == 1e-4);
      CHECK(records[i].contains("samples_per_s"));
      CHECK_FALSE(records[i].contains("comm_s"));  // no reducer
    }
    const auto lines = progress_lines(log.text());
    REQUIRE(lines.size() == 3);
    const std::vector<std::pair<int64_t, double>> expected = {{3, 2.0}, {6, 5.0}, {7, 7.0}};
    for (size_t i = 0; i < lines.size(); ++i) {
      CHECK(lines[i].first == expected[i].first);
      CHECK(lines[i].second == Approx(expected[i].second).margin(1e-4));
    }
  }
}

TEST_CASE("metrics processor: a resumed run drops the records after its step and continues the intervals",
          "[unit][train]") {
  testing::TempDir dir;
  config::TrainConfig t;
  t.num_steps = 6;
  t.log_interval = 2;
  const auto path = dir.str("metrics.jsonl");
  {
    MetricsProcessor first(t, 0, 1, nullptr, nullptr);
    first.start(0, path);
    for (int64_t step = 1; step <= 5; ++step) first.log(step, 1.0, 0.1, 1e-4);  // killed after step 5
  }
  MetricsProcessor resumed(t, 0, 1, nullptr, nullptr);
  resumed.start(2, path);  // the checkpoint of step 2
  for (int64_t step = 3; step <= 6; ++step) resumed.log(step, 2.0, 0.1, 1e-4);
  std::vector<std::pair<int64_t, double>> got;
  for (const auto& r : read_metrics(path)) got.emplace_back(r.at("step").get<int64_t>(), r.at("loss").get<double>());
  CHECK(got == std::vector<std::pair<int64_t, double>>{{2, 1.0}, {4, 2.0}, {6, 2.0}});
}

TEST_CASE("metrics processor: format_duration", "[unit][train]") {
  CHECK(MetricsProcessor::format_duration(65) == "1m05s");
  CHECK(MetricsProcessor::format_duration(3725) == "1h02m");
  CHECK(MetricsProcessor::format_duration(-1) == "?");
  CHECK(MetricsProcessor::format_duration(std::nan("")) == "?");
}
