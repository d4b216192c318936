// The profiler in the product: records N steps of training (pi0-train --profile-steps, bench_train --profile) or N
// sampling calls (bench_infer --profile) with LibTorch's Kineto profiler (torch/csrc/autograd/profiler_kineto.h; CPU
// operations always, CUDA kernels, copies and memsets where there is a GPU), and writes into one folder:
//   trace.json    Chrome/Perfetto trace (ui.perfetto.dev, chrome://tracing): every operation and every phase range
//   profile.txt   the table: time per phase, the top operations and kernels, the device's idle time between kernels
//   profile.json  the same figures as JSON
// Phases are ranges the code marks with ProfileScope: a RecordFunction user scope named "pi0::forward" etc., so they
// show in the trace as well; with no profiler running a scope costs one check of RecordFunction's callbacks. The
// loop that owns the steps calls begin_step()/end_step() and nothing else (torchtitan's maybe_enable_profiling plays
// the same part); docs/profiling.md says how to read the output.
// NOTE: the profiler is thread-local, as torch.profiler's default: it records the thread that starts it and the
// threads LibTorch hands its state to (the autograd engine's device threads, at::launch), not threads of our own.
// NOTE: LibTorch built without Kineto (Debian's 1.13) cannot save its trace (ProfilerResult::save throws); the trace
// is then written here from the recorded events, which on such a build are all there is (CPU operations and ranges).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/record_function.h>
#include <nlohmann/json.hpp>

namespace pi0 {

/// The ranges the training step and sampling are marked with (ProfileScope); names as they appear in the trace.
namespace phase {
inline constexpr char kStep[] = "pi0::step";                ///< one optimizer step (the profiler's own range)
inline constexpr char kDataWait[] = "pi0::data_wait";       ///< the training thread waiting for the next batches
inline constexpr char kForward[] = "pi0::forward";          ///< inputs to the device, noise, the loss
inline constexpr char kBackward[] = "pi0::backward";        ///< backward, gradient checkpointing's recomputation included
inline constexpr char kGradSync[] = "pi0::grad_sync";      ///< data parallel: the gradient all-reduce's wait
inline constexpr char kRecompute[] = "pi0::recompute";      ///< (in backward) a checkpointed layer's forward run again
inline constexpr char kGradNormClip[] = "pi0::grad_norm_clip";  ///< gradient sync read-back, global norm, clipping
inline constexpr char kOptimizer[] = "pi0::optimizer";      ///< AdamW (or, offloaded, handing the update to the host)
inline constexpr char kEma[] = "pi0::ema";                  ///< the EMA update
inline constexpr char kOffload[] = "pi0::offload";          ///< train.offload's work on the training thread
inline constexpr char kOffloadWait[] = "pi0::offload_wait";  ///< (in forward) a layer waiting for its updated weights
inline constexpr char kMetrics[] = "pi0::metrics";          ///< metrics.jsonl and the progress line
inline constexpr char kValidate[] = "pi0::validate";        ///< a validation pass
inline constexpr char kCheckpoint[] = "pi0::checkpoint";    ///< writing a checkpoint
inline constexpr char kSample[] = "pi0::sample";            ///< one sample_actions call (bench_infer's step)
inline constexpr char kPrefix[] = "pi0::prefix";            ///< sampling: the prefix pass (KV cache)
inline constexpr char kDenoise[] = "pi0::denoise";          ///< sampling: the denoising steps
}  // namespace phase

/// A named range in the profiler's trace and table (a RecordFunction user scope) for the object's lifetime.
/// `name` must outlive the scope (a string literal: the phase:: names).
class ProfileScope {
 public:
  explicit ProfileScope(const char* name);
  /// Ends the range before the object goes out of scope (a phase that ends mid-block).
  void end() { range_.end(); }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  at::RecordFunction range_;
};

/// One recorded event, as the analysis sees it (LibTorch's KinetoEvent differs between versions).
struct ProfileEvent {
  enum class Kind {
    kOp,      ///< an ATen operation or autograd node on a CPU thread
    kRange,   ///< a ProfileScope (user scope)
    kDevice,  ///< a kernel, copy or memset on a device
  };
  std::string name;
  Kind kind = Kind::kOp;
  uint64_t thread = 0;    ///< CPU thread (profiler's id), or the device stream for kDevice
  double start_us = 0;    ///< microseconds, one clock for CPU and device events
  double duration_us = 0;
  double end_us() const { return start_us + duration_us; }
};

/// Time in one phase (a ProfileScope name) over the recorded steps.
struct PhaseTime {
  std::string name;
  std::string parent;  ///< the enclosing phase for a nested one ("pi0::backward" for recompute); empty at the top
  int64_t calls = 0;
  double total_ms = 0;
};

/// Time of one operation (or kernel) name over the recorded steps.
struct OpTime {
  std::string name;
  int64_t calls = 0;
  double self_ms = 0;   ///< excluding the operations it called (for kernels: the kernel's time)
  double total_ms = 0;  ///< including them
};

/// What the recorded steps did (analyze_profile).
struct ProfileReport {
  int64_t steps = 0;
  double step_ms = 0;          ///< all recorded steps together (the step ranges' time)
  std::vector<PhaseTime> phases;  ///< top-level phases in order of first appearance, each followed by its nested ones
  double unattributed_ms = 0;  ///< step time outside every top-level phase (loop bookkeeping between phases)
  std::vector<OpTime> ops;     ///< CPU operations by self time, descending
  std::vector<OpTime> kernels;  ///< device kernels, copies and memsets by time, descending (empty on the CPU)
  bool device_events = false;  ///< some kernel ran on a device (else the idle figures are n/a)
  double device_busy_ms = 0;   ///< union of the device's busy intervals within the steps
  double device_idle_ms = 0;   ///< step time minus busy time: waiting for the host, the launch gaps
  int64_t device_gaps = 0;     ///< idle gaps between consecutive device activities within a step
  double device_max_gap_ms = 0;

