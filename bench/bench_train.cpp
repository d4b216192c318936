// bench_train: throughput and peak memory of full training steps through the real Trainer, for
// precision ∈ {float32, bf16-mixed} × gradient checkpointing ∈ {off, on} (and optionally several batch sizes).
//   bench_train [--config configs/bench_cpu.yaml] [--steps N] [--warmup W] [--batches 4,8]
//               [--precisions float32,bf16-mixed] [--workers 2] [--no-augment] [--threads T]
//               [--json out.json] [--dir DIR] [--tokenizer PATH] [--device cuda] [--peak-tflops 989]
//               [--freeze PRESET] [--checkpointing-modes 0,1] [--save-checkpoint] [--profile DIR [--profile-steps 2]]
//               [--count-ops]
// --count-ops: after each row's timed steps, one more forward + backward of a micro-batch counted instead of timed
// (train/step_census.h): its kernels by phase and name as bench_infer counts sampling's, recomputation included, and
// the bytes of float32 weights, cast copies and gradients it holds at the end of backward; printed after the results.
// --profile: each row runs --profile-steps more steps after its timed ones, recorded by the profiler
// (common/profiler.h, docs/profiling.md) into DIR/<row>/ (trace.json, profile.txt, profile.json); the timed steps
// are not profiled. The row's phase table is printed after the results.
// GPU mode (--device cuda): the same rows on the GPU; peak memory is then the CUDA caching allocator's peak
// allocation, and --peak-tflops (the device's dense bf16 peak, 989 for an H100 SXM) adds model FLOPs utilization.
// Rows are independent: a configuration that runs out of memory is tried once more at half the batch, and the row
// says "out of memory at batch N" (with the allocator's peak at that point) if that does not fit either; a child
// that fails otherwise is reported in its row and the other rows still run (exit status 1 at the end). No child
// writes a checkpoint after its last step unless --save-checkpoint (a full-size one is ~50 GB); each child removes
// its run directory, and the parent removes a dead child's.
// The parent writes a LIBERO-layout example dataset with 224×224 frames (2 cameras) and its norm stats into DIR,
// then runs every configuration in a fresh child process (fork + exec of this binary with --child), so one
// configuration's allocator state and peak RSS never leak into the next. The child builds a Trainer from the config
// (data section pointed at DIR, run_dir in DIR), runs W+N optimizer steps (forward, backward, clipping, AdamW, EMA,
// with the loader's worker threads running as in training) with log_interval = 1, and reads the per-step
// step_time_s back from metrics.jsonl; the first W steps are dropped. Step time therefore includes any wait for
// the loader. Each row also gives the training thread's CPU time per step (metrics step_cpu_s): on a machine shared
// with other work it is the steadier figure, and the checkpointing ratios are given for both. Peak RSS is the child's VmHWM at the end; "base" is VmRSS after the Trainer is built (LibTorch,
// weights, AdamW moments, EMA, prefetched batches), and "train" = peak − base, the activations and gradients.
// NOTE: with the LIBERO camera mapping, the third slot (right wrist) is a masked zero image that still goes through
// SigLIP, as in openpi: 3 × 256 image tokens per sample, not bench_cpu.yaml's one camera.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/torch.h>
#ifdef PI0_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "pi0/app/cli.h"
#include "pi0/common/check.h"
#include "pi0/common/fs.h"
#include "pi0/common/profiler.h"
#include "pi0/common/threads.h"
#include "pi0/config/config.h"
#include "pi0/data/config_options.h"
#include "pi0/data/dataset.h"
#include "pi0/data/example_data.h"
#include "pi0/data/norm_stats.h"
#include "pi0/data/tokenizer.h"
#include "pi0/model/flops.h"
#include "pi0/model/model_config.h"
#include "pi0/train/data_setup.h"
#include "pi0/train/metrics.h"
#include "pi0/train/step_census.h"
#include "pi0/train/trainer.h"

using namespace pi0;
namespace fs = pi0::posix_fs;

