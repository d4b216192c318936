// bench_infer: sampling latency (prefix pass + 10 Euler steps with the KV cache) for 1 and 3 cameras, the number a
// robot sees per action chunk. Random weights: latency does not depend on their values.
//   bench_infer [--config configs/pi05_libero.yaml] [--device cpu|cuda] [--dtype bf16|float32]
//               [--cameras 1,3] [--batches 1,8] [--iters N] [--warmup W] [--json out.json] [--cuda-graph off,on]
//               [--fused on,off] [--rtc off,trained,guided-identity,guided-exact] [--rtc-delay 5]
//               [--profile DIR [--profile-calls 3]]
// --profile: after each row's timed calls, --profile-calls more recorded by the profiler (common/profiler.h,
// docs/profiling.md) into DIR/<row>/ (trace.json, profile.txt, profile.json): the prefix pass and the denoising
// steps as phases, the operations and (on CUDA) the kernels, replayed CUDA graphs included, and the GPU's idle time.
// --cuda-graph: rows with the whole call (prefix pass and denoising loop) replayed as CUDA graphs ("on") and
// launched op by op ("off"). --fused: on the simplified weights (model/fused_inference.h) or through the modules.
// Each row also counts the ATen operations dispatched by the prefix pass and by one denoise step (common/op_count.h,
// counted eagerly: what a CUDA graph of them holds), the device-free proxy for kernel launches: "top" are the
// model code's own calls, "all" every dispatch.
// --rtc: rows continuing a previous chunk of H random rows with inference_delay --rtc-delay (real-time chunking,
// model/rtc.h): trained mode replays the CUDA graph too; guided mode always runs eager (the exact product's backward
// pass is not captured), so its "on" rows measure the eager loop.
// Targets for the full-size models on an H100 (issue 36): pi0 3 cameras <= 20 ms, 1 camera <= 12 ms; pi0.5 3 cameras
// <= 22 ms; batch 8 reported as actions chunks per second.
// On CUDA, SampleTiming synchronizes the device before reading each clock.
#include <algorithm>
#include <fstream>
#include <iostream>
#include <optional>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pi0/app/cli.h"
#include "pi0/common/check.h"
#include "pi0/common/op_count.h"
#include "pi0/common/profiler.h"
#include "pi0/nn/param_device.h"
#include "pi0/config/config.h"
#include "pi0/model/model_config.h"
#include "pi0/model/pi0.h"

using namespace pi0;

