#include "pi0/infer/inference.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "pi0/data/aloha.h"
#include "pi0/data/transforms.h"

namespace pi0::infer {

InferenceInputs make_inputs(const io::Bundle& bundle, const std::map<std::string, torch::Tensor>& tensors,
                            const std::string& source, const std::optional<std::string>& prompt,
                            const data::Tokenizer* tokenizer) {
  data::ObservationFormat format;
  format.transform = bundle.transform;
  format.norm_stats = &bundle.norm_stats;
  format.adapt_to_pi = bundle.config.data.dataset.adapt_to_pi_enabled();
  format.vocab_size = bundle.config.model.vocab_size;
  return data::read_observation(tensors, format, source, prompt, tokenizer);
}

torch::Tensor robot_actions(const io::Bundle& bundle, const torch::Tensor& actions_BHA,
                            const torch::Tensor& raw_state_BS) {
  const auto& t = bundle.transform;
  const auto mode = t.norm_mode();
  torch::Tensor a = actions_BHA.to(torch::kCPU, torch::kFloat32);
  if (mode != data::NormMode::kNone) {
    const auto& stats = bundle.norm_stats.at("actions");
    const int64_t d = std::min<int64_t>(a.size(-1), static_cast<int64_t>(stats.mean.size()));
    a = data::unnormalize(a.narrow(-1, 0, d), stats, mode);
  }
  if (!t.delta_action_mask.empty()) {
    std::vector<torch::Tensor> per;
    for (int64_t b = 0; b < a.size(0); ++b)
      per.push_back(data::absolute_actions(a[b], raw_state_BS[b].to(torch::kFloat32), t.delta_action_mask));
    a = torch::stack(per);
  }
  if (bundle.config.data.dataset.adapt_to_pi_enabled()) a = data::aloha_actions_from_pi(a, "the model's actions");
  return a.contiguous();
}

torch::Device model_device(const io::Bundle& bundle) {
  for (const auto& p : bundle.model->parameters()) return p.device();
  return torch::kCPU;
}

Prediction predict(io::Bundle& bundle, const InferenceInputs& inputs, const std::optional<torch::Tensor>& noise,
                   int64_t num_steps, model::SampleTiming* timing) {
  const torch::Device device = model_device(bundle);
  std::optional<torch::Tensor> noise_on_device;
  if (noise) noise_on_device = noise->to(device);
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  Prediction out;
  out.actions = bundle.model->sample_actions(inputs.observation.to(device), noise_on_device, num_steps,
                                             /*use_kv_cache=*/true, timing);
  out.actions = out.actions.to(torch::kCPU, torch::kFloat32).contiguous();
  out.model_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  out.robot_actions = robot_actions(bundle, out.actions, inputs.raw_state);
  return out;
}

}  // namespace pi0::infer
