// pi0-FAST: PaliGemma alone (SigLIP + projector + one Gemma with a tied embedding, no action expert) predicting FAST
// action tokens autoregressively (openpi pi0_fast.py / gemma_fast.py at 15a9616; docs/pi0_fast.md). The token layout
// and the action extraction are data::FastPromptTokenizer's.
//
// Reproduced as openpi computes it, quirks included (released checkpoints were trained and evaluated this way):
//   - training positions are arange(T) for every row, padding included (not cumsum(mask) - 1 as at sampling);
//   - the loss is the per-example mean cross-entropy over loss-masked targets (pre-logits at row j predict token
//     j + 1; logits = pre_logits @ E^T in float32), the caller takes the batch mean;
//   - sampling right-aligns each row (left_to_right_align: rolled so that its last valid token ends the prefix), fills
//     a KV cache of prefill + max_decoding_steps slots (unused slots zero), and feeds the token chosen at step s at
//     position prefill_len + s + 1, one past the position training uses (openpi #705); each step attends to the
//     cache slots [N - prefill_len, N + s + 1), which with a masked camera in the middle of the prefix skips valid
//     tokens at its start and includes the masked camera's (as openpi does); decoding stops only at a step where
//     every row emits EOS (1), rows that ended earlier keep decoding.
// Shapes: B batch, L text tokens, T = image tokens + L, N prefill length, V vocabulary, W width.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include <torch/torch.h>

#include "pi0/model/gemma.h"
#include "pi0/model/observation.h"
#include "pi0/model/siglip.h"
#include "pi0/nn/dense.h"

namespace pi0::model {

struct Pi0FastOptions {
  GemmaOptions paligemma = gemma_variant("gemma_2b");  ///< the language model; vocab_size = the tokenizer's (257152)
  SiglipOptions siglip = siglip_variant("So400m/14");
  int64_t action_dim = 32;      ///< D of the FAST chunks (the robot's own dimension: pi0-FAST pads nothing)
  int64_t action_horizon = 32;  ///< H
  int64_t max_token_len = 250;  ///< L
};

/// Module names follow openpi's PyTorch PaliGemma names: paligemma.model.{vision_tower.vision_model,
/// multi_modal_projector.linear, language_model}; the embedding is tied (no lm_head tensor).
class Pi0FastImpl : public torch::nn::Module {
 public:
  explicit Pi0FastImpl(Pi0FastOptions o);
  /// A view over modules that already exist (model::Pi0Impl's pi0-FAST variant: PaliGemmaWithExpert without its
  /// expert), registered under the same names; the parameters are shared, not copied.
  Pi0FastImpl(Pi0FastOptions o, Siglip vision, nn::Dense projector, GemmaModel language_model);

  struct Embedded {
    torch::Tensor embs;      ///< [B,T,W] float32
    torch::Tensor pad_mask;  ///< [B,T] bool
    torch::Tensor ar_mask;   ///< [B,T] bool (0 on the images)
  };
  /// [each camera's image tokens ; text embeddings · sqrt(W)]; `token_ar_mask` [B,L] for the text.
  Embedded embed_inputs(const Observation& obs, const torch::Tensor& token_ar_mask);

  struct Loss {
    torch::Tensor loss;     ///< [B] float32: mean over the example's loss-masked targets of -log p (0 without any)
    torch::Tensor targets;  ///< [B] float32: loss-masked targets
    torch::Tensor correct;  ///< [B] float32: targets that are the logits' argmax (no gradient)
    /// [B, L-1] int64: at each loss-masked target (the token after row j) the logits' argmax, -1 elsewhere: the
    /// teacher-forced prediction, read as generated tokens for the trainer's fast_undecodable.
    torch::Tensor predicted;
    torch::Tensor logits;   ///< [n_targets, V] float32 at the loss-masked targets, in (b, j) order (keep_logits)
  };
  /// openpi's compute_loss (docs above). token_ar_mask / token_loss_mask [B,L] bool (data::FastTokenized).
  Loss compute_loss(const Observation& obs, const torch::Tensor& token_ar_mask, const torch::Tensor& token_loss_mask,
                    bool keep_logits = false);

  struct Decoded {
    torch::Tensor tokens;                    ///< [B, max_decoding_steps] int64, 0 after the stop
    int64_t steps = 0;                       ///< decoding steps run (tokens chosen per row)
    std::vector<torch::Tensor> step_logits;  ///< per step, the [B,V] float32 logits the token came from (keep_logits)
  };
  /// openpi's sample_actions: greedy (temperature 0) or softmax(logits / temperature) sampling from `generator`.
  /// `obs` holds the prefix only (FastPromptTokenizer::tokenize without actions); `token_ar_mask` [B,L].
  Decoded sample_tokens(const Observation& obs, const torch::Tensor& token_ar_mask, int64_t max_decoding_steps = 256,
                        double temperature = 0.0, std::optional<at::Generator> generator = std::nullopt,
                        bool keep_logits = false);

  /// Rows of logits computed at once in compute_loss ([rows, V] float32 each); tests shrink it.
  void set_logit_chunk(int64_t rows) { logit_chunk_ = rows; }
  /// Dtype of the activations (float32, or bfloat16 under train.precision bf16-mixed / bf16); the logits, their
  /// softmax and the loss stay float32 whatever this is, as do norms and attention softmax.
  void set_compute_dtype(torch::ScalarType dtype) { compute_dtype_ = dtype; }
  torch::ScalarType compute_dtype() const { return compute_dtype_; }
  /// Gradient checkpointing in compute_loss: the first `vision` SigLIP layers and the first `language` Gemma layers
  /// are recomputed in backward (model::CheckpointedLayers' meaning); decoding never checkpoints.
  void set_checkpointed_layers(int64_t vision, int64_t language) { ckpt_vision_ = vision, ckpt_language_ = language; }
  const Pi0FastOptions& options() const { return options_; }

  Siglip vision{nullptr};
  nn::Dense projector{nullptr};  ///< SigLIP width → Gemma width (openpi's SigLIP "head")
  GemmaModel language_model{nullptr};

 private:
  /// The Gemma layers and final norm over x [B,T,W]: mask [B,T,S] bool, positions [B,T]. Without a cache S = T. With
  /// one (k, v per layer [B,S,K,D]), this pass's keys and values are written at slots [write_at, write_at + T) and
  /// the attention reads all S slots.
  torch::Tensor transformer(torch::Tensor x, const torch::Tensor& mask, const torch::Tensor& positions,
                            std::vector<torch::Tensor>* k_cache, std::vector<torch::Tensor>* v_cache,
                            int64_t write_at);
  /// pre_logits [..., W] → logits [..., V] float32 against the tied embedding.
  torch::Tensor logits(const torch::Tensor& pre_logits) const;

  void build(Siglip vision, nn::Dense projector, GemmaModel language_model);

  Pi0FastOptions options_;
  int64_t logit_chunk_ = 256;
  torch::ScalarType compute_dtype_ = torch::kFloat32;
  int64_t ckpt_vision_ = 0, ckpt_language_ = 0;
};
TORCH_MODULE(Pi0Fast);

/// EOS of PaliGemma's tokenizer, where openpi's decoding stops.
constexpr int64_t kPaligemmaEos = 1;

}  // namespace pi0::model
