#include "pi0/common/profiler.h"

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <spdlog/spdlog.h>

#include "pi0/common/check.h"
#include "pi0/common/fs.h"

namespace pi0 {

namespace fs = pi0::posix_fs;
namespace kineto = torch::autograd::profiler;
namespace prof = torch::profiler::impl;

ProfileScope::ProfileScope(const char* name) : range_(at::RecordScope::USER_SCOPE) {
  if (range_.isActive()) range_.before(name);
}

ProfilerOptions ProfilerOptions::fit(int64_t steps_left) const {
  ProfilerOptions o = *this;
  o.steps = std::max<int64_t>(0, std::min(steps, steps_left));
  o.wait_steps = std::max<int64_t>(0, std::min(wait_steps, steps_left - o.steps));
  return o;
}

namespace {

// libkineto's ActivityType (libkineto/include/ActivityType.h; the first entries are the same in every Kineto that
// LibTorch 1.13 to 2.x ships): the device activities that occupy a device. Its GPU_USER_ANNOTATION (2), a range
// projected onto the device's timeline, is not work.
constexpr uint8_t kGpuMemcpy = 3, kGpuMemset = 4, kConcurrentKernel = 5;

// nullopt for a range projected onto a device's timeline (it repeats the CPU thread's range).
std::optional<ProfileEvent> to_event(const kineto::KinetoEvent& e) {
  ProfileEvent out;
  out.name = e.name();
  // LibTorch >= 2.1 reports nanoseconds (startNs/durationNs); 1.13's startUs/durationUs are whole microseconds.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  out.start_us = static_cast<double>(e.startNs()) / 1e3;
  out.duration_us = static_cast<double>(e.durationNs()) / 1e3;
#else
  out.start_us = static_cast<double>(e.startUs());
  out.duration_us = static_cast<double>(e.durationUs());
#endif
  if (e.deviceType() != c10::DeviceType::CPU) {
    const uint8_t a = e.activityType();
    if (a != kGpuMemcpy && a != kGpuMemset && a != kConcurrentKernel) return std::nullopt;
    out.kind = ProfileEvent::Kind::kDevice;
    out.thread = static_cast<uint64_t>(e.deviceResourceId());
  } else {
    out.kind = e.scope() == static_cast<uint8_t>(at::RecordScope::USER_SCOPE) ? ProfileEvent::Kind::kRange
                                                                               : ProfileEvent::Kind::kOp;
    out.thread = e.startThreadId();
  }
  return out;
}

// An event with what it contains on its own thread: the parent (index, or -1) and the time of its direct children.
struct Nested {
  int64_t parent = -1;
  int64_t parent_range = -1;  ///< the nearest enclosing range
  double children_us = 0;
};

// Nesting by time on each CPU thread: sorted by start (the longer first, then recording order), an event is inside
// the last one still open when it starts. 1.13's whole-microsecond times can put a child's end 1 µs past its
// parent's; it is still inside.
std::vector<Nested> nest(const std::vector<ProfileEvent>& events) {
  std::vector<Nested> out(events.size());
  std::map<uint64_t, std::vector<size_t>> by_thread;
  for (size_t i = 0; i < events.size(); ++i)
    if (events[i].kind != ProfileEvent::Kind::kDevice) by_thread[events[i].thread].push_back(i);
  for (auto& [thread, idx] : by_thread) {
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
      if (events[a].start_us != events[b].start_us) return events[a].start_us < events[b].start_us;
      return events[a].duration_us > events[b].duration_us;
    });
    std::vector<size_t> open;
    for (const size_t i : idx) {
      while (!open.empty() && events[open.back()].end_us() <= events[i].start_us) open.pop_back();
      if (!open.empty()) {
        out[i].parent = static_cast<int64_t>(open.back());
        out[open.back()].children_us += events[i].duration_us;
        for (auto it = open.rbegin(); it != open.rend(); ++it) {
          if (events[*it].kind == ProfileEvent::Kind::kRange) {
            out[i].parent_range = static_cast<int64_t>(*it);
            break;
          }
        }
      }
      open.push_back(i);
    }
  }
  return out;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// `s` cut to `width` characters for a table cell (kernel names can be hundreds long).
std::string cell(const std::string& s, size_t width) {
  return s.size() <= width ? s : s.substr(0, width - 3) + "...";
}

nlohmann::json ops_json(const std::vector<OpTime>& ops) {
  auto out = nlohmann::json::array();
  for (const auto& o : ops) {
    out.push_back({{"name", o.name}, {"calls", o.calls}, {"self_ms", o.self_ms}, {"total_ms", o.total_ms},
                   {"avg_us", o.calls ? 1e3 * o.self_ms / static_cast<double>(o.calls) : 0.0}});
  }
  return out;
}

}  // namespace

