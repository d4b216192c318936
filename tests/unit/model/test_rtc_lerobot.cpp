// Guided real-time chunking (model/rtc.h) on a linear velocity field v(x, t) = x·Mᵀ + t·c, where every part of the
// guided step has a closed form: against LeRobot's own RTCProcessor.denoise_step (PyPI lerobot 0.4.4, run by
// scripts/rtc_lerobot_reference.py inside openpi's Euler loop), against the analytic vector-Jacobian product
// (∂v/∂x = M, so (∂v/∂x)ᵀe is e·M for the row vectors here), and, with an all-zero mask, against the plain Euler loop.
// The LeRobot case needs a Python with torch and lerobot: $PI0_LEROBOT_PYTHON, else <build>/lerobot_venv (made by
// scripts/setup_lerobot_check.sh); without one it skips visibly.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "pi0/model/rtc.h"
#include "support/skip.h"
#include "support/test_support.h"

using namespace pi0;
using namespace pi0::model;
using nlohmann::json;

namespace {

struct Spec {
  torch::Tensor m, c, x0, prev;  // [A,A], [A], [B,H,A], [R,A] float32
  int64_t delay = 0, execute_horizon = 0, num_steps = 10;
  RtcSchedule schedule = RtcSchedule::kExp;
  double max_weight = 10.0;
};

// B = 2, H = 10, A = 3; M small enough that the field is tame, as a trained expert's is near the data.
Spec make_spec(int64_t rows, int64_t delay, int64_t end, RtcSchedule schedule, double beta, int64_t num_steps) {
  Spec s;
  s.m = torch::randn({3, 3}) * 0.3;
  s.c = torch::randn({3}) * 0.5;
  s.x0 = torch::randn({2, 10, 3});
  s.prev = torch::randn({rows, 3});
  s.delay = delay;
  s.execute_horizon = end;
  s.schedule = schedule;
  s.max_weight = beta;
  s.num_steps = num_steps;
  return s;
}

std::vector<Spec> specs() {
  torch::manual_seed(11);
  return {make_spec(7, 2, 6, RtcSchedule::kExp, 10.0, 10),
          make_spec(5, 3, 8, RtcSchedule::kLinear, 5.0, 10),  // the end beyond the rows: both clip it to 5
          make_spec(4, 0, 4, RtcSchedule::kOnes, 10.0, 10),
          make_spec(9, 4, 9, RtcSchedule::kZeros, 10.0, 10),
          make_spec(6, 5, 3, RtcSchedule::kExp, 5.0, 5),      // d beyond the end: both clip the start to the end
          make_spec(10, 2, 10, RtcSchedule::kExp, 10.0, 10)};  // as many rows as the horizon: no padding
}

VelocityField linear_field(const Spec& s) {
  return [m = s.m, c = s.c](const torch::Tensor& x, const torch::Tensor& t) {
    return torch::matmul(x, m.t()) + t.view({-1, 1, 1}) * c;
  };
}

// What pi0-serve runs: rtc_sample pads the rows to H and builds W from (d, min(end, rows)), then the guided loop.
torch::Tensor run_rtc(const Spec& s, RtcJacobian jacobian) {
  RtcRequest r;
  r.mode = RtcMode::kGuided;
  r.prev = s.prev.unsqueeze(0).expand({s.x0.size(0), -1, -1}).contiguous();
  r.delay = s.delay;
  r.execute_horizon = s.execute_horizon;
  r.guidance = {jacobian, s.schedule, s.max_weight};
  return rtc_sample(linear_field(s), s.x0.clone(), s.num_steps, r);
}

torch::Tensor plain_euler(const VelocityField& v, torch::Tensor x, int64_t num_steps) {
  const float dt = -1.0f / static_cast<float>(num_steps);  // time in float32, as Pi0Impl::sample_actions keeps it
  float t = 1.0f;
  for (int64_t k = 0; k < num_steps; ++k) {
    x = x + dt * v(x, torch::full({x.size(0)}, t, x.options()));
    t += dt;
  }
  return x;
}

double max_abs(const torch::Tensor& t) { return t.abs().max().item<double>(); }
double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return max_abs(a.to(torch::kFloat64) - b.to(torch::kFloat64));
}