namespace {

struct Args {
  std::string config = "configs/bench_cpu.yaml";
  int steps = 5;                       ///< timed optimizer steps per configuration
  int warmup = 2;                      ///< untimed steps first (allocator warm-up, first-call overheads)
  std::vector<int64_t> batches;        ///< empty = train.batch_size of the config
  std::vector<std::string> precisions = {"float32", "bf16-mixed"};
  int64_t workers = 2;                 ///< data.num_workers
  bool augment = true;                 ///< data.augment
  int threads = 0;                     ///< 0 = LibTorch's default
  std::string json;
  std::string dir = (fs::temp_directory_path() / "pi0_bench_train").string();
  std::string tokenizer;
  std::string device = "cpu";
  double peak_tflops = 0;  ///< > 0: report MFU against this peak
  std::string freeze;      ///< non-empty: train.freeze preset for every row (e.g. lora, action-expert-only)
  std::string checkpointing_modes = "0,1";  ///< gradient checkpointing rows: off (0), on (1)
  bool save_checkpoint = false;  ///< the trainer's checkpoint after the last step (not timed; off: nothing to clean)
  std::string offload = "none";  ///< train.offload for every row
  int64_t grad_accum = 1;        ///< train.grad_accum_steps for every row (the batch is the global one)
  double gpu_gib = 0;            ///< > 0: cap the CUDA caching allocator at this many GiB (emulates a smaller card)
  std::string profile;           ///< non-empty: profile each row into <profile>/<row> (a child: its own folder)
  int profile_steps = 2;         ///< steps profiled after the timed ones
  bool count_ops = false;        ///< a counted forward + backward after the timed steps (train/step_census.h)
  // child mode
  bool child = false;
  std::string precision = "float32";
  std::string checkpointing = "0";  ///< "0" (off), "1" (every layer), "auto" (train.gradient_checkpointing=auto)
  int64_t batch = 0;
  std::string out;  ///< child's result file
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// Flags through the shared command-line layer (--help lists them); std::nullopt when --help/--version answered.
std::optional<Args> parse_args(int argc, char** argv) {
  Args a;
  std::string batches, precisions;
  auto cli = app::make_parser("bench_train", "Throughput and peak memory of full training steps through the real "
                                             "Trainer (precision x gradient checkpointing x batch).");
  cli->add_option("--config", a.config, "model and train config")->check(app::non_empty());
  cli->add_option("--steps", a.steps, "timed optimizer steps per configuration")->check(app::int_in(1));
  cli->add_option("--warmup", a.warmup, "untimed steps first")->check(app::int_in(0));
  cli->add_option("--batches", batches, "batch sizes, comma-separated (default: train.batch_size)");
  cli->add_option("--precisions", precisions, "train.precision rows, comma-separated (default: float32,bf16-mixed)");
  cli->add_option("--workers", a.workers, "data.num_workers")->check(app::int_in(0));
  cli->add_flag_callback("--no-augment", [&] { a.augment = false; }, "data.augment=false");
  cli->add_option("--threads", a.threads, "ATen threads (0: LibTorch's default)")->check(app::int_in(0));
  cli->add_option("--json", a.json, "also write the rows as JSON here")->check(app::non_empty());
  cli->add_option("--dir", a.dir, "where the example dataset and the runs go")->check(app::non_empty());
  cli->add_option("--tokenizer", a.tokenizer, "sentencepiece model (default: data/tokenizer/tiny_spm.model)");
  cli->add_option("--device", a.device, "cpu, cuda or cuda:N");
  cli->add_option("--peak-tflops", a.peak_tflops, "the device's dense bf16 peak: adds model FLOPs utilization");
  cli->add_option("--freeze", a.freeze, "train.freeze preset for every row");
  cli->add_option("--checkpointing-modes", a.checkpointing_modes,
                  "gradient checkpointing rows: 0 (off), 1 (on), auto (the layers the plan says the GPU needs)");
  cli->add_option("--offload", a.offload, "train.offload for every row: none, optimizer or auto");
  cli->add_option("--grad-accum", a.grad_accum, "train.grad_accum_steps for every row")->check(app::int_in(1));
  cli->add_option("--gpu-gib", a.gpu_gib,
                  "cap the CUDA caching allocator at this many GiB (setMemoryFraction): a 24 GB card is --gpu-gib 22");
  cli->add_flag("--save-checkpoint", a.save_checkpoint, "also save the final checkpoint (off: benchmarks measure steps)");
  auto* profile = cli->add_option("--profile", a.profile,
                                  "after each row's timed steps, record --profile-steps more with the profiler into "
                                  "DIR/<row>/: trace.json, profile.txt, profile.json (docs/profiling.md)")
                      ->check(app::non_empty());
  cli->add_option("--profile-steps", a.profile_steps, "with --profile: steps recorded per row")
      ->check(app::int_in(1))
      ->needs(profile);
  cli->add_flag("--count-ops", a.count_ops,
                "after each row's timed steps, count one forward + backward's operations by phase and name and the "
                "bytes of weights, cast copies and gradients it holds (train/step_census.h)");
  // One configuration in a fresh process (the parent runs this binary with them).
  cli->add_flag("--child", a.child, "internal: run one configuration")->group("");
  cli->add_option("--precision", a.precision, "internal")->group("");
  cli->add_option("--checkpointing", a.checkpointing, "internal")->check(CLI::IsMember({"0", "1", "auto"}))->group("");
  cli->add_option("--batch", a.batch, "internal")->group("");
  cli->add_option("--out", a.out, "internal: the child's result file")->group("");
  if (app::parse(*cli, argc, argv)) return std::nullopt;
  if (!batches.empty()) {
    a.batches.clear();
    for (const auto& b : split(batches)) a.batches.push_back(std::stoll(b));
  }
  if (!precisions.empty()) a.precisions = split(precisions);
  if (a.tokenizer.empty()) {
    // Run from the repo root or build/ (or pass --tokenizer).
    for (const char* c : {"data/tokenizer/tiny_spm.model", "../data/tokenizer/tiny_spm.model"})
      if (fs::exists(c)) a.tokenizer = fs::absolute(c).string();
  }
  if (a.tokenizer.empty()) throw UserError("tokenizer not found; pass --tokenizer data/tokenizer/tiny_spm.model");
  return a;
}

/// A field of /proc/self/status in MiB (VmRSS, VmHWM), or -1.
double proc_status_mib(const std::string& key) {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind(key + ":", 0) == 0) return std::stod(line.substr(key.size() + 1)) / 1024.0;  // kB
  }
  return -1;
}

