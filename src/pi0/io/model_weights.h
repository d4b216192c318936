// Model weights in openpi's PyTorch layout (safetensors): loading released openpi / LeRobot checkpoints by
// name, and writing files openpi's PyTorch model loads (`safetensors.torch.load_model`, strict).
//
// Storage quirks handled here (openpi-reference §4.2):
//  - the token embedding is tied: files store it under `paligemma_with_expert.paligemma.lm_head.weight` or
//    `...language_model.embed_tokens.weight` (the other name possibly as a `__metadata__` alias);
//  - `paligemma_with_expert.gemma_expert.lm_head.weight` is an unused tensor in openpi's state_dict: ignored on
//    load, written (zeros) on export because openpi's strict loader requires it;
//  - LeRobot prefixes every name with `model.`.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pi0/io/checkpoint_files.h"
#include "pi0/io/checksum.h"
#include "pi0/model/param_layout.h"
#include "pi0/model/pi0.h"

namespace pi0::io {

inline const std::string kLmHeadName = "paligemma_with_expert.paligemma.lm_head.weight";
inline const std::string kExpertLmHeadName = "paligemma_with_expert.gemma_expert.lm_head.weight";

struct LoadOptions {
  /// Any missing, unexpected or shape-mismatched tensor is an error (one message listing all of them).
  bool strict = true;
  /// Keep the freshly initialized action/state projections when their shape differs from the file (a
  /// different action_dim than the pretrained model); each is named in a warning.
  bool reinit_mismatched_projections = false;
  /// Every tensor must have exactly its parameter's dtype (our own training checkpoints: they hold what the trainer
  /// wrote, so any other dtype means the file was altered). Otherwise floating-point tensors convert to the
  /// parameter's dtype; an integer or bool tensor never fills a floating-point parameter either way.
  bool exact_dtypes = false;
};

struct LoadReport {
  std::vector<std::string> loaded;       ///< model parameter names filled from the file
  std::vector<std::string> missing;      ///< model parameters absent from the file (kept as initialized)
  std::vector<std::string> unexpected;   ///< file tensors with no model parameter
  std::vector<std::string> reinitialized;  ///< projections kept at init because their shape differed
};

/// Loads `path` into `model` by name, converting dtypes to each parameter's. LoRA factors absent from the file
/// keep their initialization (a base checkpoint has none). Throws pi0::UserError naming the file and tensors.
LoadReport load_model_weights(model::Pi0Impl& model, const std::string& path, const LoadOptions& options = {});

/// Loads a name → tensor map (e.g. EMA or LoRA state) into the model's parameters; same rules as above.
LoadReport load_named_weights(model::Pi0Impl& model, const std::map<std::string, torch::Tensor>& tensors,
                              const std::string& source, const LoadOptions& options = {});

struct SaveOptions {
  std::optional<torch::ScalarType> dtype;  ///< convert every tensor (bf16 or f32 exports); default: as stored
  /// openpi layout: embedding stored once under lm_head with the embed_tokens alias in metadata, plus the dummy
  /// expert lm_head, so openpi's PyTorch model loads the file strictly.
  bool openpi_layout = true;
  bool include_lora = false;  ///< write LoRA factors (training checkpoints); exports merge them instead
  /// When set, only parameters it accepts are written (small checkpoints: what trains, not the frozen base).
  std::function<bool(const std::string&)> include;
  /// Called with (bytes written, total bytes) after each tensor (progress lines for multi-GB files).
  std::function<void(uint64_t, uint64_t)> progress;
  /// Extra __metadata__ entries (training checkpoints: {"step": "N"}).
  std::map<std::string, std::string> metadata;
};

/// Names and shapes of an openpi-layout export of a model with `options` (no LoRA), computed without allocating:
/// the model's layout with the embedding under lm_head, plus the unused expert lm_head.
std::vector<model::ParamSpec> export_layout(const model::Pi0Options& options);

/// Writes the model's parameters (optionally overridden by `replace`, e.g. EMA weights) to `path` atomically.
/// Streams: each tensor is converted (SaveOptions::dtype) only when written, so the peak is the model plus one
/// converted tensor. Returns the file's digest (for manifests).
FileDigest save_model_weights(model::Pi0Impl& model, const std::string& path, const SaveOptions& options = {},
                        const std::map<std::string, torch::Tensor>* replace = nullptr);

/// Gives every parameter of `model` that `path` provides (same name resolution as load_model_weights) the dtype
/// the file stores it in, when `accept(name, file dtype)` says so, as new *uninitialized* storage: for a model
/// built under nn::SkipInitScope that is about to be loaded, so e.g. a bf16 base model is never materialized in
/// float32. Returns the number of parameters changed.
int64_t adopt_file_dtypes(model::Pi0Impl& model, const std::string& path,
                          const std::function<bool(const std::string&, torch::ScalarType)>& accept);

// ---- Small checkpoints of partial fine-tunes -------------------------------------------------------------------
// A checkpoint of a run whose frozen weights come unchanged from checkpoint.init_weights stores only the rest
// (model.safetensors holds what trains plus anything not taken from the base) and base_weights.json naming the
// base file: {"path", "size", "checksum", "checksum_algorithm": "xxh3_64"} (checksum.h). Loading reads the base
// first, then the checkpoint. References written before XXH3 (another algorithm) are accepted on size alone, with
// a warning that the base cannot be verified.

struct BaseWeightsRef {
  std::string path;      ///< absolute path of the base model.safetensors
  uint64_t size = 0;     ///< its size in bytes
  std::string checksum;  ///< XXH3 of it (digest_file); empty for a reference from before XXH3 (not verifiable)
  /// The dtype the run keeps its frozen weights in ("BF16" in bf16 / bf16-mixed runs; "" = as in the file). The
  /// base is rounded to it when loaded into a wider parameter (export to float32), so a small checkpoint gives
  /// exactly the weights the run trained with, as a self-contained one does.
  std::string frozen_dtype;
};

/// The reference for `path` (size and checksum computed now; reads the whole file once).
BaseWeightsRef make_base_ref(const std::string& path);
void write_base_ref(const std::string& checkpoint_dir, const BaseWeightsRef& ref);
/// The checkpoint's reference, or nullopt for a self-contained checkpoint. UserError if malformed.
std::optional<BaseWeightsRef> read_base_ref(const std::string& checkpoint_dir);

/// Fills `model` from the checkpoint directory: base weights first when the checkpoint references them (from
/// `base_override` when non-empty, else the recorded path; the size and checksum must match, else a UserError
/// saying which and how to point at the right file with `override_hint`), then the checkpoint's
/// model.safetensors (strict for self-contained checkpoints). `reinit_mismatched_projections` as in LoadOptions,
/// for the base; `exact_dtypes` as in LoadOptions, for the checkpoint's own file (the base is external weights).
/// Returns the base file used ("" for a self-contained checkpoint).
std::string load_checkpoint_weights(model::Pi0Impl& model, const std::string& checkpoint_dir,
                                    const std::string& base_override, const std::string& override_hint,
                                    bool reinit_mismatched_projections = false, bool exact_dtypes = false);

}  // namespace pi0::io
