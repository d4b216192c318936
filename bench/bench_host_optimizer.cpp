// bench_host_optimizer: how fast the host (CPU) runs the trainer's AdamW step and EMA update over float32 master
// weights, per thread — the figure a host-resident optimizer (issue 33, train.offload) must reach to hide behind
// the GPU's forward and backward. Measures this build's AdamW in both of its host forms (train/optimizer.h: the
// one-pass update the trainer uses, at::_fused_adamw_ on LibTorch >= 2.4 or host_adamw_step's loop on 1.13; and the
// op sequence, foreach ops where LibTorch has them) and Ema (train/ema.h) on synthetic parameters split
// into tensors of Gemma-like sizes, at each thread count asked for, and projects the time of a pi0 full fine-tune's
// update (3.3e9 parameters) on a 16-core host assuming per-thread throughput holds (an upper bound on scaling: the
// update is memory-bound, ~42 bytes per parameter; see ../shared/docs/memory-and-speed-anchors.md).
//   bench_host_optimizer [--params-m 64] [--tensor-m 4] [--threads 1,2] [--steps 5] [--json out.json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pi0/app/cli.h"
#include "pi0/common/check.h"
#include "pi0/common/threads.h"
#include "pi0/train/ema.h"
#include "pi0/train/optimizer.h"

using namespace pi0;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  int64_t params_m = 64;  ///< millions of trainable float32 parameters
  int64_t tensor_m = 4;   ///< millions of elements per tensor (Gemma 2B's MLP matrices: 2048 × 16384 ≈ 33.5 M)
  std::string threads = "1,2";
  int steps = 5;
  std::string json;
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

}  // namespace

int main(int argc, char** argv) {
  return pi0::app::run_app("bench_host_optimizer", [&] {
    const auto args = parse_args(argc, argv);
    return args ? run(*args) : 0;
  });
}
