// bench_model: how close the pi0 training step and sampler get to the machine's float32 GEMM rate.
//   bench_model [--config configs/bench_cpu.yaml] [--iters N] [--json out.json] [--threads T]
//               [--cameras C] [--sample-iters N] [--skip-bf16] [--profile]
// Measures: the GEMM rate (torch::matmul, 1024³ and the model's own projection shapes, best of several runs);
// the analytic FLOPs of one training step (model/flops.h); forward+backward time of compute_loss for the dummy
// model and the configured model (float32, gradient checkpointing, bfloat16 compute); and sampling latency
// (10 Euler steps, batch 1) with and without the prefix KV cache. Step times are medians of N timed iterations
// after warm-up; the best iteration is reported too, because the CPU may be shared with compiles.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pi0/app/cli.h"
#include "pi0/common/check.h"
#include "pi0/common/threads.h"
#include "pi0/config/config.h"
#include "pi0/model/flops.h"
#include "pi0/model/model_config.h"
#include "pi0/model/pi0.h"
#include "pi0/nn/attention_mask.h"

using namespace pi0;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string config = "configs/bench_cpu.yaml";
  int iters = 10;         ///< timed training iterations per case (after 2 warm-up iterations)
  int sample_iters = 5;   ///< timed sample_actions calls per case
  std::string json;       ///< write the results here as JSON when set
  int threads = 0;        ///< ATen, OpenMP and OpenBLAS threads; 0 = ATen's default, which the other two follow
  int64_t cameras = 1;    ///< images per sample
  bool bf16 = true;
  bool profile = false;   ///< time SigLIP and the joint Gemma pass separately
};

// Flags through the shared command-line layer (--help lists them); std::nullopt when --help/--version answered.
std::optional<Args> parse_args(int argc, char** argv) {
  Args a;
  auto cli = app::make_parser("bench_model", "How close the training step and the sampler get to the machine's "
                                             "float32 GEMM rate.");
  cli->add_option("--config", a.config, "model and batch config (random weights)")->check(app::non_empty());
  cli->add_option("--iters", a.iters, "timed training iterations per case (after 2 warm-up)")->check(app::int_in(1));
  cli->add_option("--sample-iters", a.sample_iters, "timed sample_actions calls per case")->check(app::int_in(1));
  cli->add_option("--json", a.json, "also write the results as JSON here")->check(app::non_empty());
  cli->add_option("--threads", a.threads, "ATen, OpenMP and OpenBLAS threads (0: ATen's default)")
      ->check(app::int_in(0));
  cli->add_option("--cameras", a.cameras, "images per sample")->check(app::int_in(1));
  cli->add_flag_callback("--skip-bf16", [&] { a.bf16 = false; }, "leave out the bfloat16 compute case");
  cli->add_flag("--profile", a.profile, "time SigLIP and the joint Gemma pass separately");
  if (app::parse(*cli, argc, argv)) return std::nullopt;
  return a;
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Timing {
  double median_ms = 0, best_ms = 0;
  int n = 0;
};

/// `warmup` untimed calls, then `iters` timed calls of fn.
Timing time_it(const std::function<void()>& fn, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    fn();
    ms.push_back(ms_since(t0));
  }
  std::sort(ms.begin(), ms.end());
  Timing t;
  t.n = iters;
  t.best_ms = ms.front();
  t.median_ms = ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
  return t;
}

struct Gemm {
  std::string name;
  int64_t m, k, n;
  double gflops = 0;  ///< best of the runs
};

/// Best GFLOP/s of [m,k]·[k,n] float32 over 7 runs of ≥ ~0.1 s each.
double gemm_gflops(int64_t m, int64_t k, int64_t n) {
  torch::NoGradGuard no_grad;
  auto a = torch::randn({m, k}), b = torch::randn({k, n});
  auto c = torch::matmul(a, b);
  const double flops = 2.0 * m * k * n;
  const auto t0 = Clock::now();
  torch::matmul_out(c, a, b);
  const double one_ms = std::max(ms_since(t0), 1e-3);
  const int reps = std::max(1, static_cast<int>(100.0 / one_ms));
  double best = 0;
  for (int run = 0; run < 7; ++run) {
    const auto t1 = Clock::now();
    for (int r = 0; r < reps; ++r) torch::matmul_out(c, a, b);
    best = std::max(best, flops * reps / (ms_since(t1) * 1e6));
  }
  return best;
}

