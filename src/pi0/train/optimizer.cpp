#include "pi0/train/optimizer.h"

#include <cmath>
#include <numeric>
#include <set>
#include <sstream>

#include "pi0/common/check.h"
#include "pi0/common/shape_str.h"
#include "pi0/train/host_update.h"

namespace pi0::train {

void for_each_group(const std::vector<std::vector<torch::Tensor>*>& lists,
                    const std::function<void(const std::vector<std::vector<torch::Tensor>>&)>& fn,
                    int64_t max_elements) {
  PI0_CHECK(!lists.empty(), "for_each_group needs at least one list");
  const size_t n = lists[0]->size();
  for (const auto* l : lists) PI0_CHECK(l->size() == n, "for_each_group: lists differ in length");
  std::vector<std::vector<torch::Tensor>> group(lists.size());
  int64_t elements = 0;
  auto flush = [&] {
    if (!group[0].empty()) fn(group);
    for (auto& g : group) g.clear();
    elements = 0;
  };
  for (size_t i = 0; i < n; ++i) {
    const auto& first = (*lists[0])[i];
    // A group shares device and dtype (a foreach requirement) and stays under max_elements, which bounds the
    // temporaries a foreach op allocates (the Adam denominator: one float per element of the group).
    if (!group[0].empty() && (first.device() != group[0][0].device() ||
                              first.scalar_type() != group[0][0].scalar_type() ||
                              elements + first.numel() > max_elements))
      flush();
    for (size_t l = 0; l < lists.size(); ++l) group[l].push_back((*lists[l])[i]);
    elements += first.numel();
  }
  flush();
}

AdamW::AdamW(NamedTensors params, AdamWOptions options) : params_(std::move(params)), options_(options) {
  std::set<std::string> seen;
  torch::NoGradGuard no_grad;
  for (const auto& [name, p] : params_) {
    PI0_CHECK(p.defined(), "AdamW: parameter '", name, "' is undefined");
    PI0_CHECK(seen.insert(name).second, "AdamW: duplicate parameter name '", name, "'");
    exp_avg_.push_back(torch::zeros_like(p));
    exp_avg_sq_.push_back(torch::zeros_like(p));
  }
}

void AdamW::step(double lr) {
  std::vector<torch::Tensor> grads;
  for (const auto& [name, p] : params_) grads.push_back(p.grad());
  step(lr, grads);
}

void AdamW::step(double lr, const std::vector<torch::Tensor>& grads_in, double grad_scale) {
  begin_step();
  std::vector<size_t> all(params_.size());
  std::iota(all.begin(), all.end(), size_t{0});
  step_part(lr, grads_in, all, grad_scale);
}

void AdamW::begin_step() { ++step_; }

void AdamW::step_part(double lr, const std::vector<torch::Tensor>& grads_in, const std::vector<size_t>& indices,
                      double grad_scale) {
  PI0_CHECK(grads_in.size() == params_.size(), "AdamW::step: ", grads_in.size(), " gradients for ", params_.size(),
            " parameters");
  PI0_CHECK(step_ > 0, "AdamW::step_part before begin_step");
  torch::NoGradGuard no_grad;
  const double b1 = options_.beta1, b2 = options_.beta2;
  const double bias_correction1 = 1.0 - std::pow(b1, static_cast<double>(step_));
  const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(b2, static_cast<double>(step_)));
  const double step_size = lr / bias_correction1;
  // Host float32 parameters take the one-pass update; the rest (device parameters, pure-bf16 ones) the op sequence.
  std::vector<torch::Tensor> host_p, host_g, host_m, host_v, ps, gs, avgs, sqs;
  for (const size_t i : indices) {
    PI0_CHECK(i < params_.size(), "AdamW::step_part: index ", i, " of ", params_.size(), " parameters");
    const auto& p = params_[i].second;
    auto grad = grads_in[i];
    if (!grad.defined()) continue;
    // The host form reads a bf16 gradient as is (offloaded gradients arrive in the compute dtype).
    const bool host = options_.fused_host && host_adamw_takes(p, grad);
    if (!host && grad.scalar_type() != p.scalar_type()) grad = grad.to(p.scalar_type());
    (host ? host_p : ps).push_back(p), (host ? host_g : gs).push_back(grad);
    (host ? host_m : avgs).push_back(exp_avg_[i]), (host ? host_v : sqs).push_back(exp_avg_sq_[i]);
  }
  if (!host_p.empty()) host_adamw_step(host_p, host_g, host_m, host_v, lr, step_, options_, grad_scale);
  // The other gradients are scaled in place first (what clip_grad_norm_ does), with the op sequence's arithmetic.
  if (grad_scale != 1.0 && !gs.empty()) {
#if PI0_HAVE_FOREACH
    for_each_group({&gs}, [&](const std::vector<std::vector<torch::Tensor>>& l) { at::_foreach_mul_(l[0], grad_scale); });
#else
    for (auto& g : gs) g.mul_(grad_scale);
#endif
  }
#if PI0_HAVE_FOREACH
  if (options_.foreach) {
    // Multi-tensor form of the loop below: the same elementwise operations in the same order (bit-identical on
    // CPU), a few fused launches per group on CUDA instead of ~8 kernels per parameter.
    for_each_group({&ps, &gs, &avgs, &sqs}, [&](const std::vector<std::vector<torch::Tensor>>& l) {
      const auto &p = l[0], &g = l[1], &m = l[2], &v = l[3];
      at::_foreach_mul_(p, 1.0 - lr * options_.weight_decay);
      at::_foreach_lerp_(m, g, 1.0 - b1);
      at::_foreach_mul_(v, b2);
      at::_foreach_addcmul_(v, g, g, 1.0 - b2);
      auto denom = at::_foreach_sqrt(v);
      at::_foreach_div_(denom, bias_correction2_sqrt);
      at::_foreach_add_(denom, options_.eps);
      at::_foreach_addcdiv_(p, m, denom, -step_size);
    });
    return;
  }
#endif
  for (size_t i = 0; i < ps.size(); ++i) {
    auto& p = ps[i];
    const auto& grad = gs[i];
    // Same operation order as torch.optim.AdamW's single-tensor implementation.
    p.mul_(1.0 - lr * options_.weight_decay);
    avgs[i].lerp_(grad, 1.0 - b1);
    sqs[i].mul_(b2).addcmul_(grad, grad, 1.0 - b2);
    auto denom = (sqs[i].sqrt() / bias_correction2_sqrt).add_(options_.eps);
    p.addcdiv_(avgs[i], denom, -step_size);
  }
}

