// Translates the `model:` config section into Pi0Options (the only place that knows both): variant names looked up,
// explicit dimensions taken as they are (GemmaOptions and SiglipOptions extend the config's GemmaDims and SiglipDims,
// config/model_dims.h, so there is no field list to copy), the rest checked for joint attention.
#pragma once
#include "pi0/config/config.h"
#include "pi0/model/pi0.h"

namespace pi0::model {

/// Pi0Options for a config section; throws pi0::UserError naming model.* keys on inconsistent values.
Pi0Options options_from_config(const config::ModelConfig& m);

}  // namespace pi0::model
