// Per-sample transforms from a RawSample to model inputs, in openpi's order (openpi-reference §7.1-7.4):
//   1. delta actions (optional mask)            DeltaActions
//   2. normalize state and actions             Normalize (z-score for pi0, quantile for pi0.5)
//   3. resize_with_pad images to image_size    ResizeImages (PIL bilinear, black padding)
//   4. tokenize the prompt                     TokenizePrompt (pi0.5: discretized normalized state, native dim)
//   5. zero-pad state and actions to action_dim PadStatesAndActions
//   6. uint8 -> float [-1,1], NCHW             Observation.from_dict
//   7. training only: augmentation             model.preprocess_observation(train=True), JAX path
// plus the inverses needed on model outputs (unnormalize, absolute actions).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pi0/data/dataset.h"
#include "pi0/data/norm_stats.h"
#include "pi0/model/observation.h"

namespace pi0::data {

class Tokenizer;
class FastTokenizer;
class FastPromptTokenizer;

// ---- random numbers (reproducible across platforms and thread schedules) ----

/// SplitMix64 stream; uniform() uses the top 53 bits, so results do not depend on the standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  double uniform(double lo, double hi);  ///< [lo, hi)

 private:
  uint64_t state_;
};

/// Seed of the augmentation stream of one sample: a hash of (seed, epoch, dataset index).
uint64_t sample_seed(uint64_t seed, int64_t epoch, int64_t index);

// ---- single operations (exposed for tests and inference) ----

/// actions[:, :m] -= state[:m] where mask (m = mask length); mask longer than the dims is a UserError.
torch::Tensor delta_actions(const torch::Tensor& actions_HA, const torch::Tensor& state_S,
                            const std::vector<bool>& mask, const std::string& what);
/// Inverse of delta_actions.
torch::Tensor absolute_actions(const torch::Tensor& actions_HA, const torch::Tensor& state_S,
                               const std::vector<bool>& mask);

enum class NormMode { kNone, kZScore, kQuantile };

/// z-score: (x − mean) / (std + 1e-6); quantile: (x − q01) / (q99 − q01 + 1e-6) · 2 − 1 (no clipping).
/// Stats longer than x's last dim are truncated (openpi); shorter is a UserError naming `what` (file and key).
torch::Tensor normalize(const torch::Tensor& x, const KeyStats& stats, NormMode mode, const std::string& what);
/// Inverse. z-score: x·(std+1e-6)+mean with stats padded (mean 0, std 1) to x's dim; quantile:
/// (x+1)/2·(q99−q01+1e-6)+q01 on the first len(q01) dims, the rest passed through.
torch::Tensor unnormalize(const torch::Tensor& x, const KeyStats& stats, NormMode mode);

/// Zero-pads the last dim to `dim` (no truncation when larger).
torch::Tensor pad_last_dim(const torch::Tensor& x, int64_t dim);

/// PIL-style bilinear resize of [H,W,3] uint8 to [out_h,out_w,3] uint8 (triangle filter widened when
/// downscaling, horizontal pass then vertical, 8-bit rounding between passes).
torch::Tensor resize_bilinear(const torch::Tensor& hwc_u8, int64_t out_h, int64_t out_w);
/// openpi_client.image_tools.resize_with_pad: keep aspect ratio (ratio = max(w/S, h/S), int() truncation),
/// bilinear resize, black padding with offsets int((S − size)/2), i.e. the odd pixel goes to the bottom/right.
/// No-op when already S×S.
torch::Tensor resize_with_pad(const torch::Tensor& hwc_u8, int64_t size);
/// [H,W,3] uint8 -> [3,H,W] float32 in [-1,1] (x/255·2−1).
torch::Tensor image_to_float(const torch::Tensor& hwc_u8);

struct AugmentOptions {
  double crop_scale = 0.95;        ///< non-wrist: random crop of int(S·0.95) pixels (212 of 224), resized back
  double max_rotation_deg = 5.0;   ///< non-wrist: rotation uniform in ±5°
  double brightness = 0.3;         ///< all cameras, augmax ColorJitter (HSV)
  double contrast = 0.4;
  double hue = 0.1;
  double jitter_prob = 0.5;        ///< augmax default p: the jitter is applied to half the images
};

/// In-place JAX-path augmentation of one [3,S,S] float image in [-1,1] (§7.4): non-wrist cameras get crop +
/// resize + rotation as one bilinear warp with black fill; every camera gets the HSV color jitter (brightness
/// and contrast on V, hue shift; augmax 0.4.1 draws a saturation amount but discards it, and so do we).
void augment_image(torch::Tensor& chw, bool wrist, Rng& rng, const AugmentOptions& options = {});

// ---- the whole per-sample pipeline ----

/// Whether a camera the data lacks enters the model as a seen black image (mask true) rather than a masked one.
/// pi0-FAST only, as openpi's LIBERO and DROID input transforms set it for that model type: its training positions
/// count every image token (arange) but sampling's count the unmasked ones (cumsum), so a masked camera would shift
/// every text position between training and sampling.
inline bool absent_camera_seen(const std::string& model_type) { return model_type == "pi0_fast"; }

