// pi0 / pi0.5: PaliGemma (SigLIP + Gemma prefix expert) and a Gemma action expert sharing one attention over
// [prefix ; suffix] (openpi pi0.py / pi0_pytorch.py). compute_loss returns the unreduced flow-matching loss;
// sample_actions integrates the learned velocity field with Euler steps and a prefix KV cache.
// Shapes: B batch, H action_horizon, A action_dim, Tp prefix tokens, Ts suffix tokens, Wp/We expert widths.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "pi0/model/gemma.h"
#include "pi0/model/observation.h"
#include "pi0/model/pi0_fast.h"
#include "pi0/model/rtc.h"
#include "pi0/model/siglip.h"
#include "pi0/nn/rope.h"

namespace pi0::model {

struct FusedWeights;  // model/fused_inference.h

struct Pi0Options {
  bool pi05 = false;                                         ///< pi0.5: adaRMS time conditioning, no state token
  /// pi0-FAST (model.type pi0_fast; docs/pi0_fast.md): PaliGemma alone predicts FAST action tokens. No action
  /// expert and no action/state/time projections are built (action_expert is ignored); the loss and the decoding
  /// are Pi0FastImpl's, run on this model's PaliGemma modules (compute_fast_loss, sample_fast_tokens).
  bool fast = false;
  GemmaOptions paligemma = gemma_variant("gemma_2b");        ///< prefix expert (with token embedding)
  GemmaOptions action_expert = gemma_variant("gemma_300m");  ///< suffix expert (vocab_size ignored)
  SiglipOptions siglip = siglip_variant("So400m/14");
  int64_t action_dim = 32;      ///< A: state and actions are zero-padded to this
  int64_t action_horizon = 50;  ///< H
  int64_t max_token_len = 48;   ///< L: 48 for pi0, 200 for pi0.5 in the reference
};

/// Full-size configs of the released models (pi05 selects pi0.5).
Pi0Options pi0_options(bool pi05);

/// Gradient checkpointing per layer stack: the first `vision` SigLIP layers and the first `language` joint layers
/// (both experts' layer l together) are recomputed in backward; the others keep their activations. The first ones,
/// because backward reaches them last, when the later layers' kept activations are already freed. The last joint
/// layer is never recomputed (PaliGemmaWithExpertImpl::forward), so `language` = depth − 1 and = depth are the same
/// run. E.g. {12, 10} of pi0's 27 SigLIP and 18 joint layers.
struct CheckpointedLayers {
  int64_t vision = 0;
  int64_t language = 0;
  bool operator==(const CheckpointedLayers& o) const { return vision == o.vision && language == o.language; }
  bool operator!=(const CheckpointedLayers& o) const { return !(*this == o); }
};
/// Every layer of both stacks: what gradient checkpointing "on" recomputes.
inline CheckpointedLayers all_layers(const Pi0Options& o) { return {o.siglip.depth, o.paligemma.depth}; }
/// Tiny model for tests: "dummy" Gemma experts, "tiny/14" SigLIP, action_dim 8, horizon 4, 6 tokens.
Pi0Options dummy_options(bool pi05, int64_t vocab_size = 128, int64_t image_size = 28);

/// The joint forward over both experts, layer by layer. Module names follow openpi's PyTorch state_dict:
/// paligemma.model.{vision_tower.vision_model, multi_modal_projector.linear, language_model}, gemma_expert.model.
class PaliGemmaWithExpertImpl : public torch::nn::Module {
 public:
  explicit PaliGemmaWithExpertImpl(const Pi0Options& o);

