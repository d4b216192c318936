// The profiler (common/profiler.h): the analysis of recorded events (nesting, self time, phases, device idle time)
// on hand-made events with known answers, then a real recording of a small loop: the trace parses as JSON and
// holds the phase ranges, the table lists the operations with their counts.
#include <catch2/catch.hpp>

#include <fstream>
#include <set>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pi0/common/profiler.h"
#include "support/test_support.h"

using namespace pi0;
using Catch::Contains;
using Kind = ProfileEvent::Kind;

namespace {

ProfileEvent ev(const std::string& name, Kind kind, double start, double duration, uint64_t thread = 1) {
  ProfileEvent e;
  e.name = name;
  e.kind = kind;
  e.start_us = start;
  e.duration_us = duration;
  e.thread = thread;
  return e;
}

const OpTime& find_op(const std::vector<OpTime>& ops, const std::string& name) {
  const auto it = std::find_if(ops.begin(), ops.end(), [&](const OpTime& o) { return o.name == name; });
  REQUIRE(it != ops.end());
  return *it;
}

const PhaseTime& find_phase(const ProfileReport& r, const std::string& name) {
  const auto it = std::find_if(r.phases.begin(), r.phases.end(), [&](const PhaseTime& p) { return p.name == name; });
  REQUIRE(it != r.phases.end());
  return *it;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  REQUIRE(f);
  return nlohmann::json::parse(f);  // throws (fails the test) on malformed JSON
}

}  // namespace

TEST_CASE("analyze_profile: phases, self time and device idle time of hand-made events", "[unit][common]") {
  // One step of 1000 µs on thread 1: forward [10, 410) holding matmul ⊃ mm, backward [420, 920) holding a
  // recompute range and an add; a recompute on thread 2 (CUDA backward's device thread) during backward; two
  // kernels with a gap; an operation outside the step (not counted).
  const std::vector<ProfileEvent> events = {
      ev("pi0::step", Kind::kRange, 0, 1000),
      ev("pi0::forward", Kind::kRange, 10, 400),
      ev("aten::matmul", Kind::kOp, 20, 300),
      ev("aten::mm", Kind::kOp, 30, 250),
      ev("pi0::backward", Kind::kRange, 420, 500),
      ev("pi0::recompute", Kind::kRange, 430, 100),
      ev("aten::mm", Kind::kOp, 440, 50),
      ev("aten::add", Kind::kOp, 600, 20),
      ev("pi0::recompute", Kind::kRange, 700, 40, /*thread=*/2),
      ev("kernel_a", Kind::kDevice, 100, 200, /*stream=*/7),
      ev("kernel_b", Kind::kDevice, 350, 100, /*stream=*/7),
      ev("kernel_c", Kind::kDevice, 400, 100, /*stream=*/8),  // overlaps kernel_b on another stream
      ev("aten::mm", Kind::kOp, 2000, 999),                   // after the step
  };
  const auto r = analyze_profile(events, "pi0::step");
  CHECK(r.steps == 1);
  CHECK(r.step_ms == Approx(1.0));
  // Top-level phases in order, each followed by what is nested in it; 1000 - 400 - 500 µs outside them.
  REQUIRE(r.phases.size() == 3);
  CHECK(r.phases[0].name == "pi0::forward");
  CHECK(r.phases[1].name == "pi0::backward");
  CHECK(r.phases[2].name == "pi0::recompute");
  CHECK(r.phases[2].parent == "pi0::backward");
  CHECK(r.phases[2].calls == 2);  // the one on thread 2 is filed under the backward under way
  CHECK(r.phases[2].total_ms == Approx(0.14));
  CHECK(find_phase(r, "pi0::forward").total_ms == Approx(0.4));
  CHECK(r.unattributed_ms == Approx(0.1));
  // Self time excludes what an operation contains; the operation after the step is left out.
  CHECK(find_op(r.ops, "aten::matmul").self_ms == Approx(0.05));
  CHECK(find_op(r.ops, "aten::matmul").total_ms == Approx(0.3));
  CHECK(find_op(r.ops, "aten::mm").calls == 2);
  CHECK(find_op(r.ops, "aten::mm").self_ms == Approx(0.3));
  CHECK(r.ops.front().name == "aten::mm");  // by self time
  // Device: busy [100, 300) ∪ [350, 500) = 350 µs of the 1000 µs step, one gap (300 → 350) of 50 µs.
  REQUIRE(r.device_events);
  CHECK(r.kernels.size() == 3);
  CHECK(r.device_busy_ms == Approx(0.35));
  CHECK(r.device_idle_ms == Approx(0.65));
  CHECK(r.device_gaps == 1);
  CHECK(r.device_max_gap_ms == Approx(0.05));
  const auto text = r.format(10);
  CHECK_THAT(text, Contains("| pi0::forward | 1 | 0.40 | 40.0 |"));
  CHECK_THAT(text, Contains("of which pi0::recompute"));
  CHECK_THAT(text, Contains("| aten::mm | 2.0 | 0.300 | 0.300 | 150.0 | 30.0 |"));
  CHECK_THAT(text, Contains("device idle: 0.65 ms per step"));
  const auto j = r.to_json();
  CHECK(j["device_idle"]["gaps"] == 1);

  // Without device events the idle time is n/a.
  const auto cpu = analyze_profile({events.begin(), events.begin() + 9}, "pi0::step");
  CHECK_FALSE(cpu.device_events);
  CHECK_THAT(cpu.format(), Contains("device idle: n/a"));
  CHECK(cpu.to_json()["device_idle"].is_null());
}

