#include "pi0/app/cli.h"

#include <torch/version.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <system_error>

#include "pi0/app/out_of_memory.h"
#include "pi0/common/check.h"
#include "pi0/common/logging.h"
#include "pi0/distributed/process_group.h"
#include "pi0/infer/inference.h"
#include "pi0/train/trainer.h"

#ifndef PI0_VERSION
#define PI0_VERSION "unknown"
#endif
#ifndef PI0_BUILD_TYPE
#define PI0_BUILD_TYPE "unknown"
#endif

namespace pi0::app {
namespace {

// Messages end up on one line: a stray newline (a multi-line library message) would break the
// "one line on stderr" contract scripts and tests rely on.
std::string one_line(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  std::string out;
  for (char c : s) {
    if (c == '\n') out += "; ";
    else out += c;
  }
  return out;
}

// File-system failures whose cause is the path the user gave (not a bug): mapped to exit code 2.
bool caused_by_user_path(const std::error_code& ec) {
  for (auto e : {std::errc::permission_denied, std::errc::operation_not_permitted, std::errc::read_only_file_system,
                 std::errc::not_a_directory, std::errc::is_a_directory, std::errc::file_exists,
                 std::errc::no_such_file_or_directory, std::errc::filename_too_long, std::errc::no_space_on_device,
                 std::errc::too_many_symbolic_link_levels}) {
    if (ec == e) return true;
  }
  return false;
}

std::string strip_prefix(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0 ? s.substr(prefix.size()) : s;
}

}  // namespace

std::string version_text(const std::string& program) {
  std::string cuda = "CUDA off";
#ifdef PI0_WITH_CUDA
  cuda = "CUDA on";
#endif
  std::string jpeg = "libjpeg off";
#ifdef PI0_WITH_JPEG
  jpeg = "libjpeg on";
#endif
  return program + " " PI0_VERSION " (LibTorch " TORCH_VERSION ", " + cuda + ", " + jpeg + ", " PI0_BUILD_TYPE
         " build)";
}

std::unique_ptr<CLI::App> make_parser(const std::string& program, const std::string& description) {
  auto p = std::make_unique<CLI::App>(description, program);
  p->set_version_flag("--version", version_text(program), "print the version (with the LibTorch build) and exit");
  p->set_help_flag("-h,--help", "print this help and exit");
  p->option_defaults()->always_capture_default();
  // Unknown arguments are collected and reported by parse() in the project's wording.
  p->allow_extras();
  p->get_formatter()->column_width(34);
  p->footer("Exit codes: 0 done, 1 internal error, 2 bad input (one line on stderr naming the flag, key or file).");
  return p;
}

std::optional<int> parse(CLI::App& parser, int argc, const char* const* argv) {
  try {
    parser.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << parser.help();
    return kExitOk;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << parser.help("", CLI::AppFormatMode::All);
    return kExitOk;
  } catch (const CLI::CallForVersion& e) {
    std::cout << e.what() << "\n";
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    // An unknown flag explains the rest (a misspelt required flag also reads as "missing"): it is reported first.
    const auto extra = parser.remaining();
    if (!extra.empty()) throw UserError("unknown argument '" + extra.front() + "' (see --help)");
    throw UserError(one_line(e.what()) + " (see --help)");
  }
  const auto extra = parser.remaining();
  if (!extra.empty()) throw UserError("unknown argument '" + extra.front() + "' (see --help)");
  return std::nullopt;
}

CLI::Validator int_in(int64_t lo, int64_t hi) {
  const std::string expected = hi == std::numeric_limits<int64_t>::max()
                                   ? "an integer >= " + std::to_string(lo)
                                   : "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [lo, hi, expected](std::string& v) -> std::string {
        try {
          size_t used = 0;
          const long long x = std::stoll(v, &used);
          if (used == v.size() && x >= lo && x <= hi) return "";
        } catch (const std::exception&) {
        }
        return "got '" + v + "', expected " + expected;
      },
      "INT", "int_in");
}

CLI::Validator one_of(std::vector<std::string> choices) {
  std::string expected;
  for (size_t i = 0; i < choices.size(); ++i)
    expected += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  std::string type;
  for (const auto& c : choices) type += (type.empty() ? "" : "|") + c;
  return CLI::Validator(
      [choices, expected](std::string& v) -> std::string {
        for (const auto& c : choices)
          if (v == c) return "";
        return "got '" + v + "', expected " + expected;
      },
      type, "one_of");
}

CLI::Validator non_empty() {
  return CLI::Validator([](std::string& v) -> std::string { return v.empty() ? "got '', expected a value" : ""; },
                        "", "non_empty");
}

CLI::Validator positive_number() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        try {
          size_t used = 0;
          const double x = std::stod(v, &used);
          if (used == v.size() && std::isfinite(x) && x > 0) return "";
        } catch (const std::exception&) {
        }
        return "got '" + v + "', expected a number > 0";
      },
      "NUMBER", "positive_number");
}