  struct Output {
    torch::Tensor prefix, suffix;  ///< final-normed outputs (undefined for an absent expert)
  };
  /// prefix [B,Tp,Wp] and/or suffix [B,Ts,We] embeddings (either may be undefined); mask [B,T,S] bool with
  /// T = Tp+Ts queries and S = (cached keys) + T keys; positions [B,T]; cond [B,We] for adaRMS (pi0.5).
  /// With `cache_out`, per-layer post-RoPE keys/values of this pass are stored; with `cache_in`, they are
  /// prepended to this pass's keys (suffix-only denoise steps). `checkpointed_layers`: the first this many layers
  /// are recomputed in backward (never the last one); with `cache_out` the recomputation also
  /// yields the cached keys/values, so a cache that trains gets its gradient.
  Output forward(const torch::Tensor& prefix, const torch::Tensor& suffix, const torch::Tensor& mask,
                 const torch::Tensor& positions, const torch::Tensor& cond, const KVCache* cache_in,
                 KVCache* cache_out, int64_t checkpointed_layers);

  GemmaModel language_model{nullptr};
  GemmaModel expert{nullptr};
  Siglip vision{nullptr};
  /// Called before each joint layer's forward (train.offload's wait for the layer's weights); empty: none.
  LayerGate layer_gate;
  nn::Dense projector{nullptr};  ///< SigLIP width → prefix width (openpi's SigLIP "head")

 private:
  // One layer of both experts; returns {prefix, suffix, k, v}.
  std::vector<torch::Tensor> layer_forward(int64_t l, const torch::Tensor& prefix, const torch::Tensor& suffix,
                                           const torch::Tensor& mask, const nn::RopeTables& rope,
                                           const torch::Tensor& cond, const torch::Tensor& k_cache,
                                           const torch::Tensor& v_cache);
  // Whether layer l's prefix rows need gradients: its input or the cache it reads does, or one of its prefix-expert
  // parameters trains (a LoRA factor included).
  bool prefix_needs_grad(int64_t l, const torch::Tensor& prefix, const torch::Tensor& k_cache,
                         const torch::Tensor& v_cache);
};
TORCH_MODULE(PaliGemmaWithExpert);

/// How joint attention is computed. kExplicit: matmul → float32 masked softmax → matmul, the reference path
/// (openpi's own arithmetic). kSdpa: at::scaled_dot_product_attention (LibTorch ≥ 2.1; on CUDA it picks a fused
/// kernel — memory-efficient or cuDNN, which take the joint mask as an additive bias — and never materializes
/// the [B,N,T,S] logits). kAuto: kSdpa on CUDA when available, else kExplicit.
enum class AttentionImpl { kAuto, kExplicit, kSdpa };
/// True when this LibTorch has at::scaled_dot_product_attention with an explicit scale (≥ 2.1).
bool sdpa_available();
/// "auto" | "explicit" | "sdpa" → AttentionImpl (UserError naming `key` otherwise, or sdpa without support).
AttentionImpl parse_attention_impl(const std::string& name, const std::string& key);

/// Joint grouped-query attention: q [B,T,N,D], k/v [B,S,K,D] (post-RoPE, scaled q) → [B,T,N·D].
/// `mask` is either [B,T,S] bool (explicit path: logits and softmax in float32, masked logits set to kMaskValue)
/// or the additive bias [B,1,T,S] in q's dtype made by attention_bias() (SDPA path).
torch::Tensor joint_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& mask);
/// [B,T,S] bool mask → additive bias [B,1,T,S] in `dtype`: 0 where allowed, kMaskValue elsewhere. A finite
/// value (not −inf) keeps a fully masked query row (padding) at a uniform softmax as in openpi, never NaN.
torch::Tensor attention_bias(const torch::Tensor& mask, torch::ScalarType dtype);

/// Wall-clock times of one sample_actions call, in milliseconds (CUDA work is synchronized before each reading).
struct SampleTiming {
  double prefix_ms = 0.0;           ///< embed_prefix + the prefix KV-cache pass (embedding only without the cache)
  std::vector<double> step_ms;      ///< one per denoise step, in order
  double total_ms() const;
};

class Pi0Impl : public torch::nn::Module {
 public:
  explicit Pi0Impl(Pi0Options o);

