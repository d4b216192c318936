// Dense: a Linear layer whose weights may be stored in a different dtype than the activations, plus optional
// LoRA. Mixed precision in LibTorch C++ has no complete autocast, so the casting is explicit: forward() casts
// the (float32 master) weight to the input's dtype. The cast is differentiable, so gradients land on the
// master weight in its own dtype. Parameter names (`weight`, `bias`, `lora_a`, `lora_b`) are the checkpoint keys.
#pragma once
#include <torch/torch.h>

namespace pi0::nn {

struct DenseOptions {
  DenseOptions(int64_t in_features, int64_t out_features) : in_features_(in_features), out_features_(out_features) {}
  TORCH_ARG(int64_t, in_features);
  TORCH_ARG(int64_t, out_features);
  TORCH_ARG(bool, bias) = true;
  /// "lecun" (normal, std 1/sqrt(in)), "zeros" (e.g. adaRMS modulation, SigLIP head), "xavier".
  TORCH_ARG(std::string, init) = "lecun";
};

class DenseImpl : public torch::nn::Module {
 public:
  explicit DenseImpl(DenseOptions options);
  DenseImpl(int64_t in, int64_t out) : DenseImpl(DenseOptions(in, out)) {}
  void reset();
  /// x [..., in] → [..., out] in x's dtype.
  torch::Tensor forward(const torch::Tensor& x);
  /// Adds LoRA factors (lora_a [rank,in], lora_b [out,rank]); output += scaling · (x·Aᵀ)·Bᵀ.
  void enable_lora(int64_t rank, double alpha);
  bool has_lora() const { return lora_a.defined(); }
  /// Folds the LoRA product into `weight` (used at export); afterwards the layer has no LoRA.
  void merge_lora();

  DenseOptions options;
  torch::Tensor weight, bias, lora_a, lora_b;
  double lora_scaling = 0.0;
};
TORCH_MODULE(Dense);

/// Calls merge_lora() on every Dense in `module` (recursively, `module` included); returns how many layers had
/// LoRA factors. Afterwards named_parameters() holds no `lora_a`/`lora_b`.
int64_t merge_all_lora(torch::nn::Module& module);

/// tanh-approximated GELU (flax `nn.gelu` default, HF `gelu_pytorch_tanh`).
torch::Tensor gelu_tanh(const torch::Tensor& x);

}  // namespace pi0::nn

namespace pi0::nn {
/// x in at least float32 (float64 stays float64, so gradient checks can run in double precision).
inline torch::Tensor upcast(const torch::Tensor& x) {
  return x.scalar_type() == torch::kFloat64 ? x : x.to(torch::kFloat32);
}
}  // namespace pi0::nn
