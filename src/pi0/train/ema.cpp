#include "pi0/train/ema.h"

#include <numeric>
#include <sstream>

#include "pi0/common/check.h"
#include "pi0/train/host_update.h"

namespace pi0::train {

Ema::Ema(NamedTensors params, double decay) : params_(std::move(params)), decay_(decay) {
  PI0_CHECK(decay >= 0.0 && decay < 1.0, "Ema: decay must be in [0, 1), got ", decay);
  torch::NoGradGuard no_grad;
  for (const auto& [name, p] : params_) averages_.push_back(p.detach().to(torch::kFloat32, /*non_blocking=*/false,
                                                                         /*copy=*/true));
}

void Ema::update() {
  std::vector<size_t> all(params_.size());
  std::iota(all.begin(), all.end(), size_t{0});
  update(all);
}

void Ema::update(const std::vector<size_t>& indices) {
  torch::NoGradGuard no_grad;
  for (const size_t i : indices) PI0_CHECK(i < params_.size(), "Ema::update: index ", i, " of ", params_.size());
  // float32 parameters in host memory: host_update's pass (ema·d + p·(1 − d)), which train.offload's fused host
  // update also runs, so the offloaded and the plain EMA are the same bits.
  std::vector<HostUpdateTensor> host;
  std::vector<size_t> rest;
  for (const size_t i : indices) {
    const auto p = params_[i].second.detach();
    if (p.device().is_cpu() && p.scalar_type() == torch::kFloat32 && p.is_contiguous())
      host.push_back({p, {}, {}, {}, averages_[i], {}});
    else
      rest.push_back(i);
  }
  if (!host.empty()) {
    HostUpdateScalars s;
    s.ema_decay = decay_;
    host_update(host, s, host_pool());
  }
  update_other(rest);
}

void Ema::update_other(const std::vector<size_t>& indices) {
  if (indices.empty()) return;
#if PI0_HAVE_FOREACH
  // Multi-tensor form of the loop below (same operations, bit-identical on CPU) for float32 parameters.
  std::vector<torch::Tensor> avgs, ps;
  bool all_f32 = true;
  for (const size_t i : indices) {
    all_f32 = all_f32 && params_[i].second.scalar_type() == torch::kFloat32;
    avgs.push_back(averages_[i]);
    ps.push_back(params_[i].second.detach());
  }
  if (all_f32) {
    for_each_group({&avgs, &ps}, [&](const std::vector<std::vector<torch::Tensor>>& l) {
      at::_foreach_mul_(l[0], decay_);
      at::_foreach_add_(l[0], l[1], 1.0 - decay_);
    });
    return;
  }
#endif
  for (const size_t i : indices) {
    auto p = params_[i].second.detach().to(torch::kFloat32);
    averages_[i].mul_(decay_).add_(p, 1.0 - decay_);
  }
}

std::map<std::string, torch::Tensor> Ema::state_dict() const {
  std::map<std::string, torch::Tensor> state;
  for (size_t i = 0; i < params_.size(); ++i) state[params_[i].first] = averages_[i];
  return state;
}

void Ema::load_state_dict(const std::map<std::string, torch::Tensor>& state, const std::string& source) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& name = params_[i].first;
    auto it = state.find(name);
    if (it == state.end()) throw UserError(source + ": missing key '" + name + "'");
    if (it->second.sizes() != averages_[i].sizes()) {
      std::ostringstream os;
      os << source << ": key '" << name << "' has shape " << it->second.sizes() << ", expected "
         << averages_[i].sizes();
      throw UserError(os.str());
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) averages_[i].copy_(state.at(params_[i].first));
}

void Ema::copy_to(std::map<std::string, torch::Tensor>& weights) const {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto it = weights.find(params_[i].first);
    if (it != weights.end()) it->second.copy_(averages_[i]);
  }
}

void Ema::copy_to(torch::nn::Module& model) const {
  std::map<std::string, torch::Tensor> weights;
  for (const auto& item : model.named_parameters()) weights[item.key()] = item.value();
  for (const auto& [name, p] : params_)
    PI0_CHECK(weights.count(name), "Ema::copy_to: the model has no parameter '", name, "'");
  copy_to(weights);
}

ScopedEmaWeights::ScopedEmaWeights(const Ema& ema, torch::nn::Module& model) : model_(model) {
  torch::NoGradGuard no_grad;
  auto params = model.named_parameters();
  for (const auto& [name, avg] : ema.state_dict()) {
    auto* p = params.find(name);
    PI0_CHECK(p != nullptr, "ScopedEmaWeights: the model has no parameter '", name, "'");
    backup_[name] = p->detach().clone();
  }
  ema.copy_to(model);
}

ScopedEmaWeights::~ScopedEmaWeights() {
  torch::NoGradGuard no_grad;
  auto params = model_.named_parameters();
  for (const auto& [name, saved] : backup_) params[name].copy_(saved);
}

}  // namespace pi0::train