/// The config with the data section pointed at the generated dataset and the bench's choices applied.
config::Config bench_config(const Args& a, int64_t batch) {
  auto cfg = config::load_config(a.config);
  cfg.data.dataset.format = "libero";
  cfg.data.dataset.paths = {(fs::path(a.dir) / "*.hdf5").string()};
  cfg.data.norm_stats = (fs::path(a.dir) / "norm_stats.json").string();
  cfg.data.tokenizer = a.tokenizer;
  cfg.data.num_workers = a.workers;
  cfg.data.augment = a.augment;
  const int64_t vocab = data::Tokenizer(a.tokenizer).vocab_size();
  cfg.model.vocab_size = std::max(cfg.model.vocab_size, vocab);
  if (batch > 0) cfg.train.batch_size = batch;
  cfg.train.precision = a.precision;
  cfg.train.device = a.device;
  cfg.checkpoint.init_weights = "";  // throughput does not depend on the weights' values
  cfg.train.gradient_checkpointing = a.checkpointing == "1" ? "true" : a.checkpointing == "auto" ? "auto" : "false";
  cfg.train.offload = a.offload;
  cfg.train.grad_accum_steps = a.grad_accum;
  if (!a.freeze.empty()) cfg.train.freeze = a.freeze;
  cfg.train.num_steps = a.warmup + a.steps + (a.profile.empty() ? 0 : a.profile_steps);
  cfg.train.log_interval = 1;
  cfg.train.lr_warmup_steps = 1;
  cfg.train.lr_decay_steps = cfg.train.num_steps;
  cfg.checkpoint.save_interval = 1000000;  // only the final checkpoint, after the last timed step
  cfg.checkpoint.keep_last = 1;
  cfg.checkpoint.keep_period = 0;
  config::validate(cfg);
  return cfg;
}

struct Timing {
  double median = 0, best = 0;
};

Timing summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Timing t;
  t.best = v.front();
  t.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  return t;
}