  /// The text table (profile.txt): phases, the top `top` operations and kernels, device idle time.
  std::string format(int64_t top = 30) const;
  nlohmann::json to_json() const;
};

/// The phases, operations and device idle time of `events` within the ranges named `step_name` (the steps).
/// Nesting is by time on each thread: an operation's self time excludes what it contains.
ProfileReport analyze_profile(const std::vector<ProfileEvent>& events, const std::string& step_name);

/// A Chrome/Perfetto trace (the "traceEvents" JSON format) of `events`, times relative to the first one.
void write_chrome_trace(const std::vector<ProfileEvent>& events, const std::string& path);

/// Makes the folder `dir` (and its parents) for a profile now, so a bad one is refused before any work: a UserError
/// naming `flag` otherwise ("--profile-dir: got 'x', which cannot be made a folder (File exists); ...").
void make_profile_dir(const std::string& dir, const std::string& flag);

/// The per-step time, the phase table and the device idle line of a profile.txt (`table`, ProfileReport::format),
/// without the operation tables: what a benchmark prints per row.
std::string phase_summary(const std::string& table);

struct ProfilerOptions {
  std::string dir;            ///< where trace.json, profile.txt and profile.json go (created); e.g. runs/debug/profile
  int64_t steps = 3;          ///< steps recorded, e.g. 3
  int64_t wait_steps = 1;     ///< steps run unrecorded first (first-call allocations and initialization)
  const char* step_name = phase::kStep;  ///< the range each recorded step is marked with (phase::kSample for sampling)
  /// Record device kernels: nullopt = where LibTorch has CUDA and a GPU is present.
  std::optional<bool> cuda;
  int64_t top = 30;           ///< rows of the operation and kernel tables in profile.txt

  /// These options for a loop with `steps_left` steps to run: at most that many recorded, the wait shortened so
  /// the recorded steps fit.
  ProfilerOptions fit(int64_t steps_left) const;
};

/// Records steps wait_steps+1 ... wait_steps+steps of the loop that calls begin_step()/end_step() around each step,
/// then writes the folder. Not copyable; one per thread at a time (LibTorch's profiler is per thread).
class Profiler {
 public:
  explicit Profiler(ProfilerOptions options);
  /// A recording still running is stopped and discarded.
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  /// Before a step: starts recording at the first recorded step and opens the step's range.
  void begin_step();
  /// After the step begun last: closes its range; after the last recorded one stops and writes the folder.
  /// Returns true when this call wrote it.
  bool end_step();
  /// The loop ended before the last recorded step (a stop signal, fewer steps than asked): writes what was
  /// recorded. Does nothing when nothing is being recorded.
  void finish();

  bool recording() const { return recording_; }
  /// The figures written, once written.
  const std::optional<ProfileReport>& report() const { return report_; }
  const ProfilerOptions& options() const { return options_; }

 private:
  void stop_and_write();

  ProfilerOptions options_;
  bool cuda_ = false;
  bool recording_ = false;
  int64_t steps_seen_ = 0;      ///< begin_step calls so far
  int64_t steps_recorded_ = 0;  ///< recorded steps ended so far
  std::unique_ptr<at::RecordFunction> step_range_;
  std::optional<ProfileReport> report_;
};

}  // namespace pi0
