// The CUDA side of nn/fused_kernels.h (fused_kernels.cu, compiled by nvcc only where it is found). Arguments are
// checked by the callers in fused_kernels.cpp.
#pragma once
#include <ATen/core/Tensor.h>  // not torch/torch.h: nvcc compiles the file that includes this

#include "pi0/nn/fused_kernels_math.h"

namespace pi0::nn::cuda {

/// `layout`: fused_kernels.cpp's, made from these tensors' shapes and strides.
void rope_scatter(const kernels::RopeScatterLayout& layout, const at::Tensor& qkv, const at::Tensor& cos,
                  const at::Tensor& sin, const at::Tensor& q_out, const at::Tensor& kv_out);
void geglu(const at::Tensor& gate_up, const at::Tensor& out);

}  // namespace pi0::nn::cuda