/// The CUDA caching allocator's peak allocation on a.device in MiB (-1 on the CPU or without CUDA).
double peak_gpu_mib(const Args& a) {
#ifdef PI0_WITH_CUDA
  const torch::Device d(a.device);
  if (d.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(d.has_index() ? d.index() : 0);
    return static_cast<double>(stats.allocated_bytes[0].peak) / (1024.0 * 1024.0);  // [0] = aggregate
  }
#endif
  (void)a;
  return -1;
}

/// --count-ops: one micro-batch's forward + backward on the trained model, counted (the first samples of the data,
/// the noise and time drawn from a fixed seed: the counts do not depend on them).
train::StepCensus count_step(train::Trainer& trainer, const config::Config& cfg) {
  const int64_t micro = config::micro_batch_size(cfg.train, 1);
  const auto pipe = train::make_data_pipeline(cfg, micro, 0, 1);
  std::vector<data::SampleRef> refs;
  for (int64_t i = 0; i < micro; ++i) refs.push_back({0, i});
  auto batch = data::make_batch(pipe.sources, refs);
  auto& model = *trainer.model();
  const auto device = model.parameters().front().device();
  batch.observation = batch.observation.to(device);
  batch.actions = batch.actions.to(device);
  torch::manual_seed(0);
  const auto noise = torch::randn(batch.actions.sizes(), torch::kFloat32).to(device);
  const auto time = (torch::rand({micro}) * 0.9 + 0.05).to(device);
  return train::census_training_step(model, batch, noise, time);
}

constexpr int kChildOutOfMemory = 3;  ///< the child's exit status when the configuration does not fit

