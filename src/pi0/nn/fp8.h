// FP8 (OCP E4M3, "e4m3fn") quantization simulated in float32, for measuring on any machine what a scaled FP8 GEMM
// (at::_scaled_mm: float8 operands with per-row scales, float32 accumulation) would do to a model's outputs before
// building it for a GPU (issue 48 item 5; docs/serving.md, "FP8").
#pragma once
#include <torch/torch.h>

namespace pi0::nn {

/// The largest finite E4M3 value (1.75 · 2^8); E4M3 has no infinities.
constexpr double kE4M3Max = 448.0;

/// x rounded to the nearest E4M3 value (4 exponent bits with bias 7, 3 mantissa bits, subnormals down to 2^-9),
/// ties to even, saturated to ±448 (what a scaled GEMM's quantization does with its amax scale), as float32.
torch::Tensor round_to_e4m3(const torch::Tensor& x);

/// x [..., K] through FP8 and back as a scaled GEMM operand sees it: per row (last dim) scale = amax/448,
/// q = round_to_e4m3(x / scale), returns q·scale in x's dtype (rows of zeros stay zero). For a weight [out, in] the
/// rows are the output channels; for activations [tokens, in], the tokens.
torch::Tensor fake_quantize_e4m3_rows(const torch::Tensor& x);

}  // namespace pi0::nn