model::Observation make_observation(const model::Pi0Options& o, int64_t batch, int64_t cameras) {
  model::Observation obs;
  const int64_t s = o.siglip.image_size;
  for (int64_t c = 0; c < cameras; ++c) {
    obs.images.push_back(torch::rand({batch, 3, s, s}) * 2 - 1);
    obs.image_masks.push_back(torch::ones({batch}, torch::kBool));
  }
  obs.state = torch::randn({batch, o.action_dim});
  obs.tokenized_prompt = torch::randint(1, o.paligemma.vocab_size, {batch, o.max_token_len}, torch::kLong);
  obs.tokenized_prompt_mask = torch::ones({batch, o.max_token_len}, torch::kBool);
  // A realistic prompt is shorter than max_token_len; the padded tail still costs compute (masked, not dropped).
  const int64_t pad = o.max_token_len / 4;
  obs.tokenized_prompt.narrow(1, o.max_token_len - pad, pad).zero_();
  obs.tokenized_prompt_mask.narrow(1, o.max_token_len - pad, pad).fill_(false);
  return obs;
}

struct Row {
  std::string name;
  int64_t batch = 0;
  Timing t;
  double flops = 0;        ///< per call (0 = not counted)
  double gemm_gflops = 0;  ///< reference rate for the ratio
  std::string note;
  double gflops() const { return flops > 0 ? flops / (t.median_ms * 1e6) : 0; }
  double ratio() const { return flops > 0 && gemm_gflops > 0 ? gflops() / gemm_gflops : 0; }
  double best_ratio() const { return flops > 0 && gemm_gflops > 0 ? flops / (t.best_ms * 1e6) / gemm_gflops : 0; }
};