/// Child: one configuration, result as JSON in a.out. Out of memory: {"status": "out of memory", ...}, exit 3.
int run_child(const Args& a) {
  spdlog::set_level(spdlog::level::warn);
  pi0::set_num_threads(a.threads);  // ATen, OpenMP and the BLAS alike
  auto cfg = bench_config(a, a.batch);
#ifdef PI0_WITH_CUDA
  if (a.gpu_gib > 0 && torch::Device(a.device).is_cuda()) {
    // The allocator refuses what would pass the cap as it would on a card of that size (the CUDA context is extra).
    const torch::Device d(a.device);
    const int index = d.has_index() ? d.index() : 0;
    const double total = static_cast<double>(at::cuda::getDeviceProperties(index)->totalGlobalMem);
    pi0::train::init_cuda_allocator(torch::Device(torch::kCUDA, index));
    c10::cuda::CUDACachingAllocator::setMemoryFraction(std::min(1.0, a.gpu_gib * (1ull << 30) / total), index);
  }
#endif
  const fs::path run_dir = fs::path(a.dir) / ("run_" + std::to_string(::getpid()));
  fs::remove_all(run_dir);
  cfg.checkpoint.run_dir = run_dir.string();
  double base_mib = 0;
  model::CheckpointedLayers checkpointed;  // what train.gradient_checkpointing (auto included) came to
  std::optional<train::StepCensus> census;  // --count-ops
  try {
    train::RunOptions options;
    options.final_checkpoint = a.save_checkpoint;
    if (!a.profile.empty()) {  // the steps after the timed ones
      options.profile.emplace();
      options.profile->dir = a.profile;
      options.profile->steps = a.profile_steps;
      options.profile->wait_steps = a.warmup + a.steps;
    }
    train::Trainer trainer(cfg, options);
    checkpointed = trainer.model()->checkpointed_layers();
    base_mib = proc_status_mib("VmRSS");
    trainer.run();
    if (a.count_ops) census = count_step(trainer, cfg);
  } catch (const c10::OutOfMemoryError& e) {
    const nlohmann::json out = {{"status", "out of memory"},
                                {"precision", a.precision},
                                {"gradient_checkpointing", a.checkpointing == "1"},
                                {"checkpointing_mode", a.checkpointing},
                                {"batch", cfg.train.batch_size},
                                {"peak_gpu_mib", peak_gpu_mib(a)},
                                {"rss_peak_mib", proc_status_mib("VmHWM")},
                                {"message", std::string(e.what_without_backtrace()).substr(0, 300)}};
    std::ofstream(a.out) << out.dump(2) << "\n";
    fs::remove_all(run_dir);
    return kChildOutOfMemory;
  } catch (...) {
    std::error_code ec;
    fs::remove_all(run_dir, ec);
    throw;
  }
  double peak_mib = proc_status_mib("VmHWM");
  const double gpu_mib = peak_gpu_mib(a);
  if (gpu_mib >= 0) {
    peak_mib = gpu_mib;
    base_mib = 0;
  }
  std::vector<double> step_s, cpu_s;
  std::map<std::string, std::vector<double>> host_s;  // train.offload: the host side of each step
  for (const auto& r : train::read_metrics((run_dir / "metrics.jsonl").string())) {
    const auto step = r.at("step").get<int64_t>();
    if (step <= a.warmup || step > a.warmup + a.steps) continue;  // warm-up, profiled
    step_s.push_back(r.at("step_time_s").get<double>());
    cpu_s.push_back(r.at("step_cpu_s").get<double>());
    for (const char* key : {"offload_grad_s", "offload_update_s", "offload_wait_s"})
      if (r.contains(key)) host_s[key].push_back(r.at(key).get<double>());
  }
  fs::remove_all(run_dir);
  PI0_CHECK(static_cast<int>(step_s.size()) == a.steps, "expected ", a.steps, " timed steps in metrics.jsonl, got ",
            step_s.size());
  const auto t = summarize(step_s), cpu = summarize(cpu_s);
  nlohmann::json out = {{"status", "ok"},
                        {"precision", a.precision},
                        {"offload", a.offload},
                        {"grad_accum_steps", a.grad_accum},
                        {"gpu_cap_gib", a.gpu_gib},
                        {"gradient_checkpointing", a.checkpointing == "1"},
                        {"checkpointing_mode", a.checkpointing},
                        {"checkpointed_layers", {checkpointed.vision, checkpointed.language}},
                        {"batch", cfg.train.batch_size},
                        {"step_s", step_s},
                        {"step_s_median", t.median},
                        {"step_s_best", t.best},
                        {"step_cpu_s", cpu_s},
                        {"step_cpu_s_median", cpu.median},
                        {"samples_per_s_median", static_cast<double>(cfg.train.batch_size) / t.median},
                        {"samples_per_s_best", static_cast<double>(cfg.train.batch_size) / t.best},
                        {"rss_base_mib", base_mib},
                        {"rss_peak_mib", peak_mib},
                        {"rss_train_mib", peak_mib - base_mib},
                        {"peak_gpu_mib", gpu_mib},
                        {"torch_threads", at::get_num_threads()},
                        {"blas_threads", pi0::thread_counts().blas}};
  for (const auto& [key, values] : host_s) out[key + "_median"] = summarize(values).median;
  if (census) out["census"] = census->to_json(), out["census_text"] = census->format();
  std::ofstream(a.out) << out.dump(2) << "\n";
  return 0;
}

/// The folder of one row's profile: <--profile>/<precision>_ckpt-<mode>_b<batch>.
std::string profile_row_dir(const Args& a, const std::string& precision, const std::string& checkpointing,
                            int64_t batch) {
  return (fs::path(a.profile) / (precision + "_ckpt-" + checkpointing + "_b" + std::to_string(batch))).string();
}

