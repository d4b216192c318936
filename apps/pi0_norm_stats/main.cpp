// pi0-norm-stats: computes openpi-format norm_stats.json from a dataset's state and action arrays (no images read).
//   pi0-norm-stats --config run.yaml [--set section.key=value ...] [--out norm_stats.json]
//   pi0-norm-stats --format libero --data '/data/libero_goal/*_demo.hdf5' --out norm_stats.json
//                  [--action-horizon 50] [--state-keys ee_states,gripper_states] [--action-key actions]
//                  [--delta-mask 6,-1] [--bins 5000]
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "pi0/common/check.h"
#include "pi0/config/config.h"
#include "pi0/train/data_setup.h"
#include "pi0/data/dataset.h"
#include "pi0/data/norm_stats.h"

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) if (!item.empty()) out.push_back(item);
  return out;
}

/// openpi's make_bool_mask: "6,-1" -> 6×true, 1×false.
std::vector<bool> bool_mask(const std::string& s) {
  std::vector<bool> out;
  for (const auto& part : split(s)) {
    const int n = std::stoi(part);
    for (int i = 0; i < std::abs(n); ++i) out.push_back(n > 0);
  }
  return out;
}

const char* kUsage =
    "usage: pi0-norm-stats --config run.yaml [--set section.key=value ...] [--out norm_stats.json]\n"
    "       pi0-norm-stats --format libero|aloha|lerobot --data <file|dir|glob|lerobot root>[,...] --out norm_stats.json\n"
    "                      [--action-horizon H] [--state-keys a,b] [--action-key k] [--delta-mask 6,-1] [--bins N]\n"
    "                      [--adapt-to-pi auto|true|false]   (ALOHA convention conversion; auto = on for aloha)\n";

}  // namespace

int main(int argc, char** argv) {
  try {
    pi0::data::DatasetOptions opt;
    pi0::data::NormStatsOptions stats_opt;
    std::string out, config_path;
    std::vector<std::string> overrides;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw pi0::UserError(a + ": missing value");
        return argv[++i];
      };
      if (a == "--config") config_path = value();
      else if (a == "--set") overrides.push_back(value());
      else if (a == "--format") opt.format = value();
      else if (a == "--data") opt.paths = split(value());
      else if (a == "--out") out = value();
      else if (a == "--action-horizon") opt.action_horizon = std::stoll(value());
      else if (a == "--state-keys") opt.state_keys = split(value());
      else if (a == "--action-key") opt.action_key = value();
      else if (a == "--delta-mask") stats_opt.delta_action_mask = bool_mask(value());
      else if (a == "--bins") stats_opt.num_bins = std::stoll(value());
      else if (a == "--adapt-to-pi") opt.adapt_to_pi = value();
      else if (a == "-h" || a == "--help") { std::cout << kUsage; return 0; }
      else throw pi0::UserError("unknown flag " + a + "\n" + kUsage);
    }
    if (!config_path.empty()) {
      // The dataset, horizon and delta mask of a training config; the output goes to its data.norm_stats.
      const auto cfg = pi0::config::load_config(config_path, overrides);
      opt = pi0::train::dataset_options(cfg);
      stats_opt.delta_action_mask = cfg.data.delta_action_mask;
      if (out.empty()) out = cfg.data.norm_stats;
      if (out.empty()) throw pi0::UserError(config_path + ": data.norm_stats is not set and no --out was given");
    }
    if (opt.paths.empty() || out.empty()) throw pi0::UserError(std::string("--data and --out are required\n") + kUsage);
    opt.prompt = opt.prompt.empty() && opt.format == "aloha" ? "unused" : opt.prompt;  // stats never read prompts
    pi0::data::RobotDataset dataset(opt);
    pi0::data::NormStats stats = pi0::data::compute_norm_stats(dataset, stats_opt);
    pi0::data::save_norm_stats(stats, out);
    spdlog::info("wrote {} (state dim {}, action dim {}, {} frames)", out, dataset.state_dim(), dataset.action_dim(),
                 dataset.size());
    return 0;
  } catch (const pi0::UserError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "internal error: " << e.what() << "\n";
    return 1;
  }
}
