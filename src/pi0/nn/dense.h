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

/// One parameter's cast to the compute dtype, kept while the parameter is unchanged.
struct CachedCast {
  torch::Tensor value;
  const void* data = nullptr;  ///< the parameter's storage when cast (moves on to() / set_data)
  int64_t version = -1;        ///< its version counter then (moves on every in-place update: optimizer, load)
  bool with_grad = false;      ///< cast with an autograd edge to the parameter
};

class DenseImpl : public torch::nn::Module {
 public:
  explicit DenseImpl(DenseOptions options);
  DenseImpl(int64_t in, int64_t out) : DenseImpl(DenseOptions(in, out)) {}
  void reset();
  /// Draws the initial values (the DenseOptions init scheme, zero bias) again; reset() calls it unless a
  /// SkipInitScope is active.
  void initialize();
  /// x [..., in] → [..., out] in x's dtype.
  torch::Tensor forward(const torch::Tensor& x);
  /// Adds LoRA factors (lora_a [rank,in], lora_b [out,rank]); output += scaling · (x·Aᵀ)·Bᵀ (computed as
  /// (scaling · x·Aᵀ)·Bᵀ when the scaling is a power of two ≥ 1, not at all when it is 1: the same bits, less work).
  void enable_lora(int64_t rank, double alpha);
  bool has_lora() const { return lora_a.defined(); }
  /// Folds the LoRA product into `weight` (used at export); afterwards the layer has no LoRA.
  void merge_lora();

  DenseOptions options;
  torch::Tensor weight, bias, lora_a, lora_b;
  double lora_scaling = 0.0;
  /// Whether lora_scaling is a power of two ≥ 1, so forward() can apply it to x·Aᵀ with the same result.
  bool lora_scaling_is_exact_on_h() const;

  /// Cast cache (bf16 compute over float32 master weights): forward() casts each parameter once and reuses the
  /// copy until the parameter changes, so a training step casts once per optimizer step — not once per forward
  /// and again in each checkpointed layer's recomputation — and sampling casts once, not once per denoising
  /// step. The copy keeps its autograd edge, so gradients still reach the master weight. Costs one copy of the
  /// cast parameters in the compute dtype while it lives; see clear_cast_cache().
  bool cast_cache_enabled = true;
  CachedCast cast_w, cast_b, cast_a, cast_bb;
  void drop_casts() { cast_w = cast_b = cast_a = cast_bb = CachedCast{}; }
};
TORCH_MODULE(Dense);

/// Calls merge_lora() on every Dense in `module` (recursively, `module` included); returns how many layers had
/// LoRA factors. Afterwards named_parameters() holds no `lora_a`/`lora_b`.
int64_t merge_all_lora(torch::nn::Module& module);

/// Frees every Dense's cast cache in `module` (the trainer calls it after backward, before the optimizer step
/// changes the weights anyway, so the copies never coexist with the optimizer's temporaries).
void clear_cast_cache(torch::nn::Module& module);
/// Turns the cast cache on or off for every Dense in `module` (off: a cast per use, the lowest memory).
void set_cast_cache(torch::nn::Module& module, bool enabled);
/// Bytes of the cast copies every Dense in `module` holds now (train::StepCensus reports them).
int64_t cast_cache_bytes(torch::nn::Module& module);

/// tanh-approximated GELU (flax `nn.gelu` default, HF `gelu_pytorch_tanh`).
torch::Tensor gelu_tanh(const torch::Tensor& x);

/// GeGLU: gelu_tanh(gate) · up, the same bits forward and backward as that expression, with less kept for backward
/// (gate and up, not the activation too). Differentiable; for inference's stacked projection see fused_kernels.h.
torch::Tensor gelu_tanh_mul(const torch::Tensor& gate, const torch::Tensor& up);

}  // namespace pi0::nn

namespace pi0::nn {
/// x in at least float32 (float64 stays float64, so gradient checks can run in double precision).
inline torch::Tensor upcast(const torch::Tensor& x) {
  return x.scalar_type() == torch::kFloat64 ? x : x.to(torch::kFloat32);
}
}  // namespace pi0::nn