std::map<std::string, torch::Tensor> AdamW::state_dict() const {
  std::map<std::string, torch::Tensor> state;
  for (size_t i = 0; i < params_.size(); ++i) {
    state[params_[i].first + ".exp_avg"] = exp_avg_[i];
    state[params_[i].first + ".exp_avg_sq"] = exp_avg_sq_[i];
  }
  state[kStepKey] = torch::tensor(step_, torch::kLong);
  return state;
}

void AdamW::load_state_dict(const std::map<std::string, torch::Tensor>& state, const std::string& source) {
  auto find = [&](const std::string& key) -> const torch::Tensor& {
    auto it = state.find(key);
    if (it == state.end())
      throw UserError(source + ": missing key '" + key + "' (the checkpoint was saved with other trainable "
                      "parameters; use the same freeze settings to resume)");
    return it->second;
  };
  const auto& step = find(kStepKey);
  if (step.numel() != 1)
    throw UserError(source + ": key '" + std::string(kStepKey) + "' must hold one integer (got shape " +
                    shape_str(step.sizes()) + ")");
  std::vector<torch::Tensor> avg, avg_sq;
  for (const auto& [name, p] : params_) {
    for (const char* suffix : {".exp_avg", ".exp_avg_sq"}) {
      const auto key = name + suffix;
      const auto& t = find(key);
      if (t.sizes() != p.sizes())
        throw UserError(source + ": key '" + key + "' has shape " + shape_str(t.sizes()) + ", expected " +
                        shape_str(p.sizes()));
      (std::string(suffix) == ".exp_avg" ? avg : avg_sq).push_back(t);
    }
  }
  const size_t expected = 2 * params_.size() + 1;
  if (state.size() != expected) {
    std::set<std::string> known = {kStepKey};
    for (const auto& [name, p] : params_) known.insert(name + ".exp_avg"), known.insert(name + ".exp_avg_sq");
    for (const auto& [key, t] : state)
      if (!known.count(key))
        throw UserError(source + ": unexpected key '" + key + "' (not a trainable parameter of this model; use "
                        "the same freeze settings to resume)");
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    exp_avg_[i].copy_(avg[i]);
    exp_avg_sq_[i].copy_(avg_sq[i]);
  }
  step_ = step.to(torch::kLong).item<int64_t>();
}

double clip_grad_norm(std::vector<torch::Tensor>& params, double max_norm) {
  std::vector<torch::Tensor> grads;
  for (auto& p : params) grads.push_back(p.grad());
  return clip_gradients(grads, max_norm);
}

torch::Tensor gradient_sum_of_squares(const std::vector<torch::Tensor>& grads_in) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& g : grads_in)
    if (g.defined()) grads.push_back(g);
  torch::Tensor sum_sq;