// The guided loop in float64 with the closed-form product, and the float32 tolerance of a float32 run against it.
//
// Tolerance. A float32 run differs from exact arithmetic only by rounding: in step k every operation rounds its result
// (unit roundoff u = 2^-24), the dot products of x·Mᵀ and e·M lose at most A·u of the sum of |terms|, and t itself is
// off by up to k·u when summed in float32. Each intermediate (v, x0̂ = x − t·v, e, g, w·g) reaches x' through a factor
// of at most F_k = |dt|·(1 + w_k·(1 + t_k·‖M‖)²) and is at most P_k = max(‖x‖, ‖M‖·‖x‖ + ‖c‖, ‖Y‖ + ‖x‖ + t_k·‖v‖)
// (max norms; ‖M‖ the larger of its row and column sums), so step k adds at most
//   δ_k = (A + n + 10)·u·(‖x_{k+1}‖ + F_k·P_k)
// (10 elementwise roundings on the way, A in a dot product, n for the time). The step is affine in x, x' = x·J_k + b
// with J_k = (1 + dt·w·W_i)·I + dt·(1 − w·W_i·t)·Mᵀ (identity) or I + dt·(Mᵀ + w·W_i·(I − t·Mᵀ)(I − t·M)) (exact) for
// row i, so a difference made at step k reaches the end multiplied by at most a_{k+1}···a_n, a_j = max_i ‖J_j‖. Hence
//   |float32 − exact| ≤ Σ_k δ_k · Π_{j>k} a_j,
// and two float32 implementations (ours, LeRobot's) differ by at most twice that.
struct Reference {
  torch::Tensor x;   // [B,H,A] float64
  double bound = 0;  // the float32 tolerance derived above
};

double max_col_sum(const torch::Tensor& j) { return j.abs().sum(0).max().item<double>(); }

Reference reference_loop(const Spec& s, RtcJacobian jacobian) {
  const auto f64 = torch::kFloat64;
  const int64_t h = s.x0.size(1), a = s.x0.size(2), rows = s.prev.size(0), n = s.num_steps;
  const auto m = s.m.to(f64), c = s.c.to(f64), eye = torch::eye(a, f64);
  auto y = torch::zeros({h, a}, f64);
  y.narrow(0, 0, rows).copy_(s.prev);
  const auto w_rows = rtc_prefix_weights(s.delay, std::min(s.execute_horizon, rows), h, s.schedule).to(f64);
  const double m_norm = std::max(m.abs().sum(0).max().item<double>(), m.abs().sum(1).max().item<double>());
  const double u = std::ldexp(1.0, -24), dt = -1.0 / static_cast<double>(n);
  const bool exact = jacobian == RtcJacobian::kExact;
  std::vector<double> local(static_cast<size_t>(n)), gain(static_cast<size_t>(n));
  auto x = s.x0.to(f64);
  for (int64_t k = 0; k < n; ++k) {
    const double t = 1.0 + static_cast<double>(k) * dt, w = rtc_guidance_weight(t, s.max_weight);
    const auto v = torch::matmul(x, m.t()) + t * c;
    const auto e = (y - (x - t * v)) * w_rows.view({h, 1});
    const auto g = exact ? e - t * torch::matmul(e, m) : e;
    const auto next = x + dt * (v - w * g);
    double a_k = 0;
    for (int64_t i = 0; i < h; ++i) {
      const double ww = w * w_rows[i].item<double>();
      const auto j = exact ? eye + dt * (m.t() + ww * torch::matmul(eye - t * m.t(), eye - t * m))
                           : (1 + dt * ww) * eye + dt * (1 - ww * t) * m.t();
      a_k = std::max(a_k, max_col_sum(j));
    }
    const double p = std::max({max_abs(x), m_norm * max_abs(x) + max_abs(c), max_abs(y) + max_abs(x) + t * max_abs(v)});
    const double f = std::abs(dt) * (1 + w * (1 + t * m_norm) * (1 + t * m_norm));
    local[static_cast<size_t>(k)] = static_cast<double>(a + n + 10) * u * (max_abs(next) + f * p);
    gain[static_cast<size_t>(k)] = a_k;
    x = next;
  }
  Reference r{x, 0.0};
  for (int64_t k = 0; k < n; ++k) {
    double carried = local[static_cast<size_t>(k)];
    for (int64_t j = k + 1; j < n; ++j) carried *= gain[static_cast<size_t>(j)];
    r.bound += carried;
  }
  return r;
}