ProfileReport analyze_profile(const std::vector<ProfileEvent>& events, const std::string& step_name) {
  ProfileReport r;
  auto nested = nest(events);
  std::vector<std::pair<double, double>> steps;  // [start, end] of each step range
  for (const auto& e : events) {
    if (e.kind == ProfileEvent::Kind::kRange && e.name == step_name) {
      ++r.steps;
      r.step_ms += e.duration_us / 1e3;
      steps.emplace_back(e.start_us, e.end_us());
    }
  }
  std::sort(steps.begin(), steps.end());
  // Phases: ranges inside a step; top-level when the step is the nearest enclosing range.
  std::map<std::string, size_t> phase_index;
  std::vector<std::vector<PhaseTime>> nested_phases;  // per top-level phase, in order of first appearance
  std::map<std::string, std::string> parent_of;
  double attributed_ms = 0;
  // A range on a thread of its own (CUDA backward runs on the autograd engine's device thread, and so does the
  // recomputation inside it) belongs to the top-level phase that is under way when it starts.
  std::vector<size_t> top_level;
  for (size_t i = 0; i < events.size(); ++i) {
    const int64_t p = nested[i].parent_range;
    if (events[i].kind == ProfileEvent::Kind::kRange && p >= 0 && events[static_cast<size_t>(p)].name == step_name)
      top_level.push_back(i);
  }
  const auto enclosing_phase = [&](const ProfileEvent& e) -> int64_t {
    for (const size_t t : top_level)
      if (events[t].thread != e.thread && events[t].start_us <= e.start_us && e.start_us < events[t].end_us())
        return static_cast<int64_t>(t);
    return -1;
  };
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].kind == ProfileEvent::Kind::kRange && events[i].name != step_name && nested[i].parent_range < 0)
      nested[i].parent_range = enclosing_phase(events[i]);
  }
  for (size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    if (e.kind != ProfileEvent::Kind::kRange || e.name == step_name || nested[i].parent_range < 0) continue;
    const auto& parent = events[static_cast<size_t>(nested[i].parent_range)];
    std::string top = parent.name;
    bool inside_step = parent.name == step_name;
    for (int64_t p = nested[i].parent_range; !inside_step && p >= 0;) {
      const auto& pe = events[static_cast<size_t>(p)];
      if (pe.name == step_name) inside_step = true;
      else top = pe.name;
      p = nested[static_cast<size_t>(p)].parent_range;
    }
    if (!inside_step) continue;
    if (parent.name == step_name) {
      attributed_ms += e.duration_us / 1e3;
      auto [it, fresh] = phase_index.emplace(e.name, r.phases.size());
      if (fresh) {
        r.phases.push_back({e.name, "", 0, 0});
        nested_phases.emplace_back();
      }
      r.phases[it->second].calls += 1;
      r.phases[it->second].total_ms += e.duration_us / 1e3;
    } else {
      // Filed under its top-level phase (the one directly below the step).
      auto [it, fresh] = phase_index.emplace(top, r.phases.size());
      if (fresh) {
        r.phases.push_back({top, "", 0, 0});
        nested_phases.emplace_back();
      }
      auto& list = nested_phases[it->second];
      auto n = std::find_if(list.begin(), list.end(), [&](const PhaseTime& p) { return p.name == e.name; });
      if (n == list.end()) n = list.insert(list.end(), PhaseTime{e.name, parent.name, 0, 0});
      n->calls += 1;
      n->total_ms += e.duration_us / 1e3;
    }
  }
  std::vector<PhaseTime> ordered;
  for (size_t i = 0; i < r.phases.size(); ++i) {
    ordered.push_back(r.phases[i]);
    ordered.insert(ordered.end(), nested_phases[i].begin(), nested_phases[i].end());
  }
  r.phases = std::move(ordered);
  r.unattributed_ms = r.step_ms - attributed_ms;

  // Operations and kernels, within the steps.
  const auto in_steps = [&](const ProfileEvent& e) {
    const double mid = e.start_us + 0.5 * e.duration_us;
    auto it = std::upper_bound(steps.begin(), steps.end(), std::make_pair(mid, 1e300));
    return it != steps.begin() && mid <= std::prev(it)->second;
  };
  std::map<std::string, OpTime> ops, kernels;
  std::vector<std::pair<double, double>> busy;
  for (size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    if (e.kind == ProfileEvent::Kind::kRange || !in_steps(e)) continue;
    auto& o = (e.kind == ProfileEvent::Kind::kDevice ? kernels : ops)[e.name];
    o.name = e.name;
    o.calls += 1;
    o.total_ms += e.duration_us / 1e3;
    o.self_ms += std::max(0.0, e.duration_us - nested[i].children_us) / 1e3;
    if (e.kind == ProfileEvent::Kind::kDevice) busy.emplace_back(e.start_us, e.end_us());
  }
  const auto by_self = [](const OpTime& a, const OpTime& b) { return a.self_ms > b.self_ms; };
  for (auto& [name, o] : ops) r.ops.push_back(o);
  for (auto& [name, o] : kernels) r.kernels.push_back(o);
  std::sort(r.ops.begin(), r.ops.end(), by_self);
  std::sort(r.kernels.begin(), r.kernels.end(), by_self);

  // Device idle: within each step, the step's time not covered by any device activity (all streams together),
  // and the gaps between consecutive busy intervals.
  r.device_events = !busy.empty();
  if (r.device_events) {
    std::sort(busy.begin(), busy.end());
    double busy_us = 0, max_gap_us = 0;
    for (const auto& [s0, s1] : steps) {
      double covered_to = s0;
      bool any = false;
      for (const auto& [b0, b1] : busy) {
        if (b1 <= s0 || b0 >= s1) continue;
        const double lo = std::max(b0, s0), hi = std::min(b1, s1);
        if (hi <= covered_to) continue;
        if (lo > covered_to) {
          if (any) {
            ++r.device_gaps;
            max_gap_us = std::max(max_gap_us, lo - covered_to);
          }
          busy_us += hi - lo;
        } else {
          busy_us += hi - covered_to;
        }
        covered_to = hi;
        any = true;
      }
    }
    r.device_busy_ms = busy_us / 1e3;
    r.device_idle_ms = r.step_ms - r.device_busy_ms;
    r.device_max_gap_ms = max_gap_us / 1e3;
  }
  return r;
}