/// Median fwd+bwd time of compute_loss(...).mean() with fixed noise and time; grads reset (to None) untimed.
Timing time_training(model::Pi0& m, const model::Pi0Options& o, int64_t batch, int64_t cameras, int iters) {
  auto obs = make_observation(o, batch, cameras);
  auto actions = torch::randn({batch, o.action_horizon, o.action_dim});
  auto noise = torch::randn_like(actions);
  auto time = torch::rand({batch}) * 0.999 + 0.001;
  std::vector<double> ms;
  auto step = [&] {
    m->zero_grad(/*set_to_none=*/true);
    m->compute_loss(obs, actions, noise, time).mean().backward();
  };
  for (int i = 0; i < 2; ++i) step();
  for (int i = 0; i < iters; ++i) {
    m->zero_grad(true);
    const auto t0 = Clock::now();
    m->compute_loss(obs, actions, noise, time).mean().backward();
    ms.push_back(ms_since(t0));
  }
  std::sort(ms.begin(), ms.end());
  Timing t;
  t.n = iters;
  t.best_ms = ms.front();
  t.median_ms = ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
  return t;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

int run(const Args& args) {
  const auto threads = pi0::set_num_threads(args.threads);  // ATen, OpenMP and the BLAS alike
  torch::manual_seed(0);
  const auto cfg = config::load_config(args.config);
  const auto opts = model::options_from_config(cfg.model);
  const int64_t batch = cfg.train.batch_size, cams = args.cameras;
  const auto dummy = model::dummy_options(opts.pi05);

  std::cout << "# bench_model\n\nconfig " << args.config << " (" << (opts.pi05 ? "pi05" : "pi0") << ", prefix width "
            << opts.paligemma.width << ", expert width " << opts.action_expert.width << ", depth "
            << opts.paligemma.depth << ", SigLIP width " << opts.siglip.width << " depth " << opts.siglip.depth
            << ", batch " << batch << ", cameras " << cams << ")\n" << threads.describe() << "\n";
  const auto info = at::get_parallel_info() + at::show_config();
  // show_config() is one long comma-separated line: print only the entries that decide GEMM speed.
  for (const std::string key : {"ATen parallel backend", "BLAS_INFO", "USE_MKLDNN", "CPU capability usage"}) {
    auto pos = info.find(key);
    if (pos != std::string::npos) std::cout << "  " << info.substr(pos, info.find_first_of(",\n", pos) - pos) << "\n";
  }

  // --- GEMM rate ---------------------------------------------------------------------------------------
  const auto& p = opts.paligemma;
  const auto& e = opts.action_expert;
  const int64_t tp = cams * opts.siglip.num_patches() + opts.max_token_len;
  const int64_t ts = opts.action_horizon + (opts.pi05 ? 0 : 1);
  std::vector<Gemm> gemms = {
      {"square 1024", 1024, 1024, 1024},
      {"prefix mlp up", batch * tp, p.width, p.mlp_dim},
      {"prefix mlp down", batch * tp, p.mlp_dim, p.width},
      {"prefix q_proj", batch * tp, p.width, p.num_heads * p.head_dim},
      {"siglip fc1", batch * cams * opts.siglip.num_patches(), opts.siglip.width, opts.siglip.mlp_dim},
      {"suffix mlp up", batch * ts, e.width, e.mlp_dim},
  };
  for (auto& g : gemms) g.gflops = gemm_gflops(g.m, g.k, g.n);
  const double gemm_rate = gemms[0].gflops;  // the reference: square 1024³
  std::cout << "\n## float32 GEMM (torch::matmul, best of 7 runs)\n\n| shape | M×K×N | GFLOP/s |\n|---|---|---|\n";
  for (const auto& g : gemms)
    std::cout << "| " << g.name << " | " << g.m << "×" << g.k << "×" << g.n << " | " << fmt("%.1f", g.gflops) << " |\n";

  // --- FLOP counts --------------------------------------------------------------------------------------
  const auto fwd = model::forward_flops(opts, batch, cams);
  const double train_flops = static_cast<double>(model::training_step_flops(opts, batch, cams));
  const double dummy_flops = static_cast<double>(model::training_step_flops(dummy, batch, cams));
  const double sample_cache = static_cast<double>(model::sampling_flops(opts, 1, cams, 10, true));
  const double sample_full = static_cast<double>(model::sampling_flops(opts, 1, cams, 10, false));
  std::cout << "\n## FLOPs (config model, batch " << batch << ")\n\n| part | forward GFLOP |\n|---|---|\n";
  const std::pair<const char*, int64_t> parts[] = {{"SigLIP", fwd.vision},           {"projector", fwd.projector},
                                                   {"prefix linear", fwd.prefix_linear}, {"suffix linear", fwd.suffix_linear},
                                                   {"joint attention", fwd.attention}, {"action io", fwd.action_io}};
  for (const auto& [name, f] : parts) std::cout << "| " << name << " | " << fmt("%.3f", f / 1e9) << " |\n";
  std::cout << "| **forward total** | " << fmt("%.3f", fwd.total() / 1e9) << " |\n| training step (3×) | "
            << fmt("%.3f", train_flops / 1e9) << " |\n| sampling, 10 steps, batch 1, KV cache | "
            << fmt("%.3f", sample_cache / 1e9) << " |\n| sampling, 10 steps, batch 1, recompute | "
            << fmt("%.3f", sample_full / 1e9) << " |\n";
  std::cout.flush();

  // --- Training step ------------------------------------------------------------------------------------
  std::vector<Row> rows;
  // The CPU may be shared (compiles): the reference rate is re-measured right before each case, so that a
  // case's ratio compares two measurements taken under the same load.
  auto local_gemm = [] { return gemm_gflops(1024, 1024, 1024); };
  auto add = [&](Row r) {
    std::cerr << "  " << r.name << ": " << fmt("%.1f", r.t.median_ms) << " ms\n";
    rows.push_back(std::move(r));
  };
  {
    model::Pi0 m(dummy);
    add({"train dummy fp32", batch, time_training(m, dummy, batch, cams, args.iters), dummy_flops, local_gemm(), ""});
  }
  model::Pi0 m(opts);
  add({"train fp32", batch, time_training(m, opts, batch, cams, args.iters), train_flops, local_gemm(), ""});
  m->set_gradient_checkpointing(true);
  add({"train fp32 + checkpointing", batch, time_training(m, opts, batch, cams, args.iters), train_flops, local_gemm(),
       "FLOPs counted without the recomputation"});
  m->set_gradient_checkpointing(false);
  if (args.bf16) {
    m->set_compute_dtype(torch::kBFloat16);
    add({"train bf16 compute", batch, time_training(m, opts, batch, cams, std::min(args.iters, 5)), train_flops,
         local_gemm(), "ratio against the fp32 GEMM rate"});
    m->set_compute_dtype(torch::kFloat32);
  }

  // --- Sampling -----------------------------------------------------------------------------------------
  {
    auto obs = make_observation(opts, 1, cams);
    auto noise = torch::randn({1, opts.action_horizon, opts.action_dim});
    for (bool cache : {true, false}) {
      auto t = time_it([&] { m->sample_actions(obs, noise, 10, cache); }, 1, args.sample_iters);
      add({cache ? "sample 10 steps, KV cache" : "sample 10 steps, recompute", 1, t, cache ? sample_cache : sample_full,
           local_gemm(), ""});
    }
  }

  // --- Component profile (optional) ---------------------------------------------------------------------
  if (args.profile) {
    auto obs = make_observation(opts, batch, cams);
    auto images = obs.images.size() == 1 ? obs.images[0] : torch::cat(obs.images, 0);
    auto& pwe = *m->paligemma_with_expert;
    auto vis = time_it(
        [&] {
          m->zero_grad(true);
          pwe.vision->forward(images, torch::kFloat32, 0).sum().backward();
        },
        1, args.iters);
    add({"profile: SigLIP fwd+bwd", batch, vis, 3.0 * fwd.vision, local_gemm(), ""});
    auto prefix = m->embed_prefix(obs);
    auto x_t = torch::randn({batch, opts.action_horizon, opts.action_dim});
    auto time = torch::rand({batch}) * 0.999 + 0.001;
    auto pre_embs = prefix.embs.detach().requires_grad_(true);
    auto gem = time_it(
        [&] {
          m->zero_grad(true);
          auto suffix = m->embed_suffix(obs.state, x_t, time);
          auto pad = torch::cat({prefix.pad_mask, suffix.pad_mask}, 1);
          auto ar = torch::cat({prefix.ar_mask, suffix.ar_mask}, 0);
          auto out = pwe.forward(pre_embs, suffix.embs, nn::make_attn_mask(pad, ar), nn::positions_from_mask(pad),
                                 suffix.cond, nullptr, nullptr, 0);
          (out.prefix.sum() + out.suffix.sum()).backward();
        },
        1, args.iters);
    add({"profile: joint Gemma fwd+bwd", batch, gem,
         3.0 * (fwd.prefix_linear + fwd.suffix_linear + fwd.attention + fwd.action_io), local_gemm(), ""});
  }

  std::cout << "\n## Timings (median of N after warm-up; GEMM = 1024³ rate re-measured before each case)\n\n"
            << "| case | batch | N | median ms | best ms | samples/s | GFLOP/s | GEMM GFLOP/s | % of GEMM | % (best) | note |\n"
            << "|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : rows) {
    std::cout << "| " << r.name << " | " << r.batch << " | " << r.t.n << " | " << fmt("%.1f", r.t.median_ms) << " | "
              << fmt("%.1f", r.t.best_ms) << " | " << fmt("%.2f", r.batch * 1000.0 / r.t.median_ms) << " | "
              << fmt("%.1f", r.gflops()) << " | " << fmt("%.1f", r.gemm_gflops) << " | " << fmt("%.1f", 100.0 * r.ratio())
              << " | " << fmt("%.1f", 100.0 * r.best_ratio()) << " | " << r.note << " |\n";
  }
  auto find = [&](const std::string& name) -> const Row* {
    for (const auto& r : rows)
      if (r.name == name) return &r;
    return nullptr;
  };
  const Row* fp32 = find("train fp32");
  const Row* ckpt = find("train fp32 + checkpointing");
  const Row* bf16 = find("train bf16 compute");
  const Row* sc = find("sample 10 steps, KV cache");
  const Row* sf = find("sample 10 steps, recompute");
  const double ckpt_ratio = ckpt->t.median_ms / fp32->t.median_ms;
  const double speedup = sf->t.median_ms / sc->t.median_ms;
  std::cout << "\n## Summary\n\n| metric | value | target |\n|---|---|---|\n"
            << "| training step / GEMM rate | " << fmt("%.1f", 100 * fp32->ratio()) << " % | ≥ 40 % |\n"
            << "| checkpointing step time ratio | " << fmt("%.2f", ckpt_ratio) << "× | ≈ 1.33× (one extra forward) |\n";
  if (bf16) std::cout << "| bf16 / fp32 step time | " << fmt("%.2f", bf16->t.median_ms / fp32->t.median_ms) << "× | report |\n";
  std::cout << "| training step / GEMM rate, best iteration | " << fmt("%.1f", 100 * fp32->best_ratio()) << " % | ≥ 40 % |\n";
  std::cout << "| KV-cache sampling speedup | " << fmt("%.2f", speedup) << "× | ≥ 3× |\n";

  if (!args.json.empty()) {
    nlohmann::json j;
    j["config"] = args.config;
    j["threads"] = at::get_num_threads();
    j["openmp_threads"] = threads.openmp;
    j["blas_threads"] = threads.blas;
    j["batch"] = batch;
    j["cameras"] = cams;
    for (const auto& g : gemms) j["gemm"].push_back({{"name", g.name}, {"m", g.m}, {"k", g.k}, {"n", g.n}, {"gflops", g.gflops}});
    j["gemm_reference_gflops"] = gemm_rate;
    j["flops"] = {{"forward", fwd.total()},        {"vision", fwd.vision},
                  {"projector", fwd.projector},    {"prefix_linear", fwd.prefix_linear},
                  {"suffix_linear", fwd.suffix_linear}, {"attention", fwd.attention},
                  {"action_io", fwd.action_io},    {"training_step", train_flops},
                  {"sampling_kv_cache", sample_cache}, {"sampling_recompute", sample_full}};
    for (const auto& r : rows)
      j["cases"].push_back({{"name", r.name}, {"batch", r.batch}, {"iters", r.t.n}, {"median_ms", r.t.median_ms},
                            {"best_ms", r.t.best_ms}, {"samples_per_s", r.batch * 1000.0 / r.t.median_ms},
                            {"gflops", r.gflops()}, {"gemm_gflops", r.gemm_gflops},
                            {"ratio_to_gemm", r.ratio()}, {"best_ratio_to_gemm", r.best_ratio()}, {"note", r.note}});
    j["summary"] = {{"train_ratio_to_gemm", fp32->ratio()}, {"checkpointing_time_ratio", ckpt_ratio},
                    {"kv_cache_speedup", speedup}};
    if (bf16) j["summary"]["bf16_time_ratio"] = bf16->t.median_ms / fp32->t.median_ms;
    std::ofstream(args.json) << j.dump(2) << "\n";
    std::cout << "\nwrote " << args.json << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return app::run_app("bench_model", [&] {
    const auto args = parse_args(argc, argv);
    return args ? run(*args) : 0;
  });
}
