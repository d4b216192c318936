#include "pi0/train/step_census.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "pi0/common/profiler.h"
#include "pi0/nn/checkpoint.h"
#include "pi0/nn/dense.h"

namespace pi0::train {

int64_t StepCensus::kernels_in(const std::string& phase) const {
  int64_t n = 0;
  for (const auto& [key, count] : kernels)
    if (phase.empty() || key.first == phase) n += count;
  return n;
}

int64_t StepCensus::kernels_named(const std::string& name, const std::string& phase) const {
  int64_t n = 0;
  for (const auto& [key, count] : kernels)
    if (key.second == name && (phase.empty() || key.first == phase)) n += count;
  return n;
}

nlohmann::json StepCensus::to_json() const {
  nlohmann::json by_phase = nlohmann::json::object();
  for (const auto& [phase, n] : kernels_per_phase(kernels)) {
    nlohmann::json names = nlohmann::json::object();
    for (const auto& [name, m] : kernels_per_name(kernels, phase)) names[name] = m;
    by_phase[phase.empty() ? "(outside)" : phase] = {{"kernels", n}, {"by_name", names}};
  }
  return {{"ops_all", ops.all},
          {"ops_top", ops.top},
          {"kernels", ops.kernels},
          {"recomputations", recomputations},
          {"phases", by_phase},
          {"float32_trainable_bytes", float32_trainable_bytes},
          {"float32_frozen_bytes", float32_frozen_bytes},
          {"other_trainable_bytes", other_trainable_bytes},
          {"other_frozen_bytes", other_frozen_bytes},
          {"cast_cache_bytes", cast_cache_bytes},
          {"grad_bytes", grad_bytes},
          {"frozen_grad_bytes", frozen_grad_bytes}};
}

std::string StepCensus::format(int64_t top) const {
  auto mib = [](int64_t b) { return static_cast<double>(b) / (1 << 20); };
  char buf[512];
  std::string out;
  std::snprintf(buf, sizeof buf, "operations per step (forward + backward): %lld kernels, %lld top, %lld all; %lld "
                "layers recomputed\n", static_cast<long long>(ops.kernels), static_cast<long long>(ops.top),
                static_cast<long long>(ops.all), static_cast<long long>(recomputations));
  out += buf;
  for (const auto& [phase, n] : kernels_per_phase(kernels)) {
    std::snprintf(buf, sizeof buf, "  %-16s %lld kernels\n", phase.empty() ? "(outside)" : phase.c_str(),
                  static_cast<long long>(n));
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "held: float32 weights %.2f MiB trainable + %.2f MiB frozen, other weights %.2f + "
                "%.2f MiB, cast copies %.2f MiB, gradients %.2f MiB (%.2f MiB on frozen weights)\n",
                mib(float32_trainable_bytes), mib(float32_frozen_bytes), mib(other_trainable_bytes),
                mib(other_frozen_bytes), mib(cast_cache_bytes), mib(grad_bytes), mib(frozen_grad_bytes));
  out += buf;
  std::vector<std::pair<int64_t, std::string>> names;
  for (const auto& [name, n] : kernels_per_name(kernels)) names.emplace_back(n, name);
  std::sort(names.rbegin(), names.rend());
  out += "  most frequent kernels (forward / backward / recompute):";
  for (size_t i = 0; i < names.size() && static_cast<int64_t>(i) < top; ++i) {
    const auto& name = names[i].second;
    std::snprintf(buf, sizeof buf, "%s %s %lld/%lld/%lld", i == 0 ? "" : ",", name.c_str(),
                  static_cast<long long>(kernels_named(name, phase::kForward)),
                  static_cast<long long>(kernels_named(name, phase::kBackward)),
                  static_cast<long long>(kernels_named(name, phase::kRecompute)));
    out += buf;
  }
  return out + "\n";
}

StepCensus census_training_step(model::Pi0Impl& model, const model::Batch& batch, const torch::Tensor& noise,
                                const torch::Tensor& time) {
  StepCensus c;
  const int64_t recomputed_before = nn::checkpoint_recomputations();
  {
    OpCounter counter(/*tally=*/true);
    ProfileScope forward(phase::kForward);
    const auto loss = model.compute_loss(batch.observation, batch.actions, noise, time).mean();
    forward.end();
    ProfileScope backward(phase::kBackward);
    // The engine directly: Tensor::backward() is itself an ATen operation (aten::_backward), which would make every
    // operation of backward a nested one, uncounted as a kernel.
    torch::autograd::backward({loss});
    backward.end();
    c.ops = counter.count();
    c.kernels = counter.tally();
  }
  c.recomputations = nn::checkpoint_recomputations() - recomputed_before;
  c.cast_cache_bytes = nn::cast_cache_bytes(model);
  for (auto& p : model.parameters()) {
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    const bool f32 = p.scalar_type() == torch::kFloat32;
    (p.requires_grad() ? (f32 ? c.float32_trainable_bytes : c.other_trainable_bytes)
                       : (f32 ? c.float32_frozen_bytes : c.other_frozen_bytes)) += bytes;
    if (p.grad().defined()) {
      const int64_t g = p.grad().numel() * static_cast<int64_t>(p.grad().element_size());
      c.grad_bytes += g;
      if (!p.requires_grad()) c.frozen_grad_bytes += g;
      p.mutable_grad() = torch::Tensor();
    }
  }
  nn::clear_cast_cache(model);
  return c;
}

}  // namespace pi0::train
