// The data section of a config as the data layer's options: the one mapping from config keys to DatasetOptions and
// TransformOptions, used by training (train/data_setup.h), pi0-norm-stats, the inference bundle and the benches.
#pragma once
#include "pi0/config/config.h"
#include "pi0/data/dataset.h"
#include "pi0/data/norm_stats.h"
#include "pi0/data/transforms.h"

namespace pi0::data {

/// Dataset options of the config's data.dataset (action horizon from the model section); `key` names the section in
/// messages (an entry of a mixture: "data.datasets[1]", with cfg = config::for_dataset(...)).
DatasetOptions dataset_options(const config::Config& cfg, const std::string& key = "data.dataset");
/// Transform options of the config (model type, dims and the data section's choices).
TransformOptions transform_options(const config::Config& cfg);
/// The key that names dataset i's norm stats (config::dataset_entries) in messages: its own
/// data.datasets[i].norm_stats when the entry sets one, or when a mixture has no data.norm_stats to fall back to;
/// data.norm_stats otherwise.
std::string norm_stats_key(const config::Config& cfg, size_t i);
/// Norm stats named by data.norm_stats (UserError naming `key` when unset or unreadable).
NormStats load_config_norm_stats(const config::Config& cfg, const std::string& key = "data.norm_stats");

}  // namespace pi0::data
