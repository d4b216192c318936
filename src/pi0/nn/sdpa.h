// Whether this LibTorch has at::scaled_dot_product_attention with an explicit scale (>= 2.1): the fused attention
// kernels on CUDA (flash, memory-efficient, cuDNN). One definition for every attention in the model.
#pragma once
#include <torch/version.h>

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#define PI0_HAVE_SDPA 1
#else
#define PI0_HAVE_SDPA 0
#endif
