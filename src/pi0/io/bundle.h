// Inference bundles: a training checkpoint reduced to what serving needs (openpi-reference §10: model.safetensors
// in openpi's PyTorch layout + config.json + assets/<asset_id>/norm_stats.json), plus our config.yaml and the
// tokenizer, so pi0-infer needs nothing else. Layout and rules: docs/formats.md, "Inference bundle".
//
// Export: config.yaml of the checkpoint → model; model.safetensors (exact names, LoRA included) loaded; EMA
// averages (trainable parameters only) overlaid when chosen; LoRA merged into the base weights; written in openpi
// naming at the requested dtype to a temporary sibling directory, which is then renamed into place.
//
// Running a loaded bundle (observation → model inputs → sample_actions → robot actions) is infer/inference.h.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pi0/common/check.h"
#include "pi0/config/config.h"
#include "pi0/data/fast_prompt.h"
#include "pi0/data/norm_stats.h"
#include "pi0/data/transforms.h"
#include "pi0/model/pi0.h"

namespace pi0::io {

struct ExportOptions {
  /// "ema" (error if the checkpoint has none), "model", or "" = ema if the checkpoint has ema.safetensors, else
  /// model (with a log notice).
  std::string weights;
  /// dtype of every tensor in the exported model.safetensors: bfloat16 (openpi converter default) or float32.
  torch::ScalarType dtype = torch::kBFloat16;
  /// Base weights of a small checkpoint (base_weights.json) at a new location; empty = the recorded path.
  std::string base_weights;
};

struct ExportReport {
  std::string checkpoint_dir;  ///< the checkpoint that was exported
  std::string out_dir;
  std::string weights;         ///< "ema" or "model": what was actually used
  int64_t lora_layers_merged = 0;
  int64_t num_tensors = 0;     ///< tensors in the exported model.safetensors
};

/// The checkpoint given to export_bundle cannot be exported (a file missing or damaged, contents that do not
/// verify, a config its weights do not fit); nothing was written. export_run falls back past it.
class CheckpointRejected : public UserError {
 public:
  using UserError::UserError;
};

/// Exports the complete checkpoint `checkpoint_dir` (a run_dir/checkpoints/<step>/ with COMPLETE) to `out_dir`.
/// `out_dir` must not exist, be empty or hold an earlier bundle (replaced); anything else is refused.
/// Throws CheckpointRejected for the checkpoint's own faults, pi0::UserError naming the option at fault otherwise.
ExportReport export_bundle(const std::string& checkpoint_dir, const std::string& out_dir,
                           const ExportOptions& options = {});

/// pi0-export's --checkpoint: one complete checkpoint (exported as given, or refused), or a run directory, whose
/// newest checkpoint that verifies is exported: a newer one that does not is skipped with the same warnings as
/// pi0-train --resume gives (left untouched), and an error names the newest rejection if none verifies.
ExportReport export_run(const std::string& checkpoint_or_run_dir, const std::string& out_dir,
                        const ExportOptions& options = {});

/// A loaded bundle: the model (eval mode, on `device`, parameters and compute in `dtype`) and what its inputs need.
struct Bundle {
  std::string dir;
  /// model/data sections describe the model and its transforms; narrowed to the chosen dataset (config::for_dataset:
  /// data.dataset, data.norm_stats and checkpoint.asset_id are that dataset's)
  config::Config config;
  std::vector<std::string> assets;  ///< every dataset's asset id in the bundle, the default (first) one first
  /// Each asset's state and action dims (from its norm stats; -1 without them), in `assets` order, when the bundle
  /// holds several: what asset_hint() names.
  struct AssetDims {
    std::string id;
    int64_t state_dim = -1, action_dim = -1;
  };
  std::vector<AssetDims> asset_dims;
  bool asset_given = false;  ///< --asset named the asset (no hint then: the user chose)
  model::Pi0 model{nullptr};
  data::NormStats norm_stats;    ///< from assets/<asset_id>/norm_stats.json
  std::string tokenizer_path;    ///< <dir>/tokenizer.model
  /// A model trained with train.subtask: the tokenizer that encodes its subtask cue and decodes the subtask it
  /// predicts (infer::predict); null otherwise.
  std::shared_ptr<const data::Tokenizer> subtask_tokenizer;
  /// pi0-FAST (model.type pi0_fast): openpi's prompt layout and action extraction over the bundle's SentencePiece
  /// model and its fast_tokenizer/ folder; null otherwise.
  std::shared_ptr<const data::FastPromptTokenizer> fast_prompt;
  data::TransformOptions transform;  ///< resolved training transform options (norm mode, dims, prompt format)
  torch::ScalarType dtype = torch::kFloat32;  ///< parameter and compute dtype of the model
};

/// Loads `dir` (written by export_bundle). The model computes in `compute_dtype`; by default in the bundle's own
/// precision (bf16 for a bf16 bundle, else float32), on every device: the one rule of pi0-infer and pi0-serve, so
/// the server answers what pi0-infer answers. `asset` picks the dataset whose norm stats and robot settings the
/// bundle applies (pi0-infer / pi0-serve --asset; a model trained on a mixture holds one per dataset); empty = the
/// first. Throws pi0::UserError naming the missing or malformed file, or the unknown asset and the bundle's ones.
Bundle load_bundle(const std::string& dir, const torch::Device& device = torch::kCPU,
                   std::optional<torch::ScalarType> compute_dtype = std::nullopt, const std::string& asset = "");

/// For an error about dims on a bundle with several assets used without --asset (issue 49: the errors said
/// "recompute the norm stats" where `--asset trossen` was the fix): "; the bundle holds assets a (state 8, actions
/// 7), b (state 14, actions 14): <what> fit b; pick one with --asset NAME". `state_dim` / `min_action_dim` (-1 =
/// unknown) select the fitting assets: state dims equal, action dims at least. "" for a bundle of one asset or when
/// --asset was given.
std::string asset_hint(const Bundle& bundle, const std::string& what, int64_t state_dim, int64_t min_action_dim = -1);

/// The robot's action dims the bundle answers with: its norm stats' `actions` when it normalizes, else
/// model.action_dim. Also pi0-FAST's D (its FAST chunks were encoded unpadded, in the robot's dims).
int64_t action_dims(const Bundle& bundle);

/// The --dtype flag of pi0-infer and pi0-serve: "" → nullopt (the bundle's precision), bf16|bfloat16, f32|float32.
std::optional<torch::ScalarType> parse_compute_dtype(const std::string& flag_value);

}  // namespace pi0::io