namespace {

struct Args {
  std::string config = "configs/pi05_libero.yaml", device = "cpu", dtype = "bf16", json;
  std::vector<int64_t> cameras = {1, 3}, batches = {1};
  std::vector<std::string> cuda_graph = {"off"}, fused = {"on"}, rtc = {"off"};
  int iters = 20, warmup = 3;
  int64_t rtc_delay = 5;
  std::string profile;    ///< non-empty: profile each row into <profile>/<row>
  int profile_calls = 3;  ///< sampling calls recorded per row
};

// Flags through the shared command-line layer (--help lists them); std::nullopt when --help/--version answered.
std::optional<Args> parse_args(int argc, char** argv) {
  Args a;
  auto cli = app::make_parser("bench_infer", "Sampling latency (prefix pass + 10 steps) per camera count and batch.");
  cli->add_option("--config", a.config, "model config (random weights)")->check(app::non_empty());
  cli->add_option("--device", a.device, "cpu, cuda or cuda:N");
  cli->add_option("--dtype", a.dtype, "weights and compute")->check(app::one_of({"bf16", "float32"}));
  cli->add_option("--cameras", a.cameras, "camera counts, comma-separated")->delimiter(',')->check(app::int_in(1, 3));
  cli->add_option("--batches", a.batches, "batch sizes, comma-separated")->delimiter(',')->check(app::int_in(1, 64));
  cli->add_option("--iters", a.iters, "timed repetitions")->check(app::int_in(1));
  cli->add_option("--warmup", a.warmup, "untimed repetitions first")->check(app::int_in(0));
  cli->add_option("--json", a.json, "also write the rows as JSON here")->check(app::non_empty());
  cli->add_option("--cuda-graph", a.cuda_graph, "on and/or off, comma-separated")
      ->delimiter(',')
      ->check(app::one_of({"on", "off"}));
  cli->add_option("--fused", a.fused, "simplified weights on and/or off, comma-separated")
      ->delimiter(',')
      ->check(app::one_of({"on", "off"}));
  cli->add_option("--rtc", a.rtc, "real-time chunking modes, comma-separated: off, trained, guided-identity, guided-exact")
      ->delimiter(',')
      ->check(app::one_of({"off", "trained", "guided-identity", "guided-exact"}));
  cli->add_option("--rtc-delay", a.rtc_delay, "inference_delay of the --rtc rows (at most the action horizon - 1)")
      ->check(app::int_in(0));
  auto* profile = cli->add_option("--profile", a.profile,
                                  "after each row's timed calls, record --profile-calls more with the profiler into "
                                  "DIR/<row>/: trace.json, profile.txt, profile.json (docs/profiling.md)")
                      ->check(app::non_empty());
  cli->add_option("--profile-calls", a.profile_calls, "with --profile: sampling calls recorded per row")
      ->check(app::int_in(1))
      ->needs(profile);
  if (app::parse(*cli, argc, argv)) return std::nullopt;
  return a;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One --rtc row's request: a previous chunk of H random model-space rows (what the model makes of them does not
// change the cost), `delay` of them committed.
model::RtcRequest rtc_request(const std::string& mode, int64_t delay, int64_t batch, const model::Pi0Options& opts,
                              const torch::TensorOptions& f32) {
  model::RtcRequest r;
  if (mode == "off") return r;
  r.mode = mode == "trained" ? model::RtcMode::kTrained : model::RtcMode::kGuided;
  r.guidance.jacobian = mode == "guided-exact" ? model::RtcJacobian::kExact : model::RtcJacobian::kIdentity;
  r.prev = torch::randn({batch, opts.action_horizon, opts.action_dim}, f32);
  r.delay = delay;
  return r;
}

}  // namespace

int bench_main(int argc, char** argv) {
  const auto parsed = parse_args(argc, argv);
  if (!parsed) return 0;
  const Args& a = *parsed;
  const torch::Device device = app::parse_device("--device", a.device);
  if (!a.profile.empty()) make_profile_dir(a.profile, "--profile");
  const auto cfg = config::load_config(a.config);
  const auto opts = model::options_from_config(cfg.model);
  torch::NoGradGuard no_grad;
  model::Pi0 m{nullptr};
  {
    nn::ParamDeviceScope on_device(device);  // random weights made on the GPU, not on the host
    m = model::Pi0(opts);
  }
  const auto dtype = a.dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  // Inference weights in the compute dtype (openpi's JAX inference loads every parameter as bf16).
  m->to(device, dtype);
  m->set_compute_dtype(dtype);
  m->eval();
  // Below the horizon: the robot continues at row d of the answer.
  const int64_t rtc_delay = std::min<int64_t>(a.rtc_delay, opts.action_horizon - 1);
  std::cout << "# bench_infer\n\nconfig " << a.config << " (" << (opts.pi05 ? "pi05" : "pi0") << "), device "
            << a.device << ", " << a.dtype << " weights and compute, 10 steps with KV cache, median of " << a.iters
            << " after " << a.warmup << " warm-up"
            << (a.rtc == std::vector<std::string>{"off"} ? "" : "; rtc rows: inference_delay " + std::to_string(rtc_delay))
            << "\n\n"
            << "| cameras | batch | fused | cuda graph | rtc | prefix ms | per step ms | total ms | chunks/s | prefix ops "
               "top/all | step ops top/all |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
  nlohmann::json rows = nlohmann::json::array();
  std::string profile_summaries;  // printed after the table
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  for (const auto& fused : a.fused)
  for (const auto& graph : a.cuda_graph)
  for (const int64_t batch : a.batches)
  for (const int64_t cams : a.cameras)
  for (const auto& rtc_mode : a.rtc) {
    m->set_fused_inference(fused == "on");
    model::Observation obs;
    for (int64_t c = 0; c < cams; ++c) {
      obs.images.push_back(torch::rand({batch, 3, opts.siglip.image_size, opts.siglip.image_size}, f32) * 2 - 1);
      obs.image_masks.push_back(torch::ones({batch}, torch::TensorOptions().dtype(torch::kBool).device(device)));
    }
    obs.state = torch::zeros({batch, opts.action_dim}, f32);
    obs.tokenized_prompt = torch::randint(1, 1000, {batch, opts.max_token_len}, f32.dtype(torch::kLong));
    obs.tokenized_prompt_mask = torch::ones({batch, opts.max_token_len}, f32.dtype(torch::kBool));
    auto noise = torch::randn({batch, opts.action_horizon, opts.action_dim}, f32);
    const auto rtc = rtc_request(rtc_mode, rtc_delay, batch, opts, f32);
    // Operations of the prefix pass and of one step: a 1-step call has both, a 2-step call one step more.
    m->set_cuda_graph(false);
    const auto ops = [&](int64_t steps) {
      OpCounter counter;
      m->sample_actions(obs, noise, steps, true, nullptr, &rtc);
      return counter.count();
    };
    m->sample_actions(obs, noise, 1, true, nullptr, &rtc);  // the simplified weights and each schedule made first
    m->sample_actions(obs, noise, 2, true, nullptr, &rtc);
    const OpCount one = ops(1), two = ops(2);
    const OpCount step_ops{two.all - one.all, two.top - one.top};
    const OpCount prefix_ops{one.all - step_ops.all, one.top - step_ops.top};
    m->set_cuda_graph(graph == "on");
    std::vector<double> prefix, step, total;
    for (int i = 0; i < a.warmup + a.iters; ++i) {
      model::SampleTiming t;
      m->sample_actions(obs, noise, 10, true, &t, &rtc);
      if (i < a.warmup) continue;
      prefix.push_back(t.prefix_ms);
      step.push_back((t.total_ms() - t.prefix_ms) / static_cast<double>(t.step_ms.size()));
      total.push_back(t.total_ms());
    }
    std::string profile_summary;
    if (!a.profile.empty()) {  // after the timed calls, so their figures are the profiler's overhead free
      ProfilerOptions po;
      po.dir = a.profile + "/cams" + std::to_string(cams) + "_b" + std::to_string(batch) + "_fused-" + fused +
               "_graph-" + graph + "_rtc-" + rtc_mode;
      po.steps = a.profile_calls;
      po.wait_steps = 0;
      po.step_name = phase::kSample;
      Profiler profiler(po);
      for (int i = 0; i < a.profile_calls; ++i) {
        profiler.begin_step();
        m->sample_actions(obs, noise, 10, true, nullptr, &rtc);
        profiler.end_step();
      }
      profile_summary = "\n### " + po.dir + "\n\n" + phase_summary(profiler.report()->format()) + "\n";
    }
    const double chunks_per_s = 1000.0 * static_cast<double>(batch) / median(total);
    std::printf("| %lld | %lld | %s | %s | %s | %.2f | %.2f | %.2f | %.1f | %lld / %lld | %lld / %lld |\n",
                static_cast<long long>(cams), static_cast<long long>(batch), fused.c_str(), graph.c_str(),
                rtc_mode.c_str(), median(prefix), median(step), median(total), chunks_per_s,
                static_cast<long long>(prefix_ops.top), static_cast<long long>(prefix_ops.all),
                static_cast<long long>(step_ops.top), static_cast<long long>(step_ops.all));
    profile_summaries += profile_summary;
    std::fflush(stdout);
    rows.push_back({{"cameras", cams}, {"batch", batch}, {"fused", fused == "on"}, {"cuda_graph", graph == "on"},
                    {"rtc", rtc_mode}, {"rtc_delay", rtc_mode == "off" ? 0 : rtc_delay},
                    {"prefix_ms", median(prefix)}, {"step_ms", median(step)}, {"total_ms", median(total)},
                    {"chunks_per_s", chunks_per_s}, {"prefix_ops_top", prefix_ops.top}, {"prefix_ops_all", prefix_ops.all},
                    {"step_ops_top", step_ops.top}, {"step_ops_all", step_ops.all}});
  }
  if (!profile_summaries.empty()) {
    std::cout << "\nProfiles (--profile " << a.profile << ", " << a.profile_calls
              << " calls of 10 steps per row; the whole table in each folder's profile.txt)\n"
              << profile_summaries;
  }
  if (!a.json.empty()) {
    std::ofstream(a.json) << nlohmann::json{{"config", a.config}, {"device", a.device}, {"dtype", a.dtype},
                                            {"rows", rows}}.dump(2)
                          << "\n";
  }
  return 0;
}

int main(int argc, char** argv) {
  app::use_passive_openmp_wait(argv);  // as pi0-train: the CPU rows measure what it runs
  return app::run_app("bench_infer", [&] { return bench_main(argc, argv); });
}