  /// Per-element flow-matching loss [B,H,A] (no reduction). noise ~ N(0,I) [B,H,A] and time t ∈ (0,1] [B] are
  /// sampled from the global generator when not given: t = Beta(1.5,1)·0.999 + 0.001. `time` may also be [B,H], one
  /// per action token (training-time real-time chunking gives the first d tokens t = 0, so they enter clean).
  torch::Tensor compute_loss(const Observation& obs, const torch::Tensor& actions,
                             std::optional<torch::Tensor> noise = std::nullopt,
                             std::optional<torch::Tensor> time = std::nullopt);
  /// Knowledge insulation (pi0.5 paper; docs/ki.md): one training forward over [images; prompt; FAST block] for the
  /// backbone and the action expert's suffix over the images and prompt only.
  ///   pass 1: the backbone over P ∪ F (F rows ar = 1: causal among themselves, after all of P; positions
  ///           cumsum(pad) − 1 over P ∪ F), keeping each layer's post-RoPE keys/values of the P rows;
  ///   pass 2: the action expert over the suffix against those keys/values — detached when `stop_gradient` — with
  ///           the positions and mask of sampling (n_valid(P) + arange(H)), so sample_actions is unchanged.
  /// The cross-entropy predicts each valid F token from the row before it (the first from P's last valid row) with
  /// the tied embedding's logits, computed only there, in float32, in chunks of rows. `fast_tokens` [B,F] int64
  /// PaliGemma ids and `fast_mask` [B,F] bool (F may be 0); noise and time as compute_loss.
  struct KiLoss {
    torch::Tensor flow;     ///< [B,H,A] per-element flow-matching loss, unreduced (as compute_loss)
    torch::Tensor ce;       ///< [B] float32: the mean over the example's valid FAST targets of −log p (0 without any)
    torch::Tensor targets;  ///< [B] float32: valid FAST targets per example
    torch::Tensor correct;  ///< [B] float32: targets that are the logits' argmax (no gradient)
    /// [B,F] int64: the logits' argmax at each valid FAST target, -1 elsewhere (the teacher-forced prediction the
    /// trainer's fast_undecodable reads); [B,0] without a FAST block.
    torch::Tensor predicted;
    /// With a subtask block (else undefined): the same three over its targets.
    torch::Tensor subtask_ce, subtask_targets, subtask_correct;
  };
  KiLoss compute_ki_loss(const Observation& obs, const torch::Tensor& actions, const torch::Tensor& fast_tokens,
                         const torch::Tensor& fast_mask, bool stop_gradient = true,
                         std::optional<torch::Tensor> noise = std::nullopt,
                         std::optional<torch::Tensor> time = std::nullopt);
  /// The text blocks after the prompt (docs/subtask.md, docs/ki.md): [P; T; F].
  struct PrefixBlocks {
    /// Subtask block T (train.subtask), or undefined: [B,T] int64 ids (cue + text + EOS), [B,T] bool valid tokens and
    /// [B,T] bool targets (the valid tokens after the cue). Causal (ar = 1 on each row), seen by the action expert.
    torch::Tensor subtask_tokens, subtask_mask, subtask_targets;
    /// FAST block F (train.ki), or undefined: [B,F] ids and mask. Causal after T; never seen by the action expert.
    torch::Tensor fast_tokens, fast_mask;
  };
  /// compute_ki_loss with a subtask block too: pass 1 over P ∪ T ∪ F (positions cumsum(pad) − 1), pass 2 the expert
  /// over the P ∪ T keys/values (detached when `stop_gradient`; subtask prediction without insulation passes false),
  /// positions n_valid(P ∪ T) + arange(H) as in sample_actions_with_subtask. Each CE target is predicted from the
  /// nearest valid row before it, so T's first target from the cue's last token and F's first from T's EOS (or P's
  /// last valid row when T is all padding).
  KiLoss compute_prefix_loss(const Observation& obs, const torch::Tensor& actions, const PrefixBlocks& blocks,
                             bool stop_gradient = true, std::optional<torch::Tensor> noise = std::nullopt,
                             std::optional<torch::Tensor> time = std::nullopt);

