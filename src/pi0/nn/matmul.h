// Matrix products of bf16 (or float16) tensors that accumulate in float32 on every CPU. bf16 compute here means
// what it means on the GPU and in openpi: bf16 inputs, float32 sums, the result rounded once to bf16. LibTorch's
// own CPU kernels do not promise that: 1.13's mm/bmm/matmul/conv2d on bf16 without AVX-512 sum in bf16 whenever
// the operands' layout sends them to its plain gemm loop (relative error 6.6e-2 at k=256, 5.4e-1 at k=2048,
// 9.4e-1 at k=16384 on an AVX2 EPYC, positive inputs), and linear is only spared in its forward; 2.11 happens to
// sum in float32 there. So on the CPU these upcast the operands to float32 for the product and round the result:
// bit-equal to a float32-accumulating bf16 kernel up to the order of the float32 sums, whatever the CPU or the
// LibTorch version. Autograd keeps the bf16 operands (the same saved memory as the native op) and the backward
// products accumulate in float32 the same way. CUDA tensors, float32 and float64 take the native ops unchanged.
#pragma once
#include <torch/torch.h>

namespace pi0::nn {

/// True when `t`'s products go through the float32 upcast here: a bf16 or float16 tensor on the CPU.
bool needs_float32_accumulation(const torch::Tensor& t);

/// a·b as torch::matmul for operands of equal rank (≥ 2) and equal batch dimensions, accumulating in float32.
torch::Tensor matmul(const torch::Tensor& a, const torch::Tensor& b);

/// x·wᵀ + bias as torch::nn::functional::linear (x [..., in], w [out, in], bias [out] or undefined), accumulating
/// in float32 and rounding once.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias = {});

/// conv2d(x, w, bias, stride) with no padding (SigLIP's patch embedding), accumulating in float32.
torch::Tensor conv2d(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias, int64_t stride);

}  // namespace pi0::nn