std::string ProfileReport::format(int64_t top) const {
  std::ostringstream s;
  const double n = std::max<double>(1, static_cast<double>(steps));
  const double per_step = step_ms / n;
  s << "profile of " << steps << " step" << (steps == 1 ? "" : "s") << ": " << fmt("%.2f", per_step)
    << " ms per step\n\n";
  s << "| phase | calls | ms per step | % of step |\n|---|---|---|---|\n";
  for (const auto& p : phases) {
    const std::string name = p.parent.empty() ? p.name : "  of which " + p.name;
    s << "| " << name << " | " << p.calls << " | " << fmt("%.2f", p.total_ms / n) << " | "
      << fmt("%.1f", step_ms > 0 ? 100 * p.total_ms / step_ms : 0) << " |\n";
  }
  s << "| (outside the phases) | | " << fmt("%.2f", unattributed_ms / n) << " | "
    << fmt("%.1f", step_ms > 0 ? 100 * unattributed_ms / step_ms : 0) << " |\n";
  const auto table = [&](const char* title, const std::vector<OpTime>& rows, bool with_total) {
    s << "\n" << title << " (top " << std::min<int64_t>(top, static_cast<int64_t>(rows.size())) << " of "
      << rows.size() << ", by " << (with_total ? "self " : "") << "time)\n\n"
      << "| name | calls per step | " << (with_total ? "self ms per step | total ms per step" : "ms per step")
      << " | avg us | % of step |\n|---|---|---|---|---|" << (with_total ? "---|" : "") << "\n";
    for (int64_t i = 0; i < top && i < static_cast<int64_t>(rows.size()); ++i) {
      const auto& o = rows[static_cast<size_t>(i)];
      s << "| " << cell(o.name, 90) << " | " << fmt("%.1f", static_cast<double>(o.calls) / n) << " | "
        << fmt("%.3f", o.self_ms / n) << " | ";
      if (with_total) s << fmt("%.3f", o.total_ms / n) << " | ";
      s << fmt("%.1f", o.calls ? 1e3 * o.self_ms / static_cast<double>(o.calls) : 0) << " | "
        << fmt("%.1f", step_ms > 0 ? 100 * o.self_ms / step_ms : 0) << " |\n";
    }
  };
  table("CPU operations", ops, true);
  if (device_events) {
    table("device kernels, copies and memsets", kernels, false);
    s << "\ndevice idle: " << fmt("%.2f", device_idle_ms / n) << " ms per step ("
      << fmt("%.1f", step_ms > 0 ? 100 * device_idle_ms / step_ms : 0) << " % of the step; busy "
      << fmt("%.2f", device_busy_ms / n) << " ms), " << fmt("%.1f", static_cast<double>(device_gaps) / n)
      << " gaps between activities per step, the longest " << fmt("%.3f", device_max_gap_ms) << " ms\n";
  } else {
    s << "\ndevice idle: n/a (no device kernels recorded: a CPU run)\n";
  }
  return s.str();
}

