// pi0-train: fine-tune pi0 / pi0.5 from a YAML config.
//   pi0-train --config run.yaml [--set section.key=value ...] [--resume] [--print-params [--json]]
// Data parallel: launch one process per GPU (or CPU rank) with torchrun --no-python or SLURM srun; the rank, world
// size and rendezvous come from the environment (see docs/distributed.md).
// Exit codes: 0 done (or stopped by SIGINT/SIGTERM after saving), 2 bad input, 3 training diverged, 1 internal,
// 4 distributed failure (a peer rank died or hung, rendezvous failed).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "pi0/common/check.h"
#include "pi0/common/logging.h"
#include "pi0/common/threads.h"
#include "pi0/config/config.h"
#include "pi0/dist/dist_env.h"
#include "pi0/dist/process_group.h"
#include "pi0/train/freeze.h"
#include "pi0/train/trainer.h"

namespace {

const char* kUsage =
    "usage: pi0-train --config run.yaml [--set section.key=value ...] [--resume] [--print-params [--json]]\n"
    "       pi0-train --config-reference        (every config key with its default, as markdown)\n";

struct Args {
  std::string config;
  std::vector<std::string> overrides;
  bool resume = false, print_params = false, json = false, reference = false;
};

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const std::string& flag) -> std::string {
      if (i + 1 >= argc) throw pi0::UserError(flag + " needs a value\n" + kUsage);
      return argv[++i];
    };
    if (arg == "--config") a.config = value(arg);
    else if (arg == "--set") a.overrides.push_back(value(arg));
    else if (arg.rfind("--set=", 0) == 0) a.overrides.push_back(arg.substr(6));
    else if (arg == "--resume") a.resume = true;
    else if (arg == "--print-params") a.print_params = true;
    else if (arg == "--json") a.json = true;
    else if (arg == "--config-reference") a.reference = true;
    else if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else {
      throw pi0::UserError("unknown argument '" + arg + "'\n" + kUsage);
    }
  }
  if (a.config.empty() && !a.reference) throw pi0::UserError(std::string("--config is required\n") + kUsage);
  if (a.json && !a.print_params) throw pi0::UserError("--json only goes with --print-params");
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto args = parse_args(argc, argv);
    if (args.reference) {
      std::cout << "| key | default | meaning |\n|---|---|---|\n";
      for (const auto& [key, def, doc] : pi0::config::config_reference())
        std::cout << "| `" << key << "` | `" << def << "` | " << doc << " |\n";
      return 0;
    }
    auto cfg = pi0::config::load_config(args.config, args.overrides);
    if (args.print_params) {
      const auto env = pi0::dist::dist_env_from_environment();
      const auto plan = pi0::train::plan_memory(cfg, env.world_size);
      const auto& b = plan.params;
      // A model built from scratch draws its random initialization in float32 before converting what is stored
      // narrower: that transient is the start-up peak. Weights from a file are created in their storage dtype.
      const bool from_file = !cfg.checkpoint.init_weights.empty() || args.resume;
      const int64_t startup_peak = from_file ? 0 : b.total.total * 4;  // before the optimizer state exists
      const int64_t peak = std::max(startup_peak, plan.peak_bytes());
      if (args.json) {
        auto j = pi0::train::breakdown_json(b);
        j["startup_peak_bytes"] = std::max(startup_peak, b.total.memory_bytes() - b.total.grad_bytes);
        j["micro_batch"] = plan.micro_batch;
        j["activation_bytes"] = plan.activations.saved;
        j["activation_transient_bytes"] = plan.activations.transient;
        j["peak_bytes"] = peak;
        std::cout << j.dump(2) << "\n";
      } else {
        auto gib = [](int64_t n) { return static_cast<double>(n) / (1ull << 30); };
        std::cout << pi0::train::format_breakdown(b);
        std::printf("activations (micro-batch %lld, %lld cameras, %s, gradient checkpointing %s): %.2f GiB kept "
                    "for backward + %.2f GiB transient\n",
                    static_cast<long long>(plan.micro_batch), static_cast<long long>(plan.num_cameras),
                    cfg.train.precision.c_str(), cfg.train.gradient_checkpointing ? "on" : "off",
                    gib(plan.activations.saved), gib(plan.activations.transient));
        std::printf("predicted training peak: %.2f GiB (+ the process runtime: libraries, data loader)\n",
                    gib(plan.peak_bytes()));
        if (startup_peak > plan.peak_bytes()) {
          std::printf("start-up peak: %.2f GiB (random initialization in float32; set checkpoint.init_weights to "
                      "build directly in the storage dtypes)\n",
                      gib(startup_peak));
        }
      }
      return 0;
    }
    pi0::train::RunOptions run;
    run.resume = args.resume;
    const auto env = pi0::dist::dist_env_from_environment();
    run.rank = env.rank;
    run.world_size = env.world_size;
    pi0::set_log_rank(static_cast<int>(run.rank));
    if (env.distributed()) {
      if (cfg.train.device == "cuda") cfg.train.device = "cuda:" + std::to_string(env.local_rank);  // one GPU per rank
      spdlog::info("rank {} of {} (local rank {}, launcher {}), device {}, rendezvous {}:{}", env.rank,
                   env.world_size, env.local_rank, env.launcher, cfg.train.device, env.master_addr, env.master_port);
      run.process_group = std::make_shared<pi0::dist::ProcessGroup>(env, torch::Device(cfg.train.device),
                                                                    std::chrono::seconds(cfg.dist.timeout_s));
    }
    spdlog::info("resolved config ({}):\n{}", args.config, YAML::Dump(pi0::config::to_yaml(cfg)));
    spdlog::info("{} (train.num_threads {})", pi0::set_num_threads(static_cast<int>(cfg.train.num_threads)).describe(),
                 cfg.train.num_threads);
    pi0::train::Trainer trainer(cfg, run);
    trainer.run();
    return 0;
  } catch (const pi0::UserError& e) {
    std::cerr << "pi0-train: error: " << e.what() << "\n";
    return 2;
  } catch (const pi0::dist::DistError& e) {
    std::cerr << "pi0-train: distributed failure: " << e.what() << "\n";
    return 4;
  } catch (const pi0::train::TrainingError& e) {
    std::cerr << "pi0-train: training stopped: " << e.what() << "\n";
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "pi0-train: internal error: " << e.what() << "\n";
    return 1;
  }
}
