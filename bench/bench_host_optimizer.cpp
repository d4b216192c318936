// bench_host_optimizer: how fast the host (CPU) runs the trainer's AdamW step and EMA update over float32 master
// weights, per thread — the figure a host-resident optimizer (issue 33, train.offload) must reach to hide behind
// the GPU's forward and backward. Measures this build's AdamW in both of its host forms (train/optimizer.h: the
// one-pass update the trainer uses, at::_fused_adamw_ on LibTorch >= 2.4 or host_adamw_step's loop on 1.13; and the
// op sequence, foreach ops where LibTorch has them) and Ema (train/ema.h) on synthetic parameters split
// into tensors of Gemma-like sizes, at each thread count asked for, and projects the time of a pi0 full fine-tune's
// update (3.3e9 parameters) on a 16-core host assuming per-thread throughput holds (an upper bound on scaling: the
// update is memory-bound, ~42 bytes per parameter; see ../shared/docs/memory-and-speed-anchors.md).
//   bench_host_optimizer [--params-m 64] [--tensor-m 4] [--threads 1,2] [--steps 5] [--json out.json]
//
// --pi0-step replays the host side of one offloaded step (train.offload=optimizer) on a model's real parameter
// shapes (--config, default configs/pi0_libero.yaml; --scale k keeps every k-th layer and 1/k of the embedding so it
// fits this machine), stage by stage, twice: as the trainer ran it before issue 44 (bf16 gradients converted into a
// float32 accumulation, norms through float64 temporaries, a separate clip pass, AdamW, the EMA and the bf16 staging
// as three passes on ATen's threads) and as it runs now (train/host_update.h: the norm read from the bf16 gradients
// in one pass, then one fused pass per layer group on the host pool). Per stage: seconds scaled to the full model,
// bytes per parameter, GB/s and share of the machine's copy bandwidth measured in the same run, page faults per
// parameter; then the predicted step for given forward/backward times (H200, pi0, every layer recomputed: 0.35 /
// 1.05 s), here and projected to a host of --target-cores cores and --target-gbps of memory bandwidth.
//   bench_host_optimizer --pi0-step [--config C] [--scale 8] [--threads 2] [--steps 3] [--forward-s 0.35]
//                        [--backward-s 1.05] [--target-cores 16] [--target-gbps 100] [--json out.json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <sys/resource.h>

#include <cstring>
#include <map>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pi0/app/cli.h"
#include "pi0/common/check.h"
#include "pi0/common/threads.h"
#include "pi0/config/config.h"
#include "pi0/train/ema.h"
#include "pi0/train/host_update.h"
#include "pi0/train/memory_plan.h"
#include "pi0/train/offload.h"
#include "pi0/train/optimizer.h"
#include "pi0/train/placement.h"

using namespace pi0;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  int64_t params_m = 64;  ///< millions of trainable float32 parameters
  int64_t tensor_m = 4;   ///< millions of elements per tensor (Gemma 2B's MLP matrices: 2048 × 16384 ≈ 33.5 M)
  std::string threads = "1,2";
  int steps = 5;
  std::string json;
  // --pi0-step
  bool pi0_step = false;
  std::string config = "configs/pi0_libero.yaml";
  int64_t scale = 0;  ///< 0: the smallest that fits a third of the available memory
  double forward_s = 0.35, backward_s = 1.05;
  int64_t target_cores = 16;
  double target_gbps = 100;
};