  /// Greedy subtask decoding (pi0.5 paper; docs/subtask.md). After the prefix pass (images and prompt), the `cue`
  /// ids are fed as causal rows through the KV cache, then one token at a time the argmax of the tied embedding's
  /// logits at the last row, until every example has produced `end_id` or the block has `max_tokens` tokens (cue
  /// included). Tokens after an example's end are padding (mask false), as in training's right-padded block.
  struct SubtaskDecoded {
    torch::Tensor tokens;  ///< [B,T'] int64 (T' ≤ max_tokens): cue, generated ids (end included), 0 after the end
    torch::Tensor mask;    ///< [B,T'] bool: the valid tokens
  };
  SubtaskDecoded decode_subtask(const Observation& obs, const std::vector<int64_t>& cue, int64_t max_tokens,
                                int64_t end_id);
  /// decode_subtask, then flow-matching sampling against the prefix and the decoded block (the cache the decoding
  /// built; the modules' path: no simplified weights, no CUDA graph). Returns the actions [B,H,A]; `decoded`, when
  /// given, receives the block.
  torch::Tensor sample_actions_after_subtask(const Observation& obs, const std::vector<int64_t>& cue,
                                             int64_t max_tokens, int64_t end_id, SubtaskDecoded* decoded,
                                             std::optional<torch::Tensor> noise = std::nullopt,
                                             int64_t num_steps = 10);
  /// Sampling with a given subtask block [B,T] (ids and valid mask), fed as one teacher-forced causal pass after the
  /// prefix: what training's expert reads. The reference for sample_actions_after_subtask.
  torch::Tensor sample_actions_with_subtask(const Observation& obs, const torch::Tensor& subtask_tokens,
                                            const torch::Tensor& subtask_mask,
                                            std::optional<torch::Tensor> noise = std::nullopt,
                                            int64_t num_steps = 10);
  /// The tied embedding's logits [N,V] (float32) of final-normed backbone rows h [N,W] (openpi's decode).
  torch::Tensor token_logits(const torch::Tensor& h);
  /// Rows of the FAST logits computed at once (each chunk is [rows, vocab] float32); tests shrink it.
  void set_ki_logit_chunk(int64_t rows) { ki_logit_chunk_ = rows; }

  /// pi0-FAST only (Pi0Options::fast): openpi's pi0-FAST loss (Pi0FastImpl::compute_loss) on this model's PaliGemma,
  /// in its compute dtype and with its checkpointed layers. `obs.tokenized_prompt` is the FastPromptTokenizer layout.
  Pi0FastImpl::Loss compute_fast_loss(const Observation& obs, const torch::Tensor& token_ar_mask,
                                      const torch::Tensor& token_loss_mask);
  /// pi0-FAST only: openpi's sample_actions token loop (Pi0FastImpl::sample_tokens) on the prefix layout.
  Pi0FastImpl::Decoded sample_fast_tokens(const Observation& obs, const torch::Tensor& token_ar_mask,
                                          int64_t max_decoding_steps, double temperature = 0.0,
                                          std::optional<at::Generator> generator = std::nullopt);
  bool is_fast() const { return options_.fast; }

  /// Euler integration from t=1 (noise) to t=0 with dt = −1/num_steps. use_kv_cache=false recomputes the
  /// prefix at every step (reference check and benchmark baseline). Returns [B,H,A] float32. `timing`, when
  /// given, receives the prefix-pass and per-step times (the result is the same with or without it). `rtc`, when
  /// given and active (model/rtc.h), continues the previous chunk: trained mode (CUDA graph included) or guided
  /// mode (eager); it needs the KV cache. Inactive or null: plain sampling, bit for bit.
  torch::Tensor sample_actions(const Observation& obs, std::optional<torch::Tensor> noise = std::nullopt,
                               int64_t num_steps = 10, bool use_kv_cache = true, SampleTiming* timing = nullptr,
                               const RtcRequest* rtc = nullptr);