json to_json(const torch::Tensor& t) {
  if (t.dim() == 0) return t.item<double>();  // float32 → double is exact, and JSON keeps every digit of a double
  json out = json::array();
  for (int64_t i = 0; i < t.size(0); ++i) out.push_back(to_json(t[i]));
  return out;
}

torch::Tensor from_json(const json& j) {
  std::vector<double> values;
  std::vector<int64_t> shape;
  std::function<void(const json&, size_t)> walk = [&](const json& node, size_t depth) {
    if (!node.is_array()) {
      values.push_back(node.get<double>());
      return;
    }
    if (shape.size() == depth) shape.push_back(static_cast<int64_t>(node.size()));
    for (const auto& child : node) walk(child, depth + 1);
  };
  walk(j, 0);
  return torch::tensor(values, torch::kFloat64).view(shape);
}

const char* schedule_name(RtcSchedule s) {
  switch (s) {
    case RtcSchedule::kZeros: return "zeros";
    case RtcSchedule::kOnes: return "ones";
    case RtcSchedule::kLinear: return "linear";
    case RtcSchedule::kExp: return "exp";
  }
  return "?";
}

json spec_json(const Spec& s) {
  return {{"M", to_json(s.m)},
          {"c", to_json(s.c)},
          {"x0", to_json(s.x0)},
          {"prev", to_json(s.prev)},
          {"delay", s.delay},
          {"execution_horizon", s.execute_horizon},
          {"schedule", schedule_name(s.schedule)},
          {"max_guidance_weight", s.max_weight},
          {"num_steps", s.num_steps}};
}

std::string run_capture(const std::string& cmd, int* rc) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  while (p && fgets(buf, sizeof(buf), p)) out += buf;
  *rc = p ? pclose(p) : -1;
  return out;
}

const std::string kReferenceScript = std::string(PI0_SOURCE_DIR) + "/scripts/rtc_lerobot_reference.py";

// The interpreter that imports LeRobot's RTC modules, or "" after a visible skip saying how to provide one.
std::string lerobot_python() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("PI0_LEROBOT_PYTHON"); env && *env) candidates.emplace_back(env);
  const std::string venv = std::string(PI0_BINARY_DIR) + "/lerobot_venv";
  if (std::filesystem::exists(venv + "/bin/python")) candidates.push_back(venv + "/bin/python");
  std::string tried;
  for (const auto& python : candidates) {
    int rc = 0;
    const std::string out = run_capture(python + " " + kReferenceScript + " --check", &rc);
    if (rc == 0) return python;
    tried += "\n" + python + ": " + out;
  }
  testing::skip("no Python with torch and lerobot for the LeRobot RTC cross-check: run scripts/setup_lerobot_check.sh "
                "[a python with torch] to make " + venv + ", or set PI0_LEROBOT_PYTHON" +
                (tried.empty() ? std::string(" (neither is there)") : tried));
  return "";
}

}  // namespace