std::optional<Args> parse_args(int argc, char** argv) {
  Args a;
  auto cli = app::make_parser("bench_host_optimizer",
                              "Host AdamW + EMA throughput over float32 master weights, per thread (issue 33).");
  cli->add_option("--params-m", a.params_m, "millions of float32 parameters to update")->check(app::int_in(1, 4096));
  cli->add_option("--tensor-m", a.tensor_m, "millions of elements per tensor")->check(app::int_in(1, 1024));
  cli->add_option("--threads", a.threads, "thread counts to measure, comma-separated")->check(app::non_empty());
  cli->add_option("--steps", a.steps, "timed updates per thread count (after one untimed)")->check(app::int_in(1));
  cli->add_option("--json", a.json, "also write the rows as JSON here")->check(app::non_empty());
  cli->add_flag("--pi0-step", a.pi0_step, "replay the host side of one offloaded step on a model's real shapes");
  cli->add_option("--config", a.config, "--pi0-step: the config whose model and precision are replayed")
      ->check(app::non_empty());
  cli->add_option("--scale", a.scale, "--pi0-step: keep every k-th layer and 1/k of the embedding (0: fit memory)")
      ->check(app::int_in(0, 64));
  cli->add_option("--forward-s", a.forward_s, "--pi0-step: the device's forward time for the prediction");
  cli->add_option("--backward-s", a.backward_s, "--pi0-step: the device's backward time (recomputation included)");
  cli->add_option("--target-cores", a.target_cores, "--pi0-step: cores of the host to project to")
      ->check(app::int_in(1, 1024));
  cli->add_option("--target-gbps", a.target_gbps, "--pi0-step: memory bandwidth (copy, GB/s) of that host");
  if (app::parse(*cli, argc, argv)) return std::nullopt;
  return a;
}

std::vector<int> thread_counts(const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const int n = std::stoi(item, &used);
      if (used != item.size() || n < 1) throw std::invalid_argument(item);
      out.push_back(n);
    } catch (const std::exception&) {
      throw UserError("--threads: got '" + text + "', expected positive integers separated by commas (e.g. 1,2)");
    }
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run(const Args& args) {
  const int64_t total = args.params_m * 1000000, per_tensor = std::min(total, args.tensor_m * 1000000);
  train::NamedTensors params;
  std::vector<torch::Tensor> grads;
  torch::manual_seed(0);
  for (int64_t done = 0, i = 0; done < total; done += per_tensor, ++i) {
    const int64_t n = std::min(per_tensor, total - done);
    params.emplace_back("p" + std::to_string(i), torch::randn({n}) * 0.02);
    grads.push_back(torch::randn({n}) * 1e-3);
  }
  train::AdamWOptions ao;
  ao.beta1 = 0.9, ao.beta2 = 0.95, ao.eps = 1e-8, ao.weight_decay = 1e-10;  // openpi's defaults
  train::AdamW adamw(params, ao);
  auto ops_options = ao;
  ops_options.fused_host = false;
  train::AdamW adamw_ops(params, ops_options);
  train::Ema ema(params, 0.99);
  std::printf("%lld float32 parameters in %zu tensors; %s\n\n", static_cast<long long>(total), params.size(),
              set_num_threads(1).describe().c_str());
  std::printf("%7s %12s %12s %12s %12s %16s %18s %22s\n", "threads", "adamw s", "op-seq s", "ema s", "total s",
              "params/s", "params/s/thread", "pi0 (3.3e9) on 16 cores");
  nlohmann::json rows = nlohmann::json::array();
  for (const int t : thread_counts(args.threads)) {
    set_num_threads(t);
    train::set_host_pool_threads(t);  // the one-pass AdamW and the EMA run on the host pool
    std::vector<double> adamw_s, ops_s, ema_s;
    for (int s = 0; s <= args.steps; ++s) {
      auto t0 = Clock::now();
      adamw.step(2.5e-5, grads);
      const double a = std::chrono::duration<double>(Clock::now() - t0).count();
      t0 = Clock::now();
      adamw_ops.step(2.5e-5, grads);
      const double o = std::chrono::duration<double>(Clock::now() - t0).count();
      t0 = Clock::now();
      ema.update();
      const double e = std::chrono::duration<double>(Clock::now() - t0).count();
      if (s > 0) adamw_s.push_back(a), ops_s.push_back(o), ema_s.push_back(e);  // the first one warms the caches
    }
    const double a = median(adamw_s), o = median(ops_s), e = median(ema_s);
    const double rate = static_cast<double>(total) / (a + e);
    const double per_thread = rate / t, projected = 3.3e9 / (per_thread * 16);
    std::printf("%7d %12.4f %12.4f %12.4f %12.4f %16.3g %18.3g %21.2fs\n", t, a, o, e, a + e, rate, per_thread,
                projected);
    rows.push_back({{"threads", t},
                    {"adamw_s", a},
                    {"adamw_op_sequence_s", o},
                    {"ema_s", e},
                    {"params_per_s", rate},
                    {"params_per_s_per_thread", per_thread},
                    {"pi0_update_s_16_cores_linear", projected}});
  }
  std::printf("\nThe 16-core column assumes per-thread throughput holds; the update reads and writes ~42 B per "
              "parameter, so a socket's memory bandwidth (100-200 GB/s) caps it near 0.7-1.4 s for pi0.\n");
  if (!args.json.empty()) {
    std::ofstream out(args.json);
    if (!out) throw UserError("--json: cannot write '" + args.json + "'");
    out << nlohmann::json{{"params", total}, {"tensor_elements", per_tensor}, {"rows", rows}}.dump(2) << "\n";
  }
  return 0;
}