  /// Dtype of activations in the transformer blocks (float32 or bfloat16); norms, softmax and the loss stay
  /// float32 whatever this is.
  void set_compute_dtype(torch::ScalarType dtype) { compute_dtype_ = dtype; }
  torch::ScalarType compute_dtype() const { return compute_dtype_; }
  /// Attention arithmetic (see AttentionImpl); kAuto by default.
  void set_attention_impl(AttentionImpl impl) { attention_impl_ = impl; }
  AttentionImpl attention_impl() const { return attention_impl_; }
  /// Whether passes on `device` use SDPA under the current setting.
  bool uses_sdpa(const torch::Device& device) const;
  /// sample_actions on CUDA with the KV cache: capture the whole call in CUDA graphs per input shape (the prefix
  /// pass, SigLIP included, and the denoising loop, replayed back to back with no host synchronization) and replay
  /// them: the passes are made of many small kernels and launch-bound. Real-time chunking's guided mode stays
  /// eager. No effect on CPU or without CUDA support.
  void set_cuda_graph(bool on) { cuda_graph_ = on; }
  /// sample_actions with the KV cache runs on a simplified copy of the weights (model/fused_inference.h: norms
  /// folded, QKV and gate/up stacked, the time branch precomputed), made on first use and again whenever the
  /// weights change; off: the modules' own forward (the reference path). On by default; off while a layer gate is
  /// set (train.offload updates the weights layer by layer).
  void set_fused_inference(bool on) { fused_inference_ = on; }
  bool fused_inference() const { return fused_inference_; }
  /// On the simplified weights only: the prefix's Gemma GEMMs with FP8-quantized operands, simulated in float32
  /// (nn/fp8.h: per output channel weight scales, per token activation scales), to measure FP8's action error
  /// before an FP8 path is built for GPUs (pi0-infer --simulate-fp8; docs/serving.md, "FP8").
  void set_fp8_simulation(bool on) { fp8_simulation_ = on; }
  bool fp8_simulation() const { return fp8_simulation_; }
  /// Called before each SigLIP and joint layer's forward (train.offload: the host updates the weights in the
  /// forward's order while the next step starts, and each layer waits for its own); empty: none.
  void set_layer_gate(LayerGate gate);
  bool cuda_graph() const { return cuda_graph_; }
  /// Recompute each transformer layer (both experts' layer together, and each SigLIP block) in backward, or none:
  /// set_checkpointed_layers of all_layers(options()) or {0, 0}.
  void set_gradient_checkpointing(bool on);
  /// Recompute the first `vision` SigLIP layers and the first `language` joint layers in backward
  /// (CheckpointedLayers: the last joint layer is kept, no memory to gain there); frozen layers that need no
  /// gradient are never recomputed. Each count is 0 to its stack's depth.
  void set_checkpointed_layers(int64_t vision, int64_t language);
  CheckpointedLayers checkpointed_layers() const { return checkpointed_; }

  struct Embedded {
    torch::Tensor embs;      ///< [B,T,W] compute dtype
    torch::Tensor pad_mask;  ///< [B,T] bool
    torch::Tensor ar_mask;   ///< [T] bool
    torch::Tensor cond;      ///< pi0.5 adaRMS conditioning [B,We] float32, else undefined
  };
  Embedded embed_prefix(const Observation& obs);
  /// `time` [B] (one per example) or [B,H] (one per action token: pi0's action-time MLP and pi0.5's adaRMS
  /// condition, then [B,H,We], take each token's own).
  Embedded embed_suffix(const torch::Tensor& state, const torch::Tensor& x_t, const torch::Tensor& time);
  /// Velocity v_t [B,H,A] from one joint pass over prefix and suffix (no cache).
  torch::Tensor velocity_full(const Embedded& prefix, const torch::Tensor& state, const torch::Tensor& x_t,
                              const torch::Tensor& time);

