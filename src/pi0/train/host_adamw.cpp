// AdamW's one-pass update of float32 tensors in host memory (optimizer.h: host_adamw_step).
//
// Built with OpenMP, and without the shared precompiled header (CMakeLists.txt): on LibTorch builds whose ATen runs
// its intra-op threads with OpenMP (Debian's 1.13), at::parallel_for is an inline `#pragma omp parallel` in ATen's
// headers, so in a file compiled without -fopenmp it runs on one thread. (Each at::parallel_for instantiation here
// is for a lambda of this file, so the other files' instantiations are untouched.)
#include <cmath>

#include <ATen/Parallel.h>

#include "pi0/common/check.h"
#include "pi0/train/optimizer.h"

// LibTorch >= 2.4 runs AdamW on the CPU in one fused pass (at::_fused_adamw_).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define PI0_HAVE_FUSED_ADAMW_CPU 1
#else
#define PI0_HAVE_FUSED_ADAMW_CPU 0
#endif

namespace pi0::train {

bool host_adamw_takes(const torch::Tensor& param, const torch::Tensor& grad) {
  auto ok = [](const torch::Tensor& t) {
    return t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous();
  };
  return ok(param) && ok(grad) && grad.numel() == param.numel();
}

void host_adamw_step(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
                     const std::vector<torch::Tensor>& exp_avgs, const std::vector<torch::Tensor>& exp_avg_sqs,
                     double lr, int64_t step, const AdamWOptions& o) {
  PI0_CHECK(grads.size() == params.size() && exp_avgs.size() == params.size() &&
                exp_avg_sqs.size() == params.size(),
            "host_adamw_step: the four lists differ in length");
  for (size_t i = 0; i < params.size(); ++i)
    PI0_CHECK(host_adamw_takes(params[i], grads[i]) && host_adamw_takes(exp_avgs[i], params[i]) &&
                  host_adamw_takes(exp_avg_sqs[i], params[i]),
              "host_adamw_step: tensor ", i, " is not contiguous float32 in host memory");
  torch::NoGradGuard no_grad;
#if PI0_HAVE_FUSED_ADAMW_CPU
  // LibTorch's own one-pass kernel (vectorized per CPU capability). It reads the step from a float tensor, as
  // torch.optim does; without amsgrad it requires max_exp_avg_sqs to be empty.
  const auto step_tensor = torch::full({}, static_cast<double>(step), torch::kFloat32);
  const std::vector<torch::Tensor> steps(params.size(), step_tensor);
  at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, o.beta1, o.beta2,
                    o.weight_decay, o.eps, /*amsgrad=*/false, /*maximize=*/false);
#else
  // Scalars rounded to float once, as ATen's float kernels round theirs. Even unvectorized (the square root keeps
  // errno semantics) the loop runs near the memory's pace: ~10 cycles per element against 28 bytes of traffic.
  const double bias_correction1 = 1.0 - std::pow(o.beta1, static_cast<double>(step));
  const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, static_cast<double>(step)));
  const float decay = static_cast<float>(1.0 - lr * o.weight_decay);
  const float w1 = static_cast<float>(1.0 - o.beta1), b2 = static_cast<float>(o.beta2);
  const float w2 = static_cast<float>(1.0 - o.beta2), eps = static_cast<float>(o.eps);
  const float bc2 = static_cast<float>(bias_correction2_sqrt);
  const float neg_step_size = static_cast<float>(-lr / bias_correction1);
  for (size_t i = 0; i < params.size(); ++i) {
    float* __restrict__ p = params[i].data_ptr<float>();
    const float* __restrict__ g = grads[i].data_ptr<float>();
    float* __restrict__ m = exp_avgs[i].data_ptr<float>();
    float* __restrict__ v = exp_avg_sqs[i].data_ptr<float>();
    // 64 Ki elements per task: 1 MiB of traffic, enough to amortize the hand-off, small enough to spread one
    // Gemma matrix (33.5 M elements) over every thread.
    at::parallel_for(0, params[i].numel(), int64_t{1} << 16, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        const float gk = g[k];
        const float mk = m[k] + w1 * (gk - m[k]);  // lerp with a weight below 1/2, as ATen computes it
        const float vk = v[k] * b2 + w2 * gk * gk;
        m[k] = mk;
        v[k] = vk;
        p[k] = p[k] * decay + neg_step_size * mk / (std::sqrt(vk) / bc2 + eps);
      }
    });
  }
#endif
}

}  // namespace pi0::train