nlohmann::json ProfileReport::to_json() const {
  auto phases_j = nlohmann::json::array();
  for (const auto& p : phases) {
    phases_j.push_back({{"name", p.name}, {"parent", p.parent}, {"calls", p.calls}, {"total_ms", p.total_ms}});
  }
  nlohmann::json device = nullptr;  // n/a without device kernels
  if (device_events) {
    device = {{"busy_ms", device_busy_ms}, {"idle_ms", device_idle_ms}, {"gaps", device_gaps},
              {"max_gap_ms", device_max_gap_ms}};
  }
  return {{"steps", steps},     {"step_ms", step_ms},        {"phases", phases_j},
          {"unattributed_ms", unattributed_ms}, {"ops", ops_json(ops)}, {"kernels", ops_json(kernels)},
          {"device_idle", device}};
}

void make_profile_dir(const std::string& dir, const std::string& flag) {
  std::error_code ec, not_dir;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir, not_dir)) {
    throw UserError(flag + ": got '" + dir + "', which cannot be made a folder (" +
                    (ec ? ec.message() : std::string("a file is in the way")) +
                    "); expected a folder to write the profile into (created if missing)");
  }
}

std::string phase_summary(const std::string& table) {
  const auto ops = table.find("\nCPU operations");
  const auto idle = table.find("\ndevice idle");
  if (ops == std::string::npos || idle == std::string::npos) return table;
  return table.substr(0, ops) + table.substr(idle);
}

