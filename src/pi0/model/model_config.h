// Translates the `model:` config section into Pi0Options (the only place that knows both).
#pragma once
#include "pi0/config/config.h"
#include "pi0/model/pi0.h"

namespace pi0::model {

/// Pi0Options for a config section; throws pi0::UserError naming model.* keys on inconsistent values.
Pi0Options options_from_config(const config::ModelConfig& m);

}  // namespace pi0::model
