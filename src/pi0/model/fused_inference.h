// Sampling on a simplified copy of the weights: the inference graph with the work a denoise step repeats folded
// away once, when the weights are first sampled from (and again whenever they change). Each simplification is an
// identity of the arithmetic, so actions equal the module path's to rounding (float32 ~1e-6, bf16 within its
// bound; tests/unit/model/test_fused_inference.cpp):
// - Every plain RMSNorm's scale (1 + w) is folded into the columns of the linears that read it: W·(n ⊙ (1+w)) =
//   (W·diag(1+w))·n. The final norm's into action_out_proj.
// - Q, K and V are one matmul (weights stacked), gate and up one more; q's 1/sqrt(D) is folded into Q (D = 16, 64
//   or 256: a power of two, so exact) and RoPE rotates q and k in one pass.
// - pi0: action_in_proj and the action half of action_time_mlp_in are one linear (no nonlinearity between them);
//   the time half is a bias per timestep, and the state token is computed once per call.
// - pi0.5: the time MLP and every AdaRMSNorm's scale, shift and gate are per-timestep vectors.
// - The per-timestep values of the fixed Euler schedule are computed once per step count and kept (TimeBranch).
// - The prefix pass keeps only what the steps read, each layer's keys and values: the last layer's attention
//   output, MLP and the final norm are skipped.
// - The suffix mask and RoPE tables are made once per call, not once per step; pi0's state token runs through the
//   action expert once per call too (its keys and values do not change between steps).
// - Launches (issue 48): the residual adds happen inside the O and down GEMMs (addmm into the stream); RoPE reads
//   bf16 against float32 tables and writes q into the grouped layout and k, v straight into preallocated per-layer
//   K/V buffers (no concatenation of the cache per step); attention is bmm, ATen's masked softmax with a bool mask
//   made once per call, bmm, its output already [B,T,N·D] (kv = 1). 15 kernels per expert layer on a GPU.
// The copy costs the stacked QKV and gate/up weights once more in the compute dtype (pi0: ~3 GB in bf16); the
// output and down projections are the model's own (cast once when the model is float32 and computes in bf16).
// Shapes: B batch, T tokens, W width, N query heads, K kv heads, D head dim, F MLP width, H horizon, A action dim.
#pragma once
#include <map>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "pi0/model/pi0.h"
#include "pi0/nn/rope.h"