void add_rtc_options(CLI::App& parser, infer::RtcSettings& settings) {
  using model::RtcJacobian;
  using model::RtcSchedule;
  parser
      .add_option("--rtc", settings.mode,
                  "real-time chunking of requests that carry prev_action_chunk: auto (trained when the bundle was "
                  "trained for the delay, else guided), guided, trained or off")
      ->check(one_of({"auto", "guided", "trained", "off"}));
  auto& g = settings.guidance;
  std::vector<std::string> jacobians, schedules;
  for (auto j : {RtcJacobian::kIdentity, RtcJacobian::kExact}) jacobians.push_back(model::to_string(j));
  for (auto s : {RtcSchedule::kExp, RtcSchedule::kLinear, RtcSchedule::kOnes, RtcSchedule::kZeros})
    schedules.push_back(model::to_string(s));
  // The validators run before the callbacks, so the parse_rtc_* calls never throw.
  parser
      .add_option_function<std::string>(
          "--rtc-jacobian", [&g](const std::string& v) { g.jacobian = model::parse_rtc_jacobian(v, "--rtc-jacobian"); },
          "guided mode's correction: identity (no backward pass) or exact (one backward pass of the action expert "
          "per step)")
      ->check(one_of(jacobians))
      ->default_str(model::to_string(g.jacobian));
  parser
      .add_option_function<std::string>(
          "--rtc-schedule", [&g](const std::string& v) { g.schedule = model::parse_rtc_schedule(v, "--rtc-schedule"); },
          "guided mode's weights of the previous chunk's rows between inference_delay and execute_horizon")
      ->check(one_of(schedules))
      ->default_str(model::to_string(g.schedule));
  parser.add_option("--rtc-max-weight", g.max_weight, "guided mode's largest guidance weight (beta)")
      ->check(positive_number());
}

CLI::Option* add_config_overrides(CLI::App& parser, std::vector<std::string>& overrides) {
  return parser
      .add_option("--set", overrides, "override one config key: section.key=value (value in YAML; repeatable)")
      ->expected(1)
      ->allow_extra_args(false)  // "--set a=1 b=2": b=2 is an unknown argument, not a second assignment
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->type_name("KEY=VALUE");
}

c10::Device parse_device(const std::string& flag, const std::string& value) {
  const std::string expected = "expected cpu, cuda or cuda:N";
  if (value != "cpu" && value.rfind("cuda", 0) != 0) throw UserError(flag + ": got '" + value + "', " + expected);
  c10::Device d(c10::kCPU);
  try {
    d = c10::Device(value);
  } catch (const std::exception&) {
    throw UserError(flag + ": got '" + value + "', " + expected);
  }
  if (d.is_cuda()) {
    if (!torch::cuda::is_available()) {
      throw UserError(flag + ": got '" + value +
                      "' but no CUDA device is usable (CPU-only LibTorch or no GPU); use " + flag + " cpu");
    }
    if (d.has_index() && d.index() >= static_cast<int64_t>(torch::cuda::device_count())) {
      throw UserError(flag + ": got '" + value + "' but only " + std::to_string(torch::cuda::device_count()) +
                      " CUDA device(s) exist");
    }
  }
  return d;
}

void use_passive_openmp_wait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT")) return;  // the user's choice, or done
  ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  ::execv("/proc/self/exe", argv);
  // exec failed (no /proc): run on with the default policy; the variable stays set for child processes.
}

int run_app(const std::string& program, const std::function<int()>& main_fn) {
  auto report = [&](const std::string& kind, const std::string& what, int code) {
    std::cout.flush();
    std::cerr << program << ": " << kind << ": " << one_line(what) << std::endl;
    return code;
  };
  try {
    set_log_rank(0);  // one log line format in every program; pi0-train sets its rank once it knows it
    return main_fn();
  } catch (const UserError& e) {
    return report("error", e.what(), kExitUserError);
  } catch (const CLI::ParseError& e) {
    return report("error", std::string(e.what()) + " (see --help)", kExitUserError);
  } catch (const train::TrainingError& e) {
    return report("training stopped", e.what(), kExitDiverged);
  } catch (const distributed::DistError& e) {
    return report("distributed failure", e.what(), kExitDistributed);
  } catch (const std::system_error& e) {
    // std::filesystem_error (a std::system_error) and pi0::posix_fs's errors alike.
    const auto what = strip_prefix(e.what(), "filesystem error: ");
    if (caused_by_user_path(e.code())) return report("error", what, kExitUserError);
    return report("internal error", what, kExitInternal);
  } catch (const c10::OutOfMemoryError& e) {
    return report("out of memory", out_of_memory_message(e.what_without_backtrace(), out_of_memory_context()),
                  kExitOutOfMemory);
  } catch (const c10::Error& e) {
    return report("internal error", e.what_without_backtrace(), kExitInternal);
  } catch (const std::exception& e) {
    return report("internal error", e.what(), kExitInternal);
  } catch (...) {
    return report("internal error", "unknown exception", kExitInternal);
  }
}

}  // namespace pi0::app