  const Pi0Options& options() const { return options_; }
  ~Pi0Impl() override;

  PaliGemmaWithExpert paligemma_with_expert{nullptr};
  nn::Dense action_in_proj{nullptr}, action_out_proj{nullptr};
  nn::Dense state_proj{nullptr}, action_time_mlp_in{nullptr}, action_time_mlp_out{nullptr};  // pi0
  nn::Dense time_mlp_in{nullptr}, time_mlp_out{nullptr};                                      // pi0.5

 private:
  Pi0Options options_;
  // v(x, t) of one suffix pass against a fixed prefix cache (t [B] or [B,H]).
  // `checkpointed_layers`: recomputed in backward (training through a cache: knowledge insulation).
  torch::Tensor velocity_cached(const KVCache& cache, const torch::Tensor& prefix_pad_mask, const torch::Tensor& state,
                                const torch::Tensor& x, const torch::Tensor& time, int64_t checkpointed_layers = 0);
  // embed_prefix and the prefix pass: the per-layer KV cache and the prefix's padding mask.
  struct Prefilled {
    KVCache cache;
    torch::Tensor pad_mask;
  };
  Prefilled prefill(const Observation& obs, FusedWeights* fused);
  // Feeds `tokens` [B,n] (valid `mask` [B,n]) as causal rows after the cached prefix (modules' path), appending their
  // keys/values to the cache and `mask` to pad_mask; returns the rows' final-normed backbone outputs [B,n,W].
  torch::Tensor extend_prefix(Prefilled& p, const torch::Tensor& tokens, const torch::Tensor& mask);
  // decode_subtask's loop after the prefix pass: extends `p` by the cue and the generated tokens.
  SubtaskDecoded decode_subtask_after(Prefilled& p, const std::vector<int64_t>& cue, int64_t max_tokens,
                                      int64_t end_id);
  // The Euler loop over suffix passes against a fixed prefix cache; returns the final x. `fused`: on the simplified
  // weights, else through the modules. `trained_prefix` and `trained_mask` (both or neither): real-time chunking's
  // trained mode; `guided` (prev on x's device): its guided mode (model/rtc.h). `after_step`, when given, runs after
  // each step (per-step timing).
  torch::Tensor denoise(const KVCache& cache, const torch::Tensor& prefix_pad_mask, const torch::Tensor& state,
                        torch::Tensor x, int64_t num_steps, FusedWeights* fused,
                        const std::function<void()>& after_step = {}, const torch::Tensor& trained_prefix = {},
                        const torch::Tensor& trained_mask = {}, const RtcRequest* guided = nullptr);
  // The simplified weights for sampling now (made or remade as needed), or null when sampling goes through the
  // modules. Drops them and the captured graphs when the weights changed since they were made.
  FusedWeights* fused_for_sampling(bool use_kv_cache);
  // The joint mask of a pass in the representation the attention path takes (bool, or SDPA's additive bias).
  torch::Tensor attention_mask_for(const torch::Tensor& mask, const torch::Tensor& like) const;

  /// pi0-FAST: a view sharing paligemma_with_expert's vision, projector and language model (not registered: the
  /// parameters keep their names here).
  Pi0Fast fast_{nullptr};
  Pi0Fast& fast_view();

  torch::ScalarType compute_dtype_ = torch::kFloat32;
  int64_t ki_logit_chunk_ = 256;
  CheckpointedLayers checkpointed_;  // none by default
  AttentionImpl attention_impl_ = AttentionImpl::kAuto;
  bool cuda_graph_ = false;
  bool fused_inference_ = true;
  bool fp8_simulation_ = false;
  struct GraphCache;  // captured sampling calls (CUDA builds only)
  std::unique_ptr<GraphCache> graphs_;
  std::unique_ptr<FusedWeights> fused_;
  std::vector<std::pair<const void*, int64_t>> sampled_weights_;  // weights_signature when fused_/graphs_ were made
};
TORCH_MODULE(Pi0);

}  // namespace pi0::model
