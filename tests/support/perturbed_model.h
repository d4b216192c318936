// A tiny model whose every component matters, for tests that compare sampling paths.
#pragma once
#include <torch/torch.h>

#include "pi0/model/pi0.h"

namespace pi0::testing {

/// A model for `o` whose every parameter is moved off its initialization by N(0, 0.05²) (zero-initialized pieces —
/// the SigLIP head, adaRMS gates — would hide whole branches from the actions).
inline model::Pi0 perturbed_model(const model::Pi0Options& o) {
  model::Pi0 model(o);
  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.05);
  return model;
}

}  // namespace pi0::testing