/// Parent: runs one configuration in a fresh process and returns its result: the child's JSON ("status" ok or
/// "out of memory"), or {"status": "failed (...)"} if it died or wrote nothing. Never throws for a child's failure.
nlohmann::json spawn_child(const Args& a, const std::string& precision, const std::string& checkpointing,
                           int64_t batch) {
  const std::string out = (fs::path(a.dir) / "child_result.json").string();
  fs::remove(out);
  std::vector<std::string> args = {"/proc/self/exe", "--child", "--config", a.config, "--steps", std::to_string(a.steps),
                                   "--warmup", std::to_string(a.warmup), "--workers", std::to_string(a.workers),
                                   "--threads", std::to_string(a.threads), "--dir", a.dir, "--tokenizer", a.tokenizer,
                                   "--precision", precision, "--checkpointing", checkpointing,
                                   "--batch", std::to_string(batch), "--out", out, "--device", a.device,
                                   "--offload", a.offload, "--grad-accum", std::to_string(a.grad_accum),
                                   "--gpu-gib", std::to_string(a.gpu_gib)};
  if (!a.freeze.empty()) args.insert(args.end(), {"--freeze", a.freeze});
  if (!a.profile.empty()) {
    args.insert(args.end(), {"--profile", profile_row_dir(a, precision, checkpointing, batch), "--profile-steps",
                             std::to_string(a.profile_steps)});
  }
  if (!a.augment) args.push_back("--no-augment");
  if (a.save_checkpoint) args.push_back("--save-checkpoint");
  if (a.count_ops) args.push_back("--count-ops");
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::execv(argv[0], argv.data());
    std::perror("execv");
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  // A child killed mid-run (a signal, the OOM killer) leaves its run directory: it is removed here.
  std::error_code ec;
  fs::remove_all(fs::path(a.dir) / ("run_" + std::to_string(pid)), ec);
  const bool exited = WIFEXITED(status);
  const int code = exited ? WEXITSTATUS(status) : -1;
  if (exited && (code == 0 || code == kChildOutOfMemory) && fs::exists(out)) {
    std::ifstream f(out);
    return nlohmann::json::parse(f);
  }
  const std::string why = exited ? "exit " + std::to_string(code) : "signal " + std::to_string(WTERMSIG(status));
  return {{"status", "failed (" + why + ")"}, {"precision", precision}, {"gradient_checkpointing", checkpointing == "1"},
          {"checkpointing_mode", checkpointing}, {"batch", batch}};
}

