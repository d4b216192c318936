#include "pi0/nn/fused_kernels.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include "pi0/common/check.h"
#include "pi0/nn/fused_kernels_math.h"
#if PI0_WITH_CUDA_KERNELS
#include "pi0/nn/fused_kernels_cuda.h"
#endif

namespace pi0::nn {

bool fused_kernels_available(const torch::Device& device) {
  if (device.is_cpu()) return true;
#if PI0_WITH_CUDA_KERNELS
  return device.is_cuda();
#else
  return false;
#endif
}

namespace {

void require_device(const torch::Tensor& x, const char* what) {
  PI0_CHECK(fused_kernels_available(x.device()), what, ": no kernel of ours for ", x.device(),
            " in this build (CUDA needs nvcc at configure time); callers check fused_kernels_available first");
}

kernels::RopeScatterLayout rope_layout(const torch::Tensor& qkv, const torch::Tensor& cos, int64_t num_heads,
                                       const torch::Tensor& q_out, const torch::Tensor& kv_out) {
  PI0_CHECK(qkv.dim() == 4 && qkv.size(-1) % 2 == 0, "rope_scatter: qkv must be [B,T,N+2K,D] with D even, got ",
            qkv.sizes());
  const int64_t b = qkv.size(0), t = qkv.size(1), heads = qkv.size(2), d = qkv.size(3);
  const int64_t k = (heads - num_heads) / 2;
  PI0_CHECK(num_heads > 0 && k > 0 && num_heads + 2 * k == heads && num_heads % k == 0, "rope_scatter: ", heads,
            " heads are not N + 2K with N = ", num_heads, " a multiple of K");
  PI0_CHECK(cos.dim() == 4 && cos.size(2) == 1 && cos.size(3) == d / 2, "rope_scatter: tables ", cos.sizes(),
            " do not fit qkv ", qkv.sizes());
  kernels::RopeScatterLayout l;
  l.n = num_heads;
  l.k = k;
  l.g = num_heads / k;
  l.half = d / 2;
  const auto tab = cos.expand({b, t, 1, d / 2});
  for (int i = 0; i < 4; ++i) l.x[i] = qkv.stride(i);
  l.tab[0] = tab.stride(0), l.tab[1] = tab.stride(1), l.tab[2] = tab.stride(3);
  if (q_out.defined()) {
    PI0_CHECK(q_out.sizes() == torch::IntArrayRef({b, k, t, l.g, d}) && q_out.scalar_type() == qkv.scalar_type() &&
                  q_out.device() == qkv.device(),
              "rope_scatter: q_out must be [B,K,T,G,D] = [", b, ",", k, ",", t, ",", l.g, ",", d, "] of qkv's dtype, got ",
              q_out.sizes(), " ", q_out.scalar_type());
    for (int i = 0; i < 5; ++i) l.q[i] = q_out.stride(i);
  }
  PI0_CHECK(kv_out.sizes() == torch::IntArrayRef({b, t, 2 * k, d}) && kv_out.scalar_type() == qkv.scalar_type() &&
                kv_out.device() == qkv.device(),
            "rope_scatter: kv_out must be [B,T,2K,D] = [", b, ",", t, ",", 2 * k, ",", d, "] of qkv's dtype, got ",
            kv_out.sizes(), " ", kv_out.scalar_type());
  for (int i = 0; i < 4; ++i) l.kv[i] = kv_out.stride(i);
  return l;
}

}  // namespace

void rope_scatter(const torch::Tensor& qkv, const RopeTables& tables, int64_t num_heads, const torch::Tensor& q_out,
                  const torch::Tensor& kv_out) {
  RECORD_FUNCTION("pi0::rope_scatter", c10::ArrayRef<const c10::IValue>());
  require_device(qkv, "rope_scatter");
  const auto l = rope_layout(qkv, tables.cos, num_heads, q_out, kv_out);
  const auto cos = tables.cos.expand({qkv.size(0), qkv.size(1), 1, l.half});
  const auto sin = tables.sin.expand_as(cos);
  PI0_CHECK(tables.sin.sizes() == tables.cos.sizes() && sin.strides() == cos.strides(),
            "rope_scatter: cos and sin tables differ in layout");
  // The arithmetic's type (at::opmath_type of the input): float64 for float64, float32 for the rest.
  const auto acc = qkv.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  PI0_CHECK(cos.scalar_type() == acc && sin.scalar_type() == acc, "rope_scatter: tables in ", cos.scalar_type(),
            " for ", qkv.scalar_type(), " input (expected ", acc, ")");
#if PI0_WITH_CUDA_KERNELS
  if (qkv.is_cuda()) return cuda::rope_scatter(l, qkv, cos, sin, q_out, kv_out);
#endif
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, qkv.scalar_type(), "pi0::rope_scatter", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto* x = qkv.data_ptr<scalar_t>();
    const auto* c = cos.data_ptr<acc_t>();
    const auto* s = sin.data_ptr<acc_t>();
    auto* q = q_out.defined() ? q_out.data_ptr<scalar_t>() : nullptr;
    auto* kv = kv_out.data_ptr<scalar_t>();
    const int64_t t = qkv.size(1), heads = qkv.size(2);
    // Destinations once per head, then the pairs along D (unit strides in practice: the compiler vectorizes).
    at::parallel_for(0, qkv.size(0) * t, 8, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t h = 0; h < heads; ++h) {
          int64_t step = 0;
          auto* out = kernels::rope_scatter_destination<scalar_t>(l, r / t, r % t, h, q, kv, step);
          if (out == nullptr) continue;
          for (int64_t i = 0; i < l.half; ++i)
            kernels::rope_scatter_pair<scalar_t, acc_t>(l, r / t, r % t, h, i, x, c, s, out, step);
        }
    });
  });
}

torch::Tensor geglu(const torch::Tensor& gate_up) {
  RECORD_FUNCTION("pi0::geglu", c10::ArrayRef<const c10::IValue>());
  require_device(gate_up, "geglu");
  PI0_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0, "geglu: the last dim must be 2F, got ", gate_up.sizes());
  const auto gu = gate_up.contiguous();
  auto sizes = gu.sizes().vec();
  const int64_t f = sizes.back() / 2;
  sizes.back() = f;
  auto out = torch::empty(sizes, gu.options());
#if PI0_WITH_CUDA_KERNELS
  if (gu.is_cuda()) {
    cuda::geglu(gu, out);
    return out;
  }
#endif
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gu.scalar_type(), "pi0::geglu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto* in = gu.data_ptr<scalar_t>();
    auto* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, f == 0 ? 0 : out.numel() / f, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const scalar_t* a = in + r * 2 * f;
        for (int64_t j = 0; j < f; ++j)
          o[r * f + j] = static_cast<scalar_t>(
              kernels::gelu_tanh_mul<acc_t>(static_cast<acc_t>(a[j]), static_cast<acc_t>(a[f + j])));
      }
    });
  });
  return out;
}

}  // namespace pi0::nn