namespace pi0::model {

/// One expert layer's weights, folded and stacked, in the compute dtype.
struct FusedLayer {
  torch::Tensor qkv;      ///< [(N+2K)·D, W]: q rows (× 1/sqrt(D)), k rows, v rows; the input norm's scale folded in
  torch::Tensor o;        ///< [W, N·D]
  torch::Tensor gate_up;  ///< [2F, W]: gate rows, then up rows; the pre-FFW norm's scale folded in
  torch::Tensor down;     ///< [W, F]
  double eps_in = 1e-6, eps_post = 1e-6;
  bool fp8 = false;  ///< the GEMMs' inputs go through nn::fake_quantize_e4m3_rows (the weights are stored so)
};

/// The time-dependent values of one suffix pass, for time [B] ([B,1,·]: every token alike) or [B,H] (per token).
/// pi0: `action_bias` float32, action_time_mlp_in's bias plus its time half. pi0.5: for each AdaRMSNorm in order
/// (layer l's input norm at 2l, its pre-FFW norm at 2l+1, the final norm last) 1 + scale and shift (float32) and
/// the residual gate (compute dtype).
struct TimeBranch {
  torch::Tensor action_bias;
  std::vector<torch::Tensor> scale1, shift, gate;
};

struct FusedWeights {
  torch::ScalarType dtype = torch::kFloat32;  ///< compute dtype the copy was made for
  bool fp8_simulated = false;                 ///< Pi0Impl::set_fp8_simulation when it was made: the prefix's layers
  std::vector<FusedLayer> prefix, suffix;     ///< the PaliGemma and action-expert layers
  torch::Tensor out_w, out_b;                 ///< action_out_proj (float32); pi0: the final norm's scale folded in
  torch::Tensor action_w, time_w, time_b;     ///< pi0: [We,A] folded action linear, [We,We] time half, its bias
  double eps_final = 1e-6;
  /// Per (step count, batch): the Euler schedule's branches, made from the same [B] time tensors a step without the
  /// table would use, so that both give the same bits (guided real-time chunking with a zero mask is plain sampling).
  std::map<std::pair<int64_t, int64_t>, std::vector<TimeBranch>> schedules;
};

/// Builds the copy from `m`'s parameters (LoRA factors merged into it) for compute in `dtype`.
FusedWeights fuse_weights(Pi0Impl& m, torch::ScalarType dtype);
/// Every parameter's storage and version counter: equal signatures, unchanged weights.
std::vector<std::pair<const void*, int64_t>> weights_signature(torch::nn::Module& m);

/// The time branch for `time` [B] or [B,H] (float32), computed now.
TimeBranch time_branch(Pi0Impl& m, const FusedWeights& f, const torch::Tensor& time);
/// The branches of the schedule t = 1, 1 + dt, … (dt = −1/num_steps, advanced in float32 as the sampler does) for
/// `batch` examples, computed on first use on `device` and kept.
const std::vector<TimeBranch>& schedule_branches(Pi0Impl& m, FusedWeights& f, int64_t num_steps, int64_t batch,
                                                 const torch::Device& device);

/// What one pass through a stack of layers shares, made once per call: where its keys and values go in the
/// per-layer K/V buffers (KVCache::kv), its RoPE tables and its mask.
struct FusedPass {
  nn::RotaryTables rope;  ///< [B,T,N+2K,D]: q and k heads rotated, v heads passed through (the ATen composite)
  nn::RopeTables rope_half;  ///< [B,T,1,D/2]: the same angles for nn::rope_scatter (our kernel)
  torch::Tensor masked;   ///< [B·K, T·G, S] bool, true = not attended (grouped_mask): grouped_attention
  torch::Tensor mask;     ///< when `masked` is undefined: [B,T,S] bool or SDPA's additive bias for joint_attention
  int64_t row0 = 0;       ///< first buffer row this pass's T tokens write; they attend rows [0, row0 + T)
};

/// What every suffix pass of one call shares: the action tokens' pass (rows Tp + Ts − H … of the buffers, after
/// pi0's state token, whose keys and values suffix_context computes once).
struct SuffixContext {
  FusedPass actions;
};
/// Makes the suffix passes' tables and masks and, for pi0, runs the state token through the action expert once,
/// writing its keys and values into row Tp of each of `cache`'s buffers (it sees only the prefix and itself and has
/// no time input, so they are the same in every step).
SuffixContext suffix_context(Pi0Impl& m, const FusedWeights& f, const KVCache& cache,
                             const torch::Tensor& prefix_pad_mask, const torch::Tensor& state, int64_t batch,
                             const torch::Device& device);

/// `mask` [B,T,S] (true = attended) as grouped_attention's [B·K, T·G, S] bool, true = not attended (ATen's
/// _masked_softmax convention): row t·G + g of kv head k is query head k·G + g of token t. Contiguous, of the logits'
/// shape, made once per call.
torch::Tensor grouped_mask(const torch::Tensor& mask, int64_t kv, int64_t g);

/// Joint attention for grouped queries as three batched products per kv head: logits = q·kᵀ (one GEMM), ATen's
/// masked softmax (float32 inside, rounded once; masked keys excluded rather than added a large negative bias), then
/// probs·v. The arithmetic of joint_attention's explicit path with the parallelism of two GEMMs: a fused SDPA kernel
/// spreads a denoise step (Ts ≈ 51 queries, S ≈ 300–870 keys) over only heads × query blocks (16 on pi0) and walks
/// the keys serially. q [B,K,T,G,D] (scaled), k/v [B,S,K,D] (any strides), masked from grouped_mask → [B,T,N·D];
/// with K = 1 neither side needs a layout copy.
torch::Tensor grouped_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                const torch::Tensor& masked);

/// The prefix pass: each layer's post-RoPE keys and values for `prefix` (embed_prefix's output, whose embeddings
/// it updates in place), in per-layer buffers with room for the suffix's rows behind the prefix's (KVCache::kv).
KVCache fused_prefix_cache(Pi0Impl& m, const FusedWeights& f, const Pi0Impl::Embedded& prefix);
/// Velocity [B,H,A] float32 of one suffix pass at x [B,H,A] against the prefix cache.
torch::Tensor fused_velocity(Pi0Impl& m, const FusedWeights& f, const KVCache& cache, const SuffixContext& ctx,
                             const torch::Tensor& x, const TimeBranch& time);

}  // namespace pi0::model