struct TransformOptions {
  std::string model_type = "pi0";  ///< "pi0", "pi05" or "pi0_fast"
  int64_t action_dim = 32;         ///< D: state and actions are zero-padded to this
  int64_t image_size = 224;        ///< S
  int64_t max_token_len = 0;       ///< L; 0 = model default (48 pi0, 200 pi05)
  bool discrete_state_input = true;///< pi05 only: state as text in the prompt (false: pi0 prompt format)
  std::string norm = "auto";       ///< "auto" (pi0 zscore, pi05 quantile), "zscore", "quantile" or "none"
  std::vector<bool> delta_action_mask;  ///< e.g. 6×true + 1×false for LIBERO pi0; empty: absolute actions
  AugmentOptions augment;
  /// train.ki: each sample also carries its FAST block (see ProcessedSample::fast_tokens), made by this tokenizer from
  /// the normalized actions at the robot's own action dim; null: no FAST block.
  std::shared_ptr<const FastTokenizer> fast_tokenizer;
  int64_t max_fast_tokens = 0;  ///< F: the block's length (train.ki.max_fast_tokens)
  /// model_type pi0_fast (required there): the prompt, the state and the actions in openpi's pi0-FAST layout.
  std::shared_ptr<const FastPromptTokenizer> fast_prompt;
  /// train.subtask: each sample also carries its subtask block (ProcessedSample::subtask_tokens) of this length (0 =
  /// none), made of the cue's tokens, the subtask text's and EOS.
  int64_t max_subtask_tokens = 0;
  std::string subtask_cue = "Subtask: ";

  TransformOptions resolved() const;  ///< fills max_token_len and norm; UserError on bad values
  NormMode norm_mode() const;
};

/// Output of SampleTransform: one element of a Batch.
struct ProcessedSample {
  std::vector<torch::Tensor> images;  ///< per slot [3,S,S] float32 in [-1,1]
  std::vector<bool> image_masks;
  torch::Tensor state;                ///< [D]
  torch::Tensor tokens;               ///< [L] int64
  torch::Tensor token_mask;           ///< [L] bool
  torch::Tensor actions;              ///< [H,D]
  int64_t valid_rows = 0;             ///< recorded rows of the chunk (RawSample::valid_rows)
  int64_t action_dims = 0;            ///< the robot's own action dims, before padding to D
  /// train.ki only (else undefined): openpi's pi0-FAST postfix without its "Action: " cue (pi0.5's prompt already
  /// ends with it), pg(FAST ids of the normalized [H, action_dims] chunk) + spm("|") + EOS, right-padded with 0 or
  /// truncated to F (TransformOptions::max_fast_tokens). [F] int64 PaliGemma ids and [F] bool.
  torch::Tensor fast_tokens, fast_mask;
  int64_t fast_length = 0;            ///< the block's length before padding or truncation
  /// model_type pi0_fast only (else undefined): `tokens` is openpi's pi0-FAST layout; its ar and loss masks, [L] bool.
  torch::Tensor token_ar_mask, token_loss_mask;
  /// train.subtask only (else undefined): spm(cue) + spm(clean(subtask)) + EOS, right-padded with 0 or truncated to
  /// T (TransformOptions::max_subtask_tokens); all padding when the frame has no subtask text. [T] int64 ids, [T]
  /// bool valid tokens and [T] bool cross-entropy targets (the valid tokens after the cue).
  torch::Tensor subtask_tokens, subtask_mask, subtask_targets;
  int64_t subtask_length = 0;         ///< the block's length before padding or truncation
};

class SampleTransform {
 public:
  /// `stats` may be empty only with norm "none".
  SampleTransform(TransformOptions options, NormStats stats, std::shared_ptr<const Tokenizer> tokenizer);

  /// Checks that the norm stats cover a dataset of these dims (UserError naming the stats file and key) and that
  /// model.action_dim holds them (UserError naming `dataset`, e.g. "data.datasets[1]").
  /// `mask_key` names the delta mask's config key in the error when it has more entries than the dims.
  void check_dims(int64_t state_dim, int64_t action_dim, const std::string& dataset = "the dataset",
                  const std::string& mask_key = "data.delta_action_mask") const;
  /// Runs the pipeline; `augment_seed` set = training augmentation with that seed. Thread-safe.
  ProcessedSample operator()(const RawSample& sample, std::optional<uint64_t> augment_seed = std::nullopt) const;

  const TransformOptions& options() const { return options_; }
  const NormStats& stats() const { return stats_; }
  /// FAST blocks truncated to max_fast_tokens so far (train.ki), over every thread using this transform.
  int64_t fast_truncations() const { return fast_truncations_->load(); }
  /// Subtask blocks truncated to max_subtask_tokens so far (train.subtask).
  int64_t subtask_truncations() const { return subtask_truncations_->load(); }

 private:
  /// The FAST block of the normalized actions [H, action_dims] (train.ki).
  void add_fast_block(ProcessedSample& out, const torch::Tensor& actions) const;
  /// The subtask block of `text` (train.subtask).
  void add_subtask_block(ProcessedSample& out, const std::string& text) const;

  TransformOptions options_;
  NormStats stats_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::vector<int64_t> fast_end_;  ///< spm("|") + EOS, closing every FAST block (openpi's postfix)
  // Shared by copies: the count is the pipeline's. NOTE: a pointer, since std::atomic is not copyable.
  std::shared_ptr<std::atomic<int64_t>> fast_truncations_ = std::make_shared<std::atomic<int64_t>>(0);
  std::shared_ptr<std::atomic<int64_t>> subtask_truncations_ = std::make_shared<std::atomic<int64_t>>(0);
};

/// Stacks samples into a Batch (images [B,3,S,S], masks [B], state [B,D], tokens [B,L], actions [B,H,D], the
/// chunks' recorded rows and action dims [B], with train.ki the FAST blocks [B,F], with train.subtask the subtask
/// blocks [B,T]).
model::Batch collate(const std::vector<ProcessedSample>& samples);

}  // namespace pi0::data