// The table's checkpointing column: off, on, or what auto chose ("auto: 25+18" vision+joint layers recomputed).
std::string ckpt_label(const std::string& mode, const nlohmann::json& row) {
  if (mode != "auto") return mode == "1" ? "on" : "off";
  if (!row.contains("checkpointed_layers")) return "auto";
  return "auto: " + std::to_string(row["checkpointed_layers"][0].get<int64_t>()) + "+" +
         std::to_string(row["checkpointed_layers"][1].get<int64_t>());
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

int run_parent(Args a) {
  spdlog::set_level(spdlog::level::warn);
  if (!a.profile.empty()) {  // refused before anything is written
    make_profile_dir(a.profile, "--profile");
    a.profile = fs::absolute(a.profile).string();
  }
  const bool created_dir = fs::create_directories(a.dir);
  a.dir = fs::absolute(a.dir).string();
  a.config = fs::absolute(a.config).string();
  // Enough frames for the longest child (W+N steps of the largest batch) without wrapping an epoch.
  const int64_t max_batch = a.batches.empty() ? config::load_config(a.config).train.batch_size
                                              : *std::max_element(a.batches.begin(), a.batches.end());
  data::ExampleDataOptions eo;
  eo.image_size = 224;
  eo.episodes = 4;
  eo.steps = std::max<int64_t>(50, (a.warmup + a.steps + 4 /*prefetch*/ + 1) * max_batch / eo.episodes + 1);
  data::write_example_libero(a.dir, eo);
  const auto cfg0 = bench_config(a, a.batches.empty() ? 0 : a.batches.front());
  int64_t frames = 0;
  {
    data::RobotDataset dataset(data::dataset_options(cfg0));
    frames = dataset.size();
    data::save_norm_stats(data::compute_norm_stats(dataset), cfg0.data.norm_stats);
  }
  const auto mopts = model::options_from_config(cfg0.model);
  if (a.batches.empty()) a.batches = {cfg0.train.batch_size};

  std::printf("# bench_train\n\nconfig %s (%s, prefix width %lld, expert width %lld, depth %lld, SigLIP %s at %lld)\n",
              a.config.c_str(), mopts.pi05 ? "pi05" : "pi0", static_cast<long long>(mopts.paligemma.width),
              static_cast<long long>(mopts.action_expert.width), static_cast<long long>(mopts.paligemma.depth),
              cfg0.model.siglip_variant.describe().c_str(), static_cast<long long>(cfg0.model.image_size));
  std::printf("data: %lld frames, 224x224, LIBERO cameras (2 real + 1 masked slot); loader workers %lld, augment %s\n",
              static_cast<long long>(frames), static_cast<long long>(a.workers), a.augment ? "on" : "off");
  std::printf("each row: a fresh process, %d warm-up + %d timed steps (fwd+bwd+clip+AdamW+EMA), median and best step\n"
              "%s in the parent; children use --threads %d (0 = the same default)\n\n",
              a.warmup, a.steps, pi0::set_num_threads(a.threads).describe().c_str(), a.threads);
  const bool gpu = torch::Device(a.device).is_cuda();
  std::printf("| precision | grad ckpt | batch | step s (median) | step s (best) | CPU s (median) | samples/s (median) "
              "| samples/s (best) | %s | base MiB | train MiB | MFU |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
              gpu ? "peak GPU alloc MiB" : "peak RSS MiB");
  nlohmann::json rows = nlohmann::json::array();
  bool any_failed = false;
  for (const int64_t batch : a.batches) {
    for (const auto& precision : a.precisions) {
      for (const std::string ckpt : {"0", "1", "auto"}) {
        const auto modes = split(a.checkpointing_modes);
        if (std::find(modes.begin(), modes.end(), ckpt) == modes.end()) continue;
        auto r = spawn_child(a, precision, ckpt, batch);
        // Does not fit: once more at the next smaller batch (half), so the row still says what does fit.
        std::vector<int64_t> oom_batches;
        while (r["status"] == "out of memory" && oom_batches.size() < 2) {
          oom_batches.push_back(r["batch"].get<int64_t>());
          if (oom_batches.size() == 2 || batch / 2 < 1) break;
          r = spawn_child(a, precision, ckpt, batch / 2);
        }
        r["batch_requested"] = batch;
        r["out_of_memory_at_batches"] = oom_batches;
        const std::string status = r["status"].get<std::string>();
        const int64_t b = r["batch"].get<int64_t>();
        const std::string note =
            oom_batches.empty() ? "" : " (out of memory at batch " + std::to_string(oom_batches.front()) + ")";
        if (status == "ok") {
          // Model FLOPs (recomputation not counted) per second over the device's peak.
          const double step_flops = static_cast<double>(model::training_step_flops(mopts, b, 3));
          r["mfu"] = a.peak_tflops > 0 ? step_flops / r["step_s_median"].get<double>() / (a.peak_tflops * 1e12) : 0.0;
          std::printf("| %s | %s | %lld%s | %.3f | %.3f | %.3f | %.2f | %.2f | %.0f | %.0f | %.0f | %s |\n",
                      precision.c_str(), ckpt_label(ckpt, r).c_str(), static_cast<long long>(b), note.c_str(),
                      r["step_s_median"].get<double>(), r["step_s_best"].get<double>(),
                      r["step_cpu_s_median"].get<double>(), r["samples_per_s_median"].get<double>(),
                      r["samples_per_s_best"].get<double>(), r["rss_peak_mib"].get<double>(),
                      r["rss_base_mib"].get<double>(), r["rss_train_mib"].get<double>(),
                      a.peak_tflops > 0 ? (fmt("%.1f", 100 * r["mfu"].get<double>()) + " %").c_str() : "-");
        } else {
          const bool oom = status == "out of memory";
          any_failed = any_failed || !oom;
          std::string what = oom ? "out of memory at batch " + std::to_string(b) : status;
          if (oom && oom_batches.size() == 2) what += " (and at batch " + std::to_string(oom_batches.front()) + ")";
          const double peak = oom ? r.value("peak_gpu_mib", -1.0) : -1.0;
          std::printf("| %s | %s | %lld | %s | | | | | %s | | | |\n", precision.c_str(), ckpt_label(ckpt, r).c_str(),
                      static_cast<long long>(batch), what.c_str(),
                      peak >= 0 ? (fmt("%.0f", peak) + " (at the failure)").c_str() : "-");
        }
        std::fflush(stdout);
        rows.push_back(r);
      }
    }
  }

  std::printf("\nGradient checkpointing on vs off (targets: peak memory <= 60 %%, step time <= 1.3x)\n\n"
              "| precision | batch | peak RSS on/off | train MiB on/off | step time on/off (median) | (best) "
              "| CPU time on/off (median) |\n|---|---|---|---|---|---|---|\n");
  nlohmann::json ratios = nlohmann::json::array();
  for (size_t i = 0; i + 1 < rows.size(); ++i) {
    const auto &off = rows[i], &on = rows[i + 1];
    // Only a measured off/on pair of the same precision and batch compares.
    if (off["status"] != "ok" || on["status"] != "ok" || off["gradient_checkpointing"] != false ||
        on["gradient_checkpointing"] != true || off["precision"] != on["precision"] || off["batch"] != on["batch"])
      continue;
    const double peak = on["rss_peak_mib"].get<double>() / off["rss_peak_mib"].get<double>();
    const double train = on["rss_train_mib"].get<double>() / off["rss_train_mib"].get<double>();
    const double time_med = on["step_s_median"].get<double>() / off["step_s_median"].get<double>();
    const double time_best = on["step_s_best"].get<double>() / off["step_s_best"].get<double>();
    const double cpu_med = on["step_cpu_s_median"].get<double>() / off["step_cpu_s_median"].get<double>();
    std::printf("| %s | %lld | %s | %s | %sx | %sx | %sx |\n", off["precision"].get<std::string>().c_str(),
                static_cast<long long>(off["batch"].get<int64_t>()), (fmt("%.0f", 100 * peak) + " %").c_str(),
                (fmt("%.0f", 100 * train) + " %").c_str(), fmt("%.2f", time_med).c_str(),
                fmt("%.2f", time_best).c_str(), fmt("%.2f", cpu_med).c_str());
    ratios.push_back({{"precision", off["precision"]},
                      {"batch", off["batch"]},
                      {"peak_rss_ratio", peak},
                      {"train_rss_ratio", train},
                      {"step_time_ratio_median", time_med},
                      {"step_time_ratio_best", time_best},
                      {"step_cpu_ratio_median", cpu_med}});
  }
  if (!a.profile.empty()) {
    std::printf("\nProfiles (--profile %s, %d steps after the timed ones; the whole table in each folder's "
                "profile.txt, the trace in trace.json)\n", a.profile.c_str(), a.profile_steps);
    for (auto& r : rows) {
      if (r["status"] != "ok") continue;
      const auto dir = profile_row_dir(a, r["precision"].get<std::string>(), r["checkpointing_mode"].get<std::string>(),
                                       r["batch"].get<int64_t>());
      r["profile_dir"] = dir;
      std::ifstream f(fs::path(dir) / "profile.txt");
      const std::string table((std::istreambuf_iterator<char>(f)), {});
      std::printf("\n### %s\n\n%s", dir.c_str(), table.empty() ? "(no profile written)\n" : phase_summary(table).c_str());
    }
  }
  if (a.count_ops) {
    std::printf("\nOperations of one forward + backward per row (--count-ops; train/step_census.h)\n");
    for (const auto& r : rows) {
      if (!r.contains("census_text")) continue;
      std::printf("\n### %s, checkpointing %s, batch %lld\n\n%s", r["precision"].get<std::string>().c_str(),
                  ckpt_label(r["checkpointing_mode"].get<std::string>(), r).c_str(),
                  static_cast<long long>(r["batch"].get<int64_t>()), r["census_text"].get<std::string>().c_str());
    }
  }
  if (!a.json.empty()) {
    nlohmann::json j = {{"config", a.config}, {"steps", a.steps},       {"warmup", a.warmup},
                        {"workers", a.workers}, {"augment", a.augment}, {"rows", rows},
                        {"checkpointing_ratios", ratios}};
    std::ofstream(a.json) << j.dump(2) << "\n";
  }
  // Only what this run wrote: --dir may name an existing directory.
  if (created_dir) fs::remove_all(a.dir);
  else for (const auto* f : {"reach_the_red_blob_demo.hdf5", "norm_stats.json", "child_result.json"}) fs::remove(fs::path(a.dir) / f);
  return any_failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  app::use_passive_openmp_wait(argv);  // as pi0-train: the CPU rows measure what it runs
  return app::run_app("bench_train", [&] {
    const auto args = parse_args(argc, argv);
    if (!args) return 0;
    return args->child ? run_child(*args) : run_parent(*args);
  });
}