// ---- --pi0-step: the host side of one offloaded step, replayed ----

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

int64_t minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_minflt);
}

struct ReplayParam {
  std::string name;
  int64_t numel = 0;
  std::optional<std::pair<model::LayerStack, int64_t>> layer;  ///< its update group (train::update_layer_of)
  torch::ScalarType copy = torch::kBFloat16;  ///< the device copy's dtype: what the gradient arrives in
  torch::Tensor master, m, v, ema, grad, acc, staging;
};

// A stage's measurement: seconds at this scale, bytes per parameter by the model in the legend, faults.
struct Stage {
  Stage() = default;
  Stage(std::string n, std::string w, double b) : name(std::move(n)), where(std::move(w)), bytes_per_param(b) {}
  std::string name, where;
  double bytes_per_param = 0;
  std::vector<double> seconds;  // per step
  int64_t faults = 0;
  double median() const { return ::median(seconds); }
};

// The old norm (train/optimizer.cpp before issue 44): per 16 M-element chunk a fresh float64 copy, a fresh square,
// a sum — each temporary above glibc's mmap threshold, so its pages are faulted in every time.
double legacy_sum_of_squares(const torch::Tensor& g) {
  constexpr int64_t kChunk = int64_t{1} << 24;
  auto flat = g.reshape({-1});
  double total = 0;
  for (int64_t start = 0; start < flat.numel(); start += kChunk) {
    auto part = flat.narrow(0, start, std::min(kChunk, flat.numel() - start)).to(torch::kFloat64);
    total += part.mul(part).sum().item<double>();
  }
  return total;
}

// The old host AdamW: at::_fused_adamw_ on ATen's threads where LibTorch has it on the CPU (>= 2.4), else the
// one-pass loop (the same arithmetic host_update runs, here without the clip scale, EMA or output).
void legacy_adamw(const std::vector<torch::Tensor>& ps, const std::vector<torch::Tensor>& gs,
                  const std::vector<torch::Tensor>& ms, const std::vector<torch::Tensor>& vs, double lr, int64_t step,
                  const train::AdamWOptions& o, train::HostPool& pool) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  (void)pool;
  const auto step_tensor = torch::full({}, static_cast<double>(step), torch::kFloat32);
  const std::vector<torch::Tensor> steps(ps.size(), step_tensor);
  at::_fused_adamw_(ps, gs, ms, vs, {}, steps, lr, o.beta1, o.beta2, o.weight_decay, o.eps, false, false);
#else
  std::vector<train::HostUpdateTensor> ts;
  for (size_t i = 0; i < ps.size(); ++i) ts.push_back({ps[i], gs[i], ms[i], vs[i], {}, {}});
  train::HostUpdateScalars s;
  s.lr = lr, s.beta1 = o.beta1, s.beta2 = o.beta2, s.eps = o.eps, s.weight_decay = o.weight_decay, s.step = step;
  train::host_update(ts, s, pool);
#endif
}

template <class Fn>
void timed(Stage& st, Fn fn) {
  const int64_t f0 = minor_faults();
  const double t0 = now_s();
  fn();
  st.seconds.push_back(now_s() - t0);
  st.faults += minor_faults() - f0;
}