TEST_CASE("ProfilerOptions::fit shortens the wait and the steps to the steps left", "[unit][common]") {
  ProfilerOptions o;
  o.steps = 3;
  o.wait_steps = 1;
  CHECK(o.fit(10).steps == 3);
  CHECK(o.fit(10).wait_steps == 1);
  CHECK(o.fit(3).steps == 3);
  CHECK(o.fit(3).wait_steps == 0);
  CHECK(o.fit(2).steps == 2);
  CHECK(o.fit(0).steps == 0);
}

TEST_CASE("Profiler records the chosen steps: the trace parses and holds the phases, the table counts the ops",
          "[unit][common]") {
  testing::TempDir dir("pi0prof");
  ProfilerOptions o;
  o.dir = dir.str("profile");
  o.steps = 2;
  o.wait_steps = 1;
  Profiler profiler(o);
  auto w = torch::randn({64, 64}, torch::requires_grad());
  std::vector<bool> wrote;
  for (int step = 0; step < 4; ++step) {
    profiler.begin_step();
    ProfileScope forward(phase::kForward);
    const auto loss = w.matmul(w).relu().sum();  // one aten::mm forward, two in backward
    forward.end();  // ended early: recorded once, not again when it goes out of scope
    {
      ProfileScope backward(phase::kBackward);
      loss.backward();
    }
    {
      ProfileScope optimizer(phase::kOptimizer);
      torch::NoGradGuard no_grad;
      w.sub_(w.grad() * 1e-3);
      w.grad().zero_();
    }
    wrote.push_back(profiler.end_step());
  }
  profiler.finish();  // nothing left to write
  CHECK(wrote == std::vector<bool>{false, false, true, false});
  REQUIRE(profiler.report());
  const auto& r = *profiler.report();
  CHECK(r.steps == 2);

  const auto trace = read_json(dir.str("profile/trace.json"));
  REQUIRE(trace.contains("traceEvents"));
  std::multiset<std::string> names;
  for (const auto& e : trace["traceEvents"]) names.insert(e.value("name", ""));
  CHECK(names.count("pi0::step") == 2);
  CHECK(names.count("pi0::forward") == 2);
  CHECK(names.count("pi0::backward") == 2);
  CHECK(names.count("pi0::optimizer") == 2);
  CHECK(names.count("aten::mm") == 6);

  REQUIRE(r.phases.size() == 3);
  CHECK(find_phase(r, phase::kForward).calls == 2);
  CHECK(find_op(r.ops, "aten::mm").calls == 6);
  const auto j = read_json(dir.str("profile/profile.json"));
  CHECK(j["steps"] == 2);
  bool mm_listed = false;
  for (const auto& op : j["ops"]) mm_listed = mm_listed || (op["name"] == "aten::mm" && op["calls"] == 6);
  CHECK(mm_listed);
  const auto text = testing::read_text(dir.str("profile/profile.txt"));
  CHECK_THAT(text, Contains("profile of 2 steps"));
  CHECK_THAT(text, Contains("| pi0::forward | 2 |"));
  CHECK_THAT(text, Contains("| aten::mm | 3.0 |"));  // calls per step
  CHECK_THAT(text, Contains("device idle: n/a"));
}

TEST_CASE("ProfileScope costs nothing and records nothing without a profiler", "[unit][common]") {
  ProfileScope scope(phase::kForward);
  scope.end();
  SUCCEED();
}