#if PI0_HAVE_FOREACH
  if (!grads.empty() && grads[0].is_cuda()) {
    // One fused launch per group for the per-tensor norms. Per-tensor norms are float32 (accumulated in float32 by
    // the kernel), combined in float64.
    for_each_group({&grads}, [&](const std::vector<std::vector<torch::Tensor>>& l) {
      auto norms = torch::stack(at::_foreach_norm(l[0], 2)).to(torch::kFloat64);
      auto s = norms.mul(norms).sum();
      sum_sq = sum_sq.defined() ? sum_sq.add(s.to(sum_sq.device())) : s;
    });
  }
#endif
  if (!sum_sq.defined() && !grads.empty() && grads[0].device().is_cpu()) {
    // Host gradients: per-tensor sums in float64 added in list order, as the optimizer offload adds its own.
    double total = 0;
    for (auto& g : grads) total += tensor_sum_of_squares(g).item<double>();
    return torch::tensor(total, torch::kFloat64);
  }
  if (!sum_sq.defined()) {
    for (auto& g : grads) {
      auto s = tensor_sum_of_squares(g);
      sum_sq = sum_sq.defined() ? sum_sq.add(s.to(sum_sq.device())) : s;
    }
  }
  return sum_sq;
}

torch::Tensor tensor_sum_of_squares(const torch::Tensor& g) {
  torch::NoGradGuard no_grad;
  const auto type = g.scalar_type();
  if (g.device().is_cpu() && (type == torch::kFloat32 || type == torch::kBFloat16 || type == torch::kFloat64))
    return torch::tensor(host_sum_of_squares(g.contiguous(), host_pool()), torch::kFloat64);
  // Chunked so a 500M-element embedding gradient never needs a full float64 copy.
  constexpr int64_t kChunk = int64_t{1} << 24;
  auto flat = g.reshape({-1});
  torch::Tensor sum_sq;
  for (int64_t start = 0; start < flat.numel(); start += kChunk) {
    auto part = flat.narrow(0, start, std::min(kChunk, flat.numel() - start)).to(torch::kFloat64);
    auto s = part.mul(part).sum();
    sum_sq = sum_sq.defined() ? sum_sq.add(s) : s;
  }
  return sum_sq.defined() ? sum_sq : torch::zeros({}, g.options().dtype(torch::kFloat64));
}

double clip_scale(double norm, double max_norm) {
  return std::isfinite(norm) && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

void scale_gradients_to_norm(const std::vector<torch::Tensor>& grads_in, double norm, double max_norm) {
  const double coef = clip_scale(norm, max_norm);
  if (coef == 1.0) return;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& g : grads_in)
    if (g.defined()) grads.push_back(g);
  if (grads.empty()) return;
#if PI0_HAVE_FOREACH
  for_each_group({&grads}, [&](const std::vector<std::vector<torch::Tensor>>& l) { at::_foreach_mul_(l[0], coef); });
#else
  for (auto& g : grads) g.mul_(coef);
#endif
}

double clip_gradients(const std::vector<torch::Tensor>& grads, double max_norm,
                      const std::function<double(double)>& sum_over_ranks) {
  const auto sum_sq = gradient_sum_of_squares(grads);
  double total = sum_sq.defined() ? sum_sq.item<double>() : 0.0;
  if (sum_over_ranks) total = sum_over_ranks(total);
  const double norm = std::sqrt(total);
  scale_gradients_to_norm(grads, norm, max_norm);
  return norm;
}

}  // namespace pi0::train

namespace pi0::train {

bool host_adamw_takes(const torch::Tensor& param, const torch::Tensor& grad) { return host_update_takes(param, grad); }

void host_adamw_step(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
                     const std::vector<torch::Tensor>& exp_avgs, const std::vector<torch::Tensor>& exp_avg_sqs,
                     double lr, int64_t step, const AdamWOptions& o, double grad_scale) {
  PI0_CHECK(grads.size() == params.size() && exp_avgs.size() == params.size() &&
                exp_avg_sqs.size() == params.size(),
            "host_adamw_step: the four lists differ in length");
  std::vector<HostUpdateTensor> tensors;
  for (size_t i = 0; i < params.size(); ++i) {
    PI0_CHECK(host_adamw_takes(params[i], grads[i]) && host_adamw_takes(exp_avgs[i], params[i]) &&
                  host_adamw_takes(exp_avg_sqs[i], params[i]),
              "host_adamw_step: tensor ", i, " is not contiguous float32 in host memory");
    tensors.push_back({params[i], grads[i], exp_avgs[i], exp_avg_sqs[i], {}, {}});
  }
  torch::NoGradGuard no_grad;
  HostUpdateScalars s;
  s.lr = lr, s.beta1 = o.beta1, s.beta2 = o.beta2, s.eps = o.eps, s.weight_decay = o.weight_decay;
  s.step = step, s.grad_scale = grad_scale;
  host_update(tensors, s, host_pool());
}

}  // namespace pi0::train
