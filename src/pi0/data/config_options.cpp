#include "pi0/data/config_options.h"

#include <filesystem>

#include "pi0/common/check.h"
#include "pi0/common/files.h"
#include "pi0/common/fs.h"

namespace pi0::data {

DatasetOptions dataset_options(const config::Config& cfg, const std::string& key) {
  const auto& d = cfg.data.dataset;
  if (d.paths.empty()) throw UserError(key + ".paths is empty: name the HDF5 files or globs to train on");
  DatasetOptions o;
  static_cast<config::DatasetConfig&>(o) = d;  // the section is DatasetOptions' own first part
  o.action_horizon = cfg.model.action_horizon;
  o.config_key = key;
  if (cfg.train.subtask.enabled) o.subtask_key = cfg.train.subtask.key;
  return o;
}

TransformOptions transform_options(const config::Config& cfg) {
  TransformOptions t;
  t.model_type = cfg.model.type;
  t.action_dim = cfg.model.action_dim;
  t.image_size = cfg.model.image_size;
  t.max_token_len = cfg.model.max_token_len;
  t.discrete_state_input = cfg.data.discrete_state_input;
  t.delta_action_mask = cfg.data.delta_action_mask;
  return t;
}

std::string norm_stats_key(const config::Config& cfg, size_t i) {
  const auto& entries = cfg.data.datasets;
  if (entries.empty()) return "data.norm_stats";
  const bool own = !entries.at(i).norm_stats.empty();
  return own || cfg.data.norm_stats.empty() ? config::dataset_key(cfg, i) + ".norm_stats" : "data.norm_stats";
}

NormStats load_config_norm_stats(const config::Config& cfg, const std::string& key) {
  if (cfg.data.norm_stats.empty()) {
    throw UserError(key + " is not set: compute it with pi0-norm-stats --config <run.yaml> and set the path");
  }
  if (!pi0::posix_fs::exists(cfg.data.norm_stats)) {
    throw UserError(key + ": file '" + cfg.data.norm_stats +
                    "' does not exist (compute it with pi0-norm-stats --config <run.yaml>)" +
                    relative_path_note(cfg.data.norm_stats));
  }
  require_input_file(cfg.data.norm_stats, key, "a norm_stats.json file");
  return load_norm_stats(cfg.data.norm_stats);
}

}  // namespace pi0::data