TEST_CASE("rtc: guided sampling equals LeRobot's RTCProcessor on a linear velocity field", "[unit][model][rtc][lerobot]") {
  const auto cases = specs();
  const std::string python = lerobot_python();
  if (python.empty()) return;
  testing::TempDir dir("rtc_lerobot");
  json all = json::array();
  for (const auto& s : cases) all.push_back(spec_json(s));
  std::ofstream(dir.str("spec.json")) << all.dump();
  int rc = 0;
  const std::string out = run_capture(python + " " + kReferenceScript + " " + dir.str("spec.json") + " --out " +
                                          dir.str("result.json"), &rc);
  INFO(out);
  REQUIRE(rc == 0);
  const auto results = json::parse(testing::read_text(dir.str("result.json")));
  REQUIRE(results.size() == cases.size());
  double worst = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& s = cases[i];
    const auto& r = results[i];
    INFO("case " << i << ": rows " << s.prev.size(0) << ", d " << s.delay << ", end " << s.execute_horizon << ", "
                 << schedule_name(s.schedule) << ", beta " << s.max_weight << ", " << s.num_steps << " steps; lerobot "
                 << r.at("lerobot_version").get<std::string>() << ", torch " << r.at("torch_version").get<std::string>());
    // The mask and the weights, as LeRobot's debug tracker recorded them. The mask: float32 ramps (a linspace, expm1)
    // against ours computed in double and rounded once, so a few ulps of numbers ≤ 1 (2 at most over every start,
    // end ≤ H < 60 and schedule, checked once by hand). w(t): LeRobot first rounds τ = 1 − t to float32 (off by up to
    // u), which w amplifies by |w'(t)| (99 at t = 0.1), then computes w in float32 (a few ulps of β).
    const double u = std::ldexp(1.0, -24);
    const int64_t h = s.x0.size(1);
    const auto w_rows = rtc_prefix_weights(s.delay, std::min(s.execute_horizon, s.prev.size(0)), h, s.schedule);
    CHECK(max_abs_diff(from_json(r.at("prefix_weights")), w_rows) <= 4 * u);
    const auto times = r.at("times").get<std::vector<double>>();
    const auto weights = r.at("guidance_weights").get<std::vector<double>>();
    REQUIRE(weights.size() == static_cast<size_t>(s.num_steps));
    for (size_t k = 0; k < weights.size(); ++k) {
      const double t = times[k], dh = 1e-4;
      const double slope = std::abs(rtc_guidance_weight(t + dh, s.max_weight) - rtc_guidance_weight(t - dh, s.max_weight)) / (2 * dh);
      INFO("t = " << t << ": LeRobot's w " << weights[k] << ", ours " << rtc_guidance_weight(t, s.max_weight));
      CHECK(std::abs(weights[k] - rtc_guidance_weight(t, s.max_weight)) <= 2 * u * slope + 8 * u * s.max_weight);
    }
    // The chunks.
    const auto ours = run_rtc(s, RtcJacobian::kIdentity);
    const auto reference = reference_loop(s, RtcJacobian::kIdentity);
    const double diff = max_abs_diff(ours, from_json(r.at("x")));
    worst = std::max(worst, diff);
    INFO("max |ours - LeRobot| = " << diff << ", |ours - float64| = " << max_abs_diff(ours, reference.x)
                                   << ", float32 bound (one side) " << reference.bound);
    CHECK(diff <= 2 * reference.bound);
    CHECK(max_abs_diff(ours, reference.x) <= reference.bound);
    CHECK(max_abs_diff(from_json(r.at("x")), reference.x) <= reference.bound);
  }
  // Printed for docs and reports: how close the two implementations are.
  WARN("guided RTC vs LeRobot " << results[0].at("lerobot_version").get<std::string>()
                                << ": largest difference over " << cases.size() << " cases " << worst);
}

TEST_CASE("rtc: guided sampling with the exact Jacobian equals the analytic product on a linear velocity field",
          "[unit][model][rtc]") {
  for (const auto& s : specs()) {
    INFO("rows " << s.prev.size(0) << ", d " << s.delay << ", end " << s.execute_horizon << ", "
                 << schedule_name(s.schedule) << ", beta " << s.max_weight << ", " << s.num_steps << " steps");
    const auto ours = run_rtc(s, RtcJacobian::kExact);
    const auto reference = reference_loop(s, RtcJacobian::kExact);
    INFO("max |ours - float64| = " << max_abs_diff(ours, reference.x) << ", float32 bound " << reference.bound);
    CHECK(max_abs_diff(ours, reference.x) <= reference.bound);
    // The product is really taken: the identity variant is far from it.
    CHECK(max_abs_diff(run_rtc(s, RtcJacobian::kIdentity), reference.x) > 10 * reference.bound);
  }
}

TEST_CASE("rtc: guided sampling with an all-zero mask is the plain Euler loop bit for bit", "[unit][model][rtc]") {
  for (const auto& s : specs()) {
    auto zero = s;
    zero.delay = 0;
    zero.execute_horizon = 0;  // W = 0 on every row: v − w·0 is v
    const auto plain = plain_euler(linear_field(s), s.x0.clone(), s.num_steps);
    CHECK(torch::equal(run_rtc(zero, RtcJacobian::kIdentity), plain));
    CHECK(torch::equal(run_rtc(zero, RtcJacobian::kExact), plain));
  }
}
