// pi0-norm-stats: computes openpi-format norm_stats.json from a dataset's state and action arrays (no images read).
//   pi0-norm-stats --config run.yaml [--set section.key=value ...] [--out norm_stats.json]
//   pi0-norm-stats --format libero --data '/data/libero_goal/*_demo.hdf5' --out norm_stats.json
//                  [--action-horizon 50] [--state-keys ee_states,gripper_states] [--action-key actions]
//                  [--delta-mask 6,-1] [--bins 5000]
// Flags and exit codes: pi0-norm-stats --help.
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "pi0/app/cli.h"
#include "pi0/common/check.h"
#include "pi0/config/config.h"
#include "pi0/data/config_options.h"
#include "pi0/data/dataset.h"
#include "pi0/data/norm_stats.h"

namespace {

/// openpi's make_bool_mask: "6,-1" -> 6×true, 1×false.
std::vector<bool> bool_mask(const std::string& s) {
  std::vector<bool> out;
  std::stringstream ss(s);
  for (std::string part; std::getline(ss, part, ',');) {
    size_t used = 0;
    int n = 0;
    try {
      n = std::stoi(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != part.size() || n == 0)
      throw pi0::UserError("--delta-mask: got '" + s + "', expected non-zero integers separated by commas (e.g. 6,-1)");
    for (int i = 0; i < std::abs(n); ++i) out.push_back(n > 0);
  }
  return out;
}

// Stats of one dataset written to `out`.
void write_stats(pi0::data::DatasetOptions opt, const pi0::data::NormStatsOptions& stats_opt, const std::string& out) {
  opt.prompt = opt.prompt.empty() && opt.format == "aloha" ? "unused" : opt.prompt;  // stats never read prompts
  pi0::data::RobotDataset dataset(opt);
  pi0::data::NormStats stats = pi0::data::compute_norm_stats(dataset, stats_opt);
  pi0::data::save_norm_stats(stats, out);
  spdlog::info("wrote {} (state dim {}, action dim {}, {} frames)", out, dataset.state_dim(), dataset.action_dim(),
               dataset.size());
}

int norm_stats_main(int argc, char** argv) {
  pi0::data::DatasetOptions opt;
  pi0::data::NormStatsOptions stats_opt;
  std::string out, config_path, delta_mask;
  std::vector<std::string> overrides;
  auto cli = pi0::app::make_parser(
      "pi0-norm-stats", "Computes openpi-format norm_stats.json from a dataset's state and actions (no images read).");
  cli->add_option("--config", config_path,
                  "a training config: its dataset, horizon and delta mask; writes its data.norm_stats unless --out")
      ->check(pi0::app::non_empty());
  pi0::app::add_config_overrides(*cli, overrides);
  cli->add_option("--format", opt.format, "dataset layout")->check(pi0::app::one_of({"libero", "aloha", "lerobot"}));
  cli->add_option("--data", opt.paths, "HDF5 files, directories or globs, or LeRobot dataset roots, comma-separated")
      ->delimiter(',')
      ->check(pi0::app::non_empty());
  cli->add_option("--out", out, "norm_stats.json to write")->check(pi0::app::non_empty());
  cli->add_option("--action-horizon", opt.action_horizon, "actions per chunk H")->check(pi0::app::int_in(1));
  cli->add_option("--state-keys", opt.state_keys, "dataset keys concatenated into the state, comma-separated")
      ->delimiter(',')
      ->check(pi0::app::non_empty());
  cli->add_option("--action-key", opt.action_key, "dataset key of the actions")->check(pi0::app::non_empty());
  cli->add_option("--delta-mask", delta_mask, "openpi's make_bool_mask, e.g. 6,-1 = 6 delta dims then 1 absolute")
      ->check(pi0::app::non_empty());
  cli->add_option("--bins", stats_opt.num_bins, "histogram bins per dimension for q01/q99")->check(pi0::app::int_in(2));
  cli->add_option("--adapt-to-pi", opt.adapt_to_pi, "ALOHA convention conversion (auto = on for aloha)")
      ->check(pi0::app::one_of({"auto", "true", "false"}));
  if (auto done = pi0::app::parse(*cli, argc, argv)) return *done;
  if (!delta_mask.empty()) stats_opt.delta_action_mask = bool_mask(delta_mask);
  if (!overrides.empty() && config_path.empty()) throw pi0::UserError("--set needs --config (see --help)");
  if (!config_path.empty()) {
    // The datasets, horizon and delta mask of a training config; each dataset's stats go to its own norm_stats
    // (data.norm_stats for a single dataset).
    const auto cfg = pi0::config::load_config(config_path, overrides);
    const auto entries = pi0::config::dataset_entries(cfg);
    if (entries.size() > 1 && !out.empty())
      throw pi0::UserError("--out: " + config_path + " lists " + std::to_string(entries.size()) +
                           " datasets, each written to its own data.datasets[i].norm_stats; drop --out");
    std::map<std::string, std::string> written;  // path -> the entry's key
    for (size_t i = 0; i < entries.size(); ++i) {
      const auto one = pi0::config::for_dataset(cfg, i);
      const std::string key = pi0::config::dataset_key(cfg, i);
      const std::string path = out.empty() ? one.data.norm_stats : out;
      if (path.empty()) {
        throw pi0::UserError(config_path + ": " + pi0::data::norm_stats_key(cfg, i) + " is not set and no --out was given");
      }
      if (written.count(path)) {
        throw pi0::UserError(config_path + ": " + key + " and " + written[path] + " both write their norm stats to '" +
                             path + "'; give each dataset its own norm_stats");
      }
      written[path] = key;
      // Each entry's stats over its own deltas (its data.datasets[i].delta_action_mask, else data.delta_action_mask).
      stats_opt.delta_action_mask = one.data.delta_action_mask;
      write_stats(pi0::data::dataset_options(one, key), stats_opt, path);
    }
    return 0;
  }
  if (opt.paths.empty() || out.empty()) throw pi0::UserError("--data and --out are required, or --config (see --help)");
  write_stats(opt, stats_opt, out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return pi0::app::run_app("pi0-norm-stats", [&] { return norm_stats_main(argc, argv); });
}
