// Kernels of our own for inference's launch-bound layers (issue 48): each replaces a chain of ATen operations with
// one pass over memory. On CUDA they are built where nvcc is found (src/pi0/nn/fused_kernels.cu; the ATen composite
// stays the fallback); on the CPU a parallel loop computes the same elements. Both take their per-element
// arithmetic from nn/fused_kernels_math.h. Not differentiable: callers under autograd keep the composite. Each call
// is recorded as one operation (RECORD_FUNCTION "pi0::<name>"), so op counts and profiles show it as one kernel.
#pragma once
#include <torch/torch.h>

#include "pi0/nn/rope.h"

namespace pi0::nn {

/// Whether the kernels run on `device`: the CPU always; CUDA when this build compiled them.
bool fused_kernels_available(const torch::Device& device);

/// RoPE of a stacked projection qkv [B,T,N+2K,D] (q heads, then k, then v) with the split-half `tables` ([B,T,1,D/2];
/// float32, or float64 for float64 input): q heads rotated into `q_out` [B,K,T,G,D] (head n = k·G + g, openpi's
/// repeat order; undefined: q is not written), k heads rotated and v heads copied into `kv_out` [B,T,2K,D] (any
/// strides; e.g. rows of a K/V buffer). One kernel for what the composite does in four (product, roll, two writes);
/// the same products and sums in the tables' dtype, one rounding to the outputs' dtype.
void rope_scatter(const torch::Tensor& qkv, const RopeTables& tables, int64_t num_heads, const torch::Tensor& q_out,
                  const torch::Tensor& kv_out);

/// GeGLU of a gate/up projection gu [..., 2F]: gelu_tanh(gu[..., :F]) · gu[..., F:] → [..., F], computed in float32
/// (float64 for float64) and rounded once. One kernel for the composite's two.
torch::Tensor geglu(const torch::Tensor& gate_up);

}  // namespace pi0::nn
