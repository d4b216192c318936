// CUDA kernels of nn/fused_kernels.h. The arithmetic per element is nn/fused_kernels_math.h's, which the CPU tests
// check against ATen's composite; here only the launch: one thread per element pair, on the current stream (so a
// CUDA graph captures them like ATen's kernels).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "pi0/nn/fused_kernels_cuda.h"
#include "pi0/nn/fused_kernels_math.h"

namespace pi0::nn::cuda {

namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

// Thread e covers (b, t, h, i) with i fastest: neighbouring threads read and write neighbouring elements of a head.
template <class scalar_t, class acc_t>
__global__ void rope_scatter_kernel(kernels::RopeScatterLayout l, int64_t t, int64_t heads, int64_t total,
                                    const scalar_t* qkv, const acc_t* cos, const acc_t* sin, scalar_t* q,
                                    scalar_t* kv) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= total) return;
  const int64_t i = e % l.half, h = (e / l.half) % heads, r = e / (l.half * heads);
  int64_t step = 0;
  scalar_t* out = kernels::rope_scatter_destination<scalar_t>(l, r / t, r % t, h, q, kv, step);
  if (out != nullptr) kernels::rope_scatter_pair<scalar_t, acc_t>(l, r / t, r % t, h, i, qkv, cos, sin, out, step);
}

template <class scalar_t, class acc_t>
__global__ void geglu_kernel(int64_t f, int64_t total, const scalar_t* gu, scalar_t* out) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= total) return;
  const int64_t r = e / f, j = e % f;
  const scalar_t* a = gu + r * 2 * f;
  out[e] = static_cast<scalar_t>(kernels::gelu_tanh_mul<acc_t>(static_cast<acc_t>(a[j]), static_cast<acc_t>(a[f + j])));
}

}  // namespace

void rope_scatter(const kernels::RopeScatterLayout& l, const at::Tensor& qkv, const at::Tensor& cos,
                  const at::Tensor& sin, const at::Tensor& q_out, const at::Tensor& kv_out) {
  const c10::cuda::CUDAGuard guard(qkv.device());
  const int64_t t = qkv.size(1), heads = qkv.size(2);
  const int64_t total = qkv.size(0) * t * heads * l.half;
  if (total == 0) return;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, qkv.scalar_type(), "pi0::rope_scatter", [&] {
    using acc_t = at::opmath_type<scalar_t>;  // the tables' dtype, checked by the caller
    rope_scatter_kernel<scalar_t, acc_t><<<blocks_for(total), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        l, t, heads, total, qkv.data_ptr<scalar_t>(), cos.data_ptr<acc_t>(), sin.data_ptr<acc_t>(),
        q_out.defined() ? q_out.data_ptr<scalar_t>() : nullptr, kv_out.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void geglu(const at::Tensor& gate_up, const at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(gate_up.device());
  const int64_t f = out.size(-1), total = out.numel();
  if (total == 0) return;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gate_up.scalar_type(), "pi0::geglu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    geglu_kernel<scalar_t, acc_t><<<blocks_for(total), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        f, total, gate_up.data_ptr<scalar_t>(), out.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace pi0::nn::cuda
