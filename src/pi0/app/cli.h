// The command-line layer every pi0 program shares (apps/ and bench/): CLI11 parsers with the same --help and
// --version, validators whose messages name the flag, the value received and what was expected, and run_app(),
// the one place that turns what a program throws into an exit code and one line on stderr. Library code below
// this layer never exits and never prints errors; a program's main() is `return pi0::app::run_app(...)`.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <c10/core/Device.h>

namespace pi0::infer {
struct RtcSettings;
}

namespace pi0::app {

/// Exit codes of every pi0 program (docs/troubleshooting.md, "Exit codes").
enum ExitCode : int {
  kExitOk = 0,           ///< done, or stopped on request (SIGINT/SIGTERM)
  kExitInternal = 1,     ///< a bug: "<program>: internal error: ..."
  kExitUserError = 2,    ///< bad flag, config key, path or input file: "<program>: error: ..." naming it
  kExitDiverged = 3,     ///< pi0-train: non-finite loss or gradient norm (train::TrainingError)
  kExitOutOfMemory = 3,  ///< a device ran out of memory: "<program>: out of memory: ..." (app/out_of_memory.h)
  kExitDistributed = 4,  ///< pi0-train: a peer rank died or hung, rendezvous failed (distributed::DistError)
};

/// One line: "pi0-train 0.1.0 (LibTorch 1.13.1, CUDA off, libjpeg on, Release build)".
std::string version_text(const std::string& program);

/// A parser for `program`: -h/--help lists every option with its default, --version prints version_text().
/// `description` is the first line of --help; the exit codes are its last.
std::unique_ptr<CLI::App> make_parser(const std::string& program, const std::string& description);

/// Parses the command line. Returns the exit code when the program is done (--help or --version printed: 0),
/// else nullopt. Unknown arguments, missing values and failed validators throw pi0::UserError naming the flag,
/// e.g. "--port: got '70000', expected an integer in [0, 65535] (see --help)".
std::optional<int> parse(CLI::App& parser, int argc, const char* const* argv);

/// Validators in the project's message style ("got 'X', expected ..."); CLI11 prefixes the flag.
/// An integer in [lo, hi] (hi = max: "an integer >= lo").
CLI::Validator int_in(int64_t lo, int64_t hi = std::numeric_limits<int64_t>::max());
/// One of `choices` exactly.
CLI::Validator one_of(std::vector<std::string> choices);
/// Anything but the empty string (paths: an empty value would silently mean "not given").
CLI::Validator non_empty();
/// A finite number > 0.
CLI::Validator positive_number();

/// The config override flag of pi0-train and pi0-norm-stats: `--set section.key=value`, one assignment per
/// occurrence, repeatable (config::load_config applies them in order).
CLI::Option* add_config_overrides(CLI::App& parser, std::vector<std::string>& overrides);

/// The real-time chunking flags of pi0-infer and pi0-serve, parsed into `settings` (docs/serving.md): --rtc
/// auto|guided|trained|off, --rtc-jacobian identity|exact, --rtc-schedule exp|linear|ones|zeros, --rtc-max-weight
/// BETA (> 0). Their defaults are RtcSettings' own.
void add_rtc_options(CLI::App& parser, infer::RtcSettings& settings);

/// `value` of `flag` as a device: cpu, cuda or cuda:N, usable on this machine (UserError otherwise).
c10::Device parse_device(const std::string& flag, const std::string& value);

/// Called first in main(): unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set, re-executes the program (same pid and
/// arguments) with OMP_WAIT_POLICY=PASSIVE. libgomp reads its wait policy once, when it is loaded, so it cannot be
/// set later from inside the process. Its default, spinning at every barrier, made each parallel ATen operation on
/// the training thread wait for a partner thread preempted by the loader's workers or another process: configs/debug.yaml
/// trained 2-10x slower on a 2-core machine (docs/benchmarks.md, "OpenMP wait policy"). Numerics are unchanged.
void use_passive_openmp_wait(char** argv);

/// Runs main_fn and returns its exit code; what it throws becomes one line on stderr prefixed with `program` and
/// an exit code: pi0::UserError, CLI parse errors and file-system errors on user paths (permission denied, not
/// a directory, ...) → 2 "error: ..."; train::TrainingError → 3; c10::OutOfMemoryError → 3 "out of memory: ..."
/// (out_of_memory_message: the plan, the GPU's total, the levers); distributed::DistError → 4; anything else → 1
/// "internal error: ..." (without a C++ stack trace).
int run_app(const std::string& program, const std::function<int()>& main_fn);

}  // namespace pi0::app