// Copy, triad and first-touch bandwidth of this machine at `threads` threads (on the pool: the same threads the
// fused stages use), in GB/s. Copy counts the bytes read and written, as STREAM does.
struct Ceilings {
  double copy = 0, triad = 0, first_touch = 0;
  double first_touch_faults_per_mb = 0;
};

Ceilings measure_ceilings(int threads, int64_t bytes) {
  train::HostPool pool(threads);
  const int64_t n = bytes / 4;
  auto a = torch::ones({n}), b = torch::ones({n}), c = torch::ones({n});
  float *pa = a.data_ptr<float>(), *pb = b.data_ptr<float>(), *pc = c.data_ptr<float>();
  const int64_t block = int64_t{1} << 18, tasks = (n + block - 1) / block;
  auto best = [&](auto fn) {
    double t = 1e30;
    for (int r = 0; r < 3; ++r) {
      const double t0 = now_s();
      fn();
      t = std::min(t, now_s() - t0);
    }
    return t;
  };
  Ceilings c_;
  const double tc = best([&] {
    pool.run(tasks, [&](int64_t k) {
      const int64_t b0 = k * block, e = std::min(n, b0 + block);
      std::memcpy(pa + b0, pb + b0, static_cast<size_t>(e - b0) * 4);
    });
  });
  c_.copy = 2.0 * static_cast<double>(n) * 4 / tc / 1e9;
  const double tt = best([&] {
    pool.run(tasks, [&](int64_t k) {
      const int64_t b0 = k * block, e = std::min(n, b0 + block);
      for (int64_t i = b0; i < e; ++i) pa[i] = pb[i] + 0.5f * pc[i];
    });
  });
  c_.triad = 3.0 * static_cast<double>(n) * 4 / tt / 1e9;
  // Fresh pages: what every byte of a freshly mapped temporary costs before it holds anything.
  double tf = 1e30;
  int64_t faults = 0;
  for (int r = 0; r < 3; ++r) {
    auto* fresh = static_cast<char*>(std::malloc(static_cast<size_t>(bytes)));
    const int64_t f0 = minor_faults();
    const double t0 = now_s();
    const int64_t chunk = int64_t{1} << 20, chunks = (bytes + chunk - 1) / chunk;
    pool.run(chunks, [&](int64_t k) {
      std::memset(fresh + k * chunk, 1, static_cast<size_t>(std::min(chunk, bytes - k * chunk)));
    });
    tf = std::min(tf, now_s() - t0);
    faults = minor_faults() - f0;
    std::free(fresh);
  }
  c_.first_touch = static_cast<double>(bytes) / tf / 1e9;
  c_.first_touch_faults_per_mb = static_cast<double>(faults) / (static_cast<double>(bytes) / 1e6);
  return c_;
}

