// The data section of a config as the data layer's options: the one mapping from config keys to DatasetOptions and
// TransformOptions, used by training (train/data_setup.h), pi0-norm-stats, the inference bundle and the benches.
#pragma once
#include "pi0/config/config.h"
#include "pi0/data/dataset.h"
#include "pi0/data/norm_stats.h"
#include "pi0/data/transforms.h"

namespace pi0::data {

/// Dataset options of the config (action horizon from the model section).
DatasetOptions dataset_options(const config::Config& cfg);
/// Transform options of the config (model type, dims and the data section's choices).
TransformOptions transform_options(const config::Config& cfg);
/// Norm stats named by data.norm_stats (UserError naming the key when unset or unreadable).
NormStats load_config_norm_stats(const config::Config& cfg);

}  // namespace pi0::data
