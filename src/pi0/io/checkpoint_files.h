// The files of a checkpoint directory (run_dir/checkpoints/<step>/) and of an exported bundle, named once: the
// trainer's save, restore and verification, pruning, the manifest, export and the bundle loader all use these
// names (docs/formats.md describes each file).
#pragma once

namespace pi0::io {

inline constexpr const char* kModelFile = "model.safetensors";  ///< weights, exact parameter names, LoRA included
/// Prefixes of the per-rank state files: <prefix>.safetensors, or <prefix>.rank<r>-of-<n>.safetensors pieces
/// under dist.shard (sharded_state.h, state_file_name).
inline constexpr const char* kOptimizerState = "optimizer";  ///< AdamW moments and step count
inline constexpr const char* kEmaState = "ema";              ///< EMA of the trainable parameters
inline constexpr const char* kLoraFile = "lora.safetensors";          ///< the LoRA factors alone (when present)
inline constexpr const char* kRngFile = "rng.safetensors";            ///< every rank's noise/time generator
inline constexpr const char* kTrainerStateFile = "trainer_state.json";  ///< step, world size, loader positions
inline constexpr const char* kConfigYamlFile = "config.yaml";         ///< the resolved config of the run
inline constexpr const char* kConfigJsonFile = "config.json";         ///< openpi's model config (bundles only)
inline constexpr const char* kTokenizerFile = "tokenizer.model";      ///< copy of data.tokenizer
/// pi0-FAST only: a copy of model.fast_tokenizer's folder (data::FastTokenizer::file_names()), so that a checkpoint
/// exports and a bundle samples without the original folder.
inline constexpr const char* kFastTokenizerDir = "fast_tokenizer";
inline constexpr const char* kAssetsDir = "assets";                   ///< assets/<asset_id>/norm_stats.json
inline constexpr const char* kNormStatsFile = "norm_stats.json";
inline constexpr const char* kBaseRefFile = "base_weights.json";  ///< small checkpoints: the frozen base referenced
inline constexpr const char* kManifestFile = "manifest.json";     ///< sizes and checksums of all the others
inline constexpr const char* kCompleteMarker = "COMPLETE";        ///< written last: the checkpoint is complete
/// A checkpoint being deleted by rotation: run_dir/checkpoints/.deleting_<step>/ (checkpoint_dir.h).
inline constexpr const char* kDeletingPrefix = ".deleting_";

}  // namespace pi0::io