void write_chrome_trace(const std::vector<ProfileEvent>& events, const std::string& path) {
  double t0 = 0;
  for (size_t i = 0; i < events.size(); ++i) t0 = i == 0 ? events[i].start_us : std::min(t0, events[i].start_us);
  auto list = nlohmann::json::array();
  for (const auto& e : events) {
    const char* cat = e.kind == ProfileEvent::Kind::kRange ? "user_annotation"
                      : e.kind == ProfileEvent::Kind::kDevice ? "kernel" : "cpu_op";
    list.push_back({{"ph", "X"}, {"cat", cat}, {"name", e.name}, {"pid", e.kind == ProfileEvent::Kind::kDevice ? 1 : 0},
                    {"tid", e.thread}, {"ts", e.start_us - t0}, {"dur", e.duration_us}});
  }
  std::ofstream f(path);
  if (!f) throw UserError("profiler: cannot write " + path);
  f << nlohmann::json{{"traceEvents", list}, {"displayTimeUnit", "ms"}}.dump() << "\n";
  if (!f) throw UserError("profiler: cannot write " + path);
}

Profiler::Profiler(ProfilerOptions options) : options_(std::move(options)) {
  PI0_CHECK(options_.steps >= 0 && options_.wait_steps >= 0, "Profiler: steps and wait_steps must be >= 0");
  PI0_CHECK(!options_.dir.empty(), "Profiler: no output folder");
#ifdef PI0_WITH_CUDA
  cuda_ = options_.cuda.value_or(torch::cuda::is_available());
#else
  cuda_ = false;
#endif
}

Profiler::~Profiler() {
  if (!recording_) return;
  step_range_.reset();
  try {
    kineto::disableProfiler();
  } catch (const std::exception& e) {
    spdlog::warn("profiler: stopping the discarded recording failed: {}", e.what());
  }
}

void Profiler::begin_step() {
  if (steps_seen_++ == options_.wait_steps && options_.steps > 0) {
    fs::create_directories(options_.dir);
    std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
    if (cuda_) activities.insert(prof::ActivityType::CUDA);
    // Kineto must be prepared first (libkineto's activity profiler initialized and configured): enableProfiler
    // alone dereferences it and crashed in startTrace() on pip's LibTorch 2.11 with CUDA (H200 machine, 2026-11-28;
    // Debian's 1.13 has no Kineto, where both are no-ops). torch.profiler calls the two in this order too.
    const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
    kineto::prepareProfiler(config, activities);
    kineto::enableProfiler(config, activities);
    recording_ = true;
  }
  if (!recording_) return;
  step_range_ = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (step_range_->isActive()) step_range_->before(options_.step_name);
}

bool Profiler::end_step() {
  if (!recording_) return false;
  // The step's kernels finish inside its range (the training step reads its loss anyway; sampling syncs too).
  if (cuda_) torch::cuda::synchronize();
  step_range_.reset();
  if (++steps_recorded_ < options_.steps) return false;
  stop_and_write();
  return true;
}

void Profiler::finish() {
  if (!recording_) return;
  step_range_.reset();
  stop_and_write();
}

void Profiler::stop_and_write() {
  recording_ = false;
  auto result = kineto::disableProfiler();
  std::vector<ProfileEvent> events;
  events.reserve(result->events().size());
  for (const auto& e : result->events())
    if (auto event = to_event(e)) events.push_back(std::move(*event));
  const std::string trace = (fs::path(options_.dir) / "trace.json").string();
  try {
    result->save(trace);  // Kineto's own trace: device kernels and their launches linked
  } catch (const c10::Error&) {
    write_chrome_trace(events, trace);  // LibTorch without Kineto
  }
  report_ = analyze_profile(events, options_.step_name);
  const std::string table = report_->format(options_.top);
  {
    std::ofstream f((fs::path(options_.dir) / "profile.txt").string());
    f << table;
    if (!f) throw UserError("profiler: cannot write " + (fs::path(options_.dir) / "profile.txt").string());
  }
  std::ofstream f((fs::path(options_.dir) / "profile.json").string());
  f << report_->to_json().dump(2) << "\n";
  if (!f) throw UserError("profiler: cannot write " + (fs::path(options_.dir) / "profile.json").string());
}

}  // namespace pi0