int run_pi0_step(const Args& args) {
  const auto cfg = config::load_config(args.config);
  const auto table = train::make_placement(cfg, /*offload=*/true);
  // Groups as train/offload.cpp forms them (the same rule): outside the layers, each SigLIP layer, each joint layer.
  using GroupKey = decltype(ReplayParam::layer);
  std::vector<ReplayParam> all;
  std::set<GroupKey> all_groups;
  int64_t full = 0;
  for (const auto& p : table.params) {
    if (!p.on_host()) continue;
    ReplayParam r;
    r.name = p.name, r.numel = p.numel, r.copy = p.device_copy, r.layer = train::update_layer_of(p.name);
    all_groups.insert(r.layer);
    full += p.numel;
    all.push_back(r);
  }
  // Bytes per kept parameter across both paths' buffers: master, m, v, EMA (4 each), gradient (2), float32
  // accumulation (4), staging (2).
  constexpr int64_t kBytesPerParam = 4 * 4 + 2 + 4 + 2;
  int64_t scale = args.scale;
  if (scale == 0) {
    const int64_t avail = train::host_available_bytes();
    scale = 1;
    while (avail > 0 && full / scale * kBytesPerParam > avail / 3) ++scale;
  }
  // Every scale-th layer (by its index) and 1/scale of each big tensor outside the layers (the embedding), so the
  // mix of tensor sizes stays the model's.
  std::vector<ReplayParam> kept;
  for (auto& r : all) {
    if (r.layer && r.layer->second % scale != 0) continue;
    if (!r.layer && r.numel > (int64_t{1} << 26)) r.numel /= scale;
    kept.push_back(r);
  }
  int64_t n_kept = 0;
  for (const auto& r : kept) n_kept += r.numel;
  const double factor = static_cast<double>(full) / static_cast<double>(n_kept);
  std::map<GroupKey, std::vector<size_t>> groups;  // in the update's order
  for (size_t i = 0; i < kept.size(); ++i) groups[kept[i].layer].push_back(i);
  std::printf("%s: %lld host-resident parameters in %zu tensors, %zu update groups; replayed at scale %lld: %lld "
              "parameters in %zu tensors (x%.2f to the full model)\n",
              args.config.c_str(), static_cast<long long>(full), all.size(), all_groups.size(),
              static_cast<long long>(scale), static_cast<long long>(n_kept), kept.size(), factor);
  torch::manual_seed(0);
  for (auto& r : kept) {
    r.master = torch::randn({r.numel}) * 0.02;
    r.m = torch::zeros({r.numel});
    r.v = torch::zeros({r.numel});
    r.ema = r.master.clone();
    r.grad = (torch::randn({r.numel}) * 1e-3).to(r.copy);  // the transfer buffer: the gradient as it arrived
    r.acc = torch::empty({r.numel});
    r.staging = torch::empty({r.numel}, torch::TensorOptions().dtype(r.copy));
  }
  const double coef = 0.5;  // clipping fires (a randomly initialized model's norm is far above 1.0)
  train::AdamWOptions ao;  // openpi's
  ao.weight_decay = 1e-10;
  const double lr = 2.5e-5, decay = 0.99;
  nlohmann::json rows = nlohmann::json::array();
  for (const int t : thread_counts(args.threads)) {
    set_num_threads(t);  // the old path's ATen team
    train::HostPool pool(t);
    const Ceilings ceil = measure_ceilings(t, int64_t{256} << 20);
    // The old path (train/offload.cpp, optimizer.cpp, ema.cpp at e7a8967), stage by stage as the trainer ran them.
    Stage accumulate{"accumulate bf16 -> f32", "host thread", 2 + 4};
    Stage norm_old{"norm (f64 temporaries)", "host thread", 4 + 8 + 8 + 8 + 8};
    Stage clip{"clip (separate pass)", "main thread", 4 + 4};
    Stage adamw{"AdamW", "host thread", 4 * 4 + 3 * 4};
    Stage ema_old{"EMA (mul_, add_)", "host thread", 4 + 4 + 4 + 4 + 4};
    Stage stage_copy{"bf16 staging copy", "host thread", 4 + 2};
    // The new path: the norm read from the arriving gradients, one fused pass per group.
    Stage norm_new{"norm from the bf16 gradient", "host pool", 2};
    Stage fused{"clip+AdamW+EMA+bf16 out, fused", "host pool", 18 + 18};
    for (int step = 0; step <= args.steps; ++step) {
      const bool record = step > 0;  // the first step faults in every buffer once
      Stage scratch[8];
      auto& acc = record ? accumulate : scratch[0];
      auto& no = record ? norm_old : scratch[1];
      auto& cl = record ? clip : scratch[2];
      auto& ad = record ? adamw : scratch[3];
      auto& eo = record ? ema_old : scratch[4];
      auto& sc = record ? stage_copy : scratch[5];
      auto& nn_ = record ? norm_new : scratch[6];
      auto& fu = record ? fused : scratch[7];
      torch::NoGradGuard no_grad;
      timed(acc, [&] {
        for (auto& r : kept) r.acc.copy_(r.grad);
      });
      double sum = 0;
      timed(no, [&] {
        for (auto& r : kept) sum += legacy_sum_of_squares(r.acc);
      });
      timed(cl, [&] {
        for (auto& r : kept) r.acc.mul_(coef);
      });
      for (const auto& [g, idx] : groups) {
        std::vector<torch::Tensor> ps, gs, ms, vs;
        for (const size_t i : idx) ps.push_back(kept[i].master), gs.push_back(kept[i].acc), ms.push_back(kept[i].m),
            vs.push_back(kept[i].v);
        timed(ad, [&] { legacy_adamw(ps, gs, ms, vs, lr, step + 1, ao, pool); });
        timed(eo, [&] {
          for (const size_t i : idx) kept[i].ema.mul_(decay).add_(kept[i].master, 1.0 - decay);
        });
        timed(sc, [&] {
          for (const size_t i : idx) kept[i].staging.copy_(kept[i].master);
        });
      }
      double sum_new = 0;
      timed(nn_, [&] {
        for (auto& r : kept) sum_new += train::host_sum_of_squares(r.grad, pool);
      });
      train::HostUpdateScalars hs;
      hs.lr = lr, hs.beta1 = ao.beta1, hs.beta2 = ao.beta2, hs.eps = ao.eps, hs.weight_decay = ao.weight_decay;
      hs.step = step + 1, hs.grad_scale = coef, hs.ema_decay = decay;
      for (const auto& [g, idx] : groups) {
        std::vector<train::HostUpdateTensor> ts;
        for (const size_t i : idx) {
          auto& r = kept[i];
          ts.push_back({r.master, r.grad, r.m, r.v, r.ema, r.grad});  // out: the transfer buffer the gradient came in
        }
        timed(fu, [&] { train::host_update(ts, hs, pool); });
      }
      PI0_CHECK(std::isfinite(sum) && std::isfinite(sum_new), "non-finite sums");
    }
    // Per-step totals: a group's stage is timed per group; the medians are of the step's sum.
    auto per_step = [&](Stage& st, size_t parts) {
      if (parts <= 1) return;
      std::vector<double> steps;
      for (size_t i = 0; i + parts <= st.seconds.size(); i += parts) {
        double s = 0;
        for (size_t j = 0; j < parts; ++j) s += st.seconds[i + j];
        steps.push_back(s);
      }
      st.seconds = steps;
    };
    for (Stage* st : {&adamw, &ema_old, &stage_copy, &fused}) per_step(*st, groups.size());
    std::printf("\n%d threads: copy %.1f GB/s, triad %.1f GB/s, first touch %.1f GB/s (%.0f faults per MB)\n", t,
                ceil.copy, ceil.triad, ceil.first_touch, ceil.first_touch_faults_per_mb);
    std::printf("%-34s %-12s %10s %8s %8s %9s %12s\n", "stage", "runs on", "full s", "B/param", "GB/s",
                "of copy", "faulted B/p");
    nlohmann::json stages = nlohmann::json::array();
    std::map<std::string, double> full_s;
    auto show = [&](const Stage& st, const std::string& path) {
      const double sec = st.median();
      const double gbps = st.bytes_per_param * static_cast<double>(n_kept) / sec / 1e9;
      const double faulted = static_cast<double>(st.faults) / args.steps * 4096.0 / static_cast<double>(n_kept);
      full_s[st.name] = sec * factor;
      std::printf("%-34s %-12s %10.3f %8.0f %8.1f %8.0f%% %12.1f\n", (path + st.name).c_str(), st.where.c_str(),
                  sec * factor, st.bytes_per_param, gbps, 100 * gbps / ceil.copy, faulted);
      stages.push_back({{"stage", path + st.name},
                        {"runs_on", st.where},
                        {"seconds_full_model", sec * factor},
                        {"bytes_per_param", st.bytes_per_param},
                        {"gb_per_s", gbps},
                        {"share_of_copy", gbps / ceil.copy},
                        {"faulted_bytes_per_param", faulted}});
      return std::make_pair(gbps / ceil.copy, st.bytes_per_param);
    };
    std::printf("before (e7a8967):\n");
    std::vector<std::pair<double, double>> old_share;
    for (const Stage* st : {&accumulate, &norm_old, &clip, &adamw, &ema_old, &stage_copy})
      old_share.push_back(show(*st, "old: "));
    std::printf("after (host_update.h):\n");
    const auto share_norm = show(norm_new, "new: "), share_fused = show(fused, "new: ");
    const double F = args.forward_s, B = args.backward_s;
    const double g_old = full_s[accumulate.name] + full_s[norm_old.name], t_old = full_s[clip.name];
    const double u_old = full_s[adamw.name] + full_s[ema_old.name] + full_s[stage_copy.name];
    const double g_new = full_s[norm_new.name], u_new = full_s[fused.name];
    // The forward of the next step waits for each layer's update (it is paced by it when the update is longer);
    // the backward by the gradients' host work; the clip pass sits between them.
    const double step_old = std::max(F, u_old) + std::max(B, g_old) + t_old;
    const double step_new = std::max(F, u_new) + std::max(B, g_new);
    std::printf("host traffic per parameter per step: before %.0f B (+ faults), after %.0f B\n",
                accumulate.bytes_per_param + norm_old.bytes_per_param + clip.bytes_per_param + adamw.bytes_per_param +
                    ema_old.bytes_per_param + stage_copy.bytes_per_param,
                norm_new.bytes_per_param + fused.bytes_per_param);
    std::printf("predicted step here (forward %.2f s, backward %.2f s): before %.2f s, after %.2f s\n", F, B,
                step_old, step_new);
    // Projected: each stage at the share of the target's copy bandwidth it reached here (memory-bound), or at this
    // machine's per-thread rate times the target's cores, whichever is slower.
    auto project = [&](double seconds_here, std::pair<double, double> share_bytes) {
      const double bytes = share_bytes.second * static_cast<double>(full);
      const double per_thread = bytes / seconds_here / t;  // B/s per thread here
      const double rate = std::min(per_thread * static_cast<double>(args.target_cores),
                                   std::min(1.0, share_bytes.first) * args.target_gbps * 1e9);
      return bytes / rate;
    };
    const double pg_old = project(full_s[accumulate.name], old_share[0]) + project(full_s[norm_old.name], old_share[1]);
    const double pt_old = project(full_s[clip.name], old_share[2]);
    const double pu_old = project(full_s[adamw.name], old_share[3]) + project(full_s[ema_old.name], old_share[4]) +
                          project(full_s[stage_copy.name], old_share[5]);
    const double pg_new = project(g_new, share_norm), pu_new = project(u_new, share_fused);
    const double proj_old = std::max(F, pu_old) + std::max(B, pg_old) + pt_old;
    const double proj_new = std::max(F, pu_new) + std::max(B, pg_new);
    std::printf("projected to %lld cores at %.0f GB/s: update %.2f -> %.2f s, gradients %.2f -> %.2f s, clip %.2f -> "
                "0 s; step before %.2f s, after %.2f s\n",
                static_cast<long long>(args.target_cores), args.target_gbps, pu_old, pu_new, pg_old, pg_new, pt_old,
                proj_old, proj_new);
    rows.push_back({{"threads", t},
                    {"copy_gb_per_s", ceil.copy},
                    {"triad_gb_per_s", ceil.triad},
                    {"first_touch_gb_per_s", ceil.first_touch},
                    {"stages", stages},
                    {"predicted_step_s", {{"before", step_old}, {"after", step_new}}},
                    {"projected_step_s", {{"before", proj_old}, {"after", proj_new}}}});
  }
  if (!args.json.empty()) {
    std::ofstream out(args.json);
    if (!out) throw UserError("--json: cannot write '" + args.json + "'");
    out << nlohmann::json{{"config", args.config},
                          {"params_full", full},
                          {"params_replayed", n_kept},
                          {"scale", scale},
                          {"forward_s", args.forward_s},
                          {"backward_s", args.backward_s},
                          {"target_cores", args.target_cores},
                          {"target_gb_per_s", args.target_gbps},
                          {"rows", rows}}
                .dump(2)
        << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return pi0::app::run_app("bench_host_optimizer", [&] {
    const auto args = parse_args(argc, argv);
    if (!args) return 0;
    return args->pi0_step ? run_pi0_step(*args) : run(*args);
  });
}
