// Run configuration: one struct per YAML section, layered defaults (here) → YAML file → --set overrides.
// Every field is listed exactly once, in the section's visit() with its YAML key and a one-line doc; the same
// list drives parsing (unknown keys rejected with a did-you-mean), dumping the resolved config, and the config
// reference in docs/config.md (a test keeps them in sync). No torch includes here.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "pi0/config/model_dims.h"

namespace pi0::config {

/// A Gemma expert in model.paligemma_variant / model.action_expert_variant: either a named variant (YAML scalar,
/// e.g. `gemma_300m`) or explicit dimensions (YAML map, e.g. `{width: 40, depth: 4, mlp_dim: 88, num_heads: 8,
/// num_kv_heads: 1, head_dim: 16}`) for experts that are no named variant. The dimensions and their keys:
/// GemmaDims (model_dims.h).
struct GemmaSpec : GemmaDims {
  std::string variant;  // named variant; empty when the dimensions are explicit

  GemmaSpec() = default;
  GemmaSpec(const char* name) : variant(name) {}  // NOLINT: a name reads naturally as a spec
  GemmaSpec(std::string name) : variant(std::move(name)) {}  // NOLINT
  bool is_named() const { return !variant.empty(); }
  /// The variant name, or the dimensions as "{width: 40, depth: 4, ...}" (for messages).
  std::string describe() const;
};

/// The SigLIP tower in model.siglip_variant: a named variant (`So400m/14`) or explicit dimensions
/// (`{width: 48, depth: 2, mlp_dim: 96, num_heads: 4, patch_size: 14}`; SiglipDims, model_dims.h).
struct SiglipSpec : SiglipDims {
  std::string variant;  // named variant; empty when the dimensions are explicit

  SiglipSpec() = default;
  SiglipSpec(const char* name) : variant(name) {}  // NOLINT
  SiglipSpec(std::string name) : variant(std::move(name)) {}  // NOLINT
  bool is_named() const { return !variant.empty(); }
  std::string describe() const;
};

struct ModelConfig {
  std::string type = "pi0";                          // pi0 | pi05 | pi0_fast
  GemmaSpec paligemma_variant = "gemma_2b";
  GemmaSpec action_expert_variant = "gemma_300m";
  SiglipSpec siglip_variant = "So400m/14";
  int64_t vocab_size = 257152;
  int64_t image_size = 224;
  int64_t action_dim = 32;
  int64_t action_horizon = 50;
  int64_t max_token_len = 0;  // 0 → 48 (pi0), 200 (pi05) or 250 (pi0_fast)
  std::string attention = "auto";
  /// pi0_fast: the FAST tokenizer folder (processor_config.json + tokenizer.json, docs/fast.md), e.g. "fast/".
  std::string fast_tokenizer;
  int64_t max_decoding_steps = 256;  ///< pi0_fast: tokens generated at most per inference (openpi's 256)
  double temperature = 0.0;          ///< pi0_fast: 0 = greedy decoding (openpi's default), else softmax(logits / T)

  template <class V>
  void visit(V& v) {
    v("type", type, "model family: pi0 (state token, action-time MLP), pi05 (adaRMS time conditioning) or pi0_fast "
                    "(PaliGemma alone predicts FAST action tokens, docs/pi0_fast.md)");
    v("paligemma_variant", paligemma_variant, "prefix Gemma: gemma_2b, gemma_2b_lora, dummy, or a map of dimensions (docs/config.md)");
    v("action_expert_variant", action_expert_variant, "action expert Gemma: gemma_300m, gemma_300m_lora, dummy, or a map of dimensions (docs/config.md)");
    v("siglip_variant", siglip_variant, "vision tower: So400m/14 (released models), small/14, tiny/14, or a map of dimensions");
    v("vocab_size", vocab_size, "rows of the token embedding (257152 for PaliGemma; smaller for tiny tokenizers)");
    v("image_size", image_size, "square image side fed to SigLIP, a multiple of the patch size (224)");
    v("action_dim", action_dim, "state and actions are zero-padded to this many dims (32)");
    v("action_horizon", action_horizon, "actions per chunk H (50)");
    v("max_token_len", max_token_len, "prompt tokens incl. padding; 0 = 48 for pi0, 200 for pi05, 250 for pi0_fast "
                                      "(whose tokens also hold the state and the FAST action tokens)");
    v("attention", attention, "joint attention: auto (SDPA on CUDA with LibTorch >= 2.1, else explicit), explicit (reference arithmetic) or sdpa");
    v("fast_tokenizer", fast_tokenizer, "pi0_fast only: FAST tokenizer folder (processor_config.json + "
                                        "tokenizer.json, docs/fast.md); its ids map into the PaliGemma vocabulary as "
                                        "openpi's pi0-FAST");
    v("max_decoding_steps", max_decoding_steps, "pi0_fast only: tokens generated at most per inference (256)");
    v("temperature", temperature, "pi0_fast only: sampling temperature at inference; 0 = greedy (openpi's default)");
  }
};

/// data.dataset: what to read. Also the first part of data::DatasetOptions, which extends it (data/dataset.h:
/// empty fields take the per-format defaults of DatasetOptions::resolved()).
struct DatasetConfig {
  /// "libero" (LIBERO / robomimic: data/demo_N/...), "aloha" (one episode per file) or "lerobot" (LeRobot dataset
  /// roots, v2.0/v2.1/v3.0; keys are LeRobot feature names).
  std::string format = "libero";
  /// Files, directories (every *.hdf5 / *.h5 inside) or glob patterns, e.g. "/data/libero_goal/*_demo.hdf5".
  /// lerobot: dataset root folders (holding meta/info.json), combined in order.
  std::vector<std::string> paths;
  /// Model camera slot (base_0_rgb, left_wrist_0_rgb, right_wrist_0_rgb) -> dataset image key.
  /// Defaults: libero {base_0_rgb: agentview_rgb, left_wrist_0_rgb: eye_in_hand_rgb};
  ///           aloha  {base_0_rgb: cam_high, left_wrist_0_rgb: cam_left_wrist, right_wrist_0_rgb: cam_right_wrist};
  ///           lerobot: openpi's LIBERO {base_0_rgb: image, left_wrist_0_rgb: wrist_image} or ALOHA
  ///           observation.images.{cam_high, cam_left_wrist, cam_right_wrist}, chosen from the dataset's features.
  /// Slots without a key (or whose key is absent from a file) get zero images and mask false.
  std::map<std::string, std::string> cameras;
  /// Low-dim keys concatenated into the state vector. Defaults: libero [ee_states, gripper_states] (8-d: eef pos,
  /// axis-angle, 2 finger joints, as openpi's LIBERO client); aloha [qpos] (14-d); lerobot [state] (openpi LIBERO)
  /// or [observation.state].
  std::vector<std::string> state_keys;
  /// Action key. Defaults: libero "actions" (7-d), aloha "action" (14-d), lerobot "actions" or "action".
  std::string action_key;
  /// Fixed prompt for every sample. Empty: libero reads data.attrs["problem_info"]["language_instruction"]
  /// (falling back to the file name); aloha files store no language, so aloha requires it; lerobot uses the frame's
  /// task (task_index → meta/tasks), as openpi's prompt_from_task.
  std::string prompt;
  /// openpi's adapt_to_pi (data/aloha.h): state and actions converted to pi0's joint and gripper convention on
  /// read, so everything downstream (delta actions, norm stats, training) sees them. "auto": true for aloha and
  /// ALOHA-like LeRobot datasets, false otherwise; "true" | "false".
  std::string adapt_to_pi = "auto";
  /// Rotate frames 180° on read. "auto": true for libero HDF5 (its frames are stored upside down and openpi
  /// trained on rotated ones), false for aloha and lerobot; "true" | "false".
  std::string flip_images = "auto";

  /// adapt_to_pi resolved against the format (auto → format == "aloha"). LeRobot data resolves auto from its
  /// features when it is opened, and pi0-train saves that value, so only configs from before then hold auto there.
  bool adapt_to_pi_enabled() const { return adapt_to_pi == "auto" ? format == "aloha" : adapt_to_pi == "true"; }

  template <class V>
  void visit(V& v) {
    v("format", format, "libero (HDF5, robomimic: one file, data/demo_N), aloha (HDF5, one file per episode) or "
                        "lerobot (v2.0/v2.1/v3.0)");
    v("paths", paths, "files or glob patterns of this dataset");
    v("cameras", cameras, "model camera slot (base_0_rgb, left_wrist_0_rgb, right_wrist_0_rgb) → dataset image key");
    v("state_keys", state_keys, "dataset keys concatenated into the state vector; empty = format default");
    v("action_key", action_key, "dataset key of the actions; empty = format default");
    v("prompt", prompt, "task instruction; empty = read from the file (e.g. LIBERO problem_info)");
    v("adapt_to_pi", adapt_to_pi,
      "ALOHA joint flips and gripper linear→angular as openpi trains (auto = on for aloha and ALOHA-like lerobot data)");
    v("flip_images", flip_images, "rotate frames 180° on read (auto = on for libero HDF5, whose frames are stored "
                                  "upside down; off for aloha and lerobot)");
  }
};

/// One entry of data.datasets: a dataset (every data.dataset key) with its share of the training samples, its own
/// normalization statistics and the asset id under which checkpoints and bundles keep them. Resolved entries (empty
/// norm_stats and asset_id filled in): dataset_entries().
struct DatasetEntry : DatasetConfig {
  double weight = 1.0;
  std::string norm_stats;
  std::string asset_id;
  std::vector<int64_t> validation_episodes;
  /// This entry's delta mask (its robot's: LIBERO 6×true + 1×false, ALOHA 6 + 1 + 6 + 1); empty = data.delta_action_mask.
  std::vector<bool> delta_action_mask;

  template <class V>
  void visit(V& v) {
    DatasetConfig::visit(v);
    visit_own(v);
  }
  /// The keys an entry has beyond data.dataset's.
  template <class V>
  void visit_own(V& v) {
    v("weight", weight, "share of the training samples: each is drawn from entry i with probability weight_i / the "
                        "sum of the weights");
    v("norm_stats", norm_stats, "this entry's norm_stats.json (pi0-norm-stats writes it); empty = data.norm_stats");
    v("asset_id", asset_id, "folder assets/<asset_id>/ of this entry's stats in checkpoints and bundles (pi0-infer "
                            "and pi0-serve --asset); empty = checkpoint.asset_id for the first entry, "
                            "<checkpoint.asset_id>_<i> for entry i");
    v("validation_episodes", validation_episodes, "episode indices (in the entry's order) held out for validation; "
                                                  "empty = data.validation_split's share");
    v("delta_action_mask", delta_action_mask, "this entry's delta mask (per action dim: true = delta w.r.t. the "
                                              "state), used by its transform, its norm stats and its asset in bundles; "
                                              "empty = data.delta_action_mask ([false] = absolute for this entry)");
  }
};

struct DataConfig {
  DatasetConfig dataset;
  std::vector<DatasetEntry> datasets;
  std::string norm_stats;  // norm_stats.json path
  double validation_split = 0.0;
  std::string tokenizer;   // sentencepiece model path
  std::vector<bool> delta_action_mask;
  bool discrete_state_input = true;
  bool augment = true;
  int64_t num_workers = 2;
  int64_t prefetch = 4;

  template <class V>
  void visit(V& v) {
    v.section("dataset", dataset);
    v("datasets", datasets, "a weighted mixture instead of data.dataset: a list of entries, each with data.dataset's "
                            "keys plus weight, norm_stats, asset_id, validation_episodes and delta_action_mask (docs/data.md)");
    v("norm_stats", norm_stats, "openpi norm_stats.json for state and actions (make it with pi0-norm-stats)");
    v("validation_split", validation_split, "fraction of each dataset's episodes held out of training for validation "
                                            "(chosen by train.seed); 0 = none. See train.val_interval");
    v("tokenizer", tokenizer, "sentencepiece model file (PaliGemma's for released checkpoints)");
    v("delta_action_mask", delta_action_mask, "per action dim: true = convert to delta w.r.t. the state; empty = off. "
                                              "A data.datasets entry's own delta_action_mask replaces it for that entry");
    v("discrete_state_input", discrete_state_input, "pi05: state as discretized text in the prompt (false: pi0 prompt, no state)");
    v("augment", augment, "training image augmentation (random crop, rotation, color jitter)");
    v("num_workers", num_workers, "loader worker threads");
    v("prefetch", prefetch, "batches queued ahead of the trainer");
  }
};

/// train.ki: knowledge insulation (pi0.5 paper, Driess et al. arXiv 2505.23705): the backbone learns from a
/// cross-entropy on FAST action tokens appended to the prefix, the action expert from flow matching through a
/// stop-gradient of the backbone's keys and values (docs/ki.md).
struct KiConfig {
  bool enabled = false;
  std::string fast_tokenizer;  ///< folder with processor_config.json + tokenizer.json (docs/fast.md)
  int64_t max_fast_tokens = 64;
  double ce_weight = 1.0;
  double flow_weight = 10.0;

  template <class V>
  void visit(V& v) {
    v("enabled", enabled, "knowledge insulation (model.type pi05 only): FAST action tokens after the prompt train the "
                          "backbone by cross-entropy, the action expert reads a stop-gradient of the backbone's keys "
                          "and values (docs/ki.md)");
    v("fast_tokenizer", fast_tokenizer, "FAST tokenizer folder (processor_config.json + tokenizer.json, docs/fast.md); "
                                        "its ids map into the PaliGemma vocabulary as openpi's pi0-FAST");
    v("max_fast_tokens", max_fast_tokens, "length of the FAST block (its FAST ids, openpi's separator token and "
                                          "EOS, right-padded); longer blocks are truncated (counted, warned once)");
    v("ce_weight", ce_weight, "weight of the FAST cross-entropy in the loss");
    v("flow_weight", flow_weight, "weight of the flow-matching loss (the paper's alpha: 10 in pi0.5 post-training)");
  }
};

/// train.subtask: subtask prediction (pi0.5 paper): a text block [cue; subtask; EOS] after the prompt, causal,
/// trained by cross-entropy through the tied embedding and read by the action expert (docs/subtask.md). At inference
/// the model first decodes the subtask greedily, then samples actions after it.
struct SubtaskConfig {
  bool enabled = false;
  std::string key;             ///< data source, e.g. "subtask_index" (lerobot column, HDF5 dataset or attribute)
  int64_t max_tokens = 32;     ///< T: cue + subtask text + EOS, right-padded
  double weight = 1.0;         ///< w_sub
  std::string cue = "Subtask: ";

  template <class V>
  void visit(V& v) {
    v("enabled", enabled, "subtask prediction (model.type pi05 only): a text block [cue; subtask; EOS] after the "
                          "prompt, trained by cross-entropy and seen by the action expert; inference decodes it "
                          "first (docs/subtask.md)");
    v("key", key, "where each frame's subtask text is: lerobot, a per-frame integer column indexing meta/tasks; "
                  "libero HDF5, a per-frame integer dataset under each demo indexing the JSON list in the demo's "
                  "(or data's) attribute of the same name, or a string attribute of the demo (one subtask per "
                  "episode); an empty text leaves the block all padding");
    v("max_tokens", max_tokens, "length of the subtask block (the cue's tokens, the text's and EOS, right-padded); "
                                "longer blocks are truncated (counted, warned once); also the decoding limit");
    v("weight", weight, "weight of the subtask cross-entropy in the loss");
    v("cue", cue, "text before the subtask (its tokens are fed, not predicted)");
  }
};

struct TrainConfig {
  int64_t num_steps = 30000;
  int64_t batch_size = 32;
  int64_t grad_accum_steps = 1;
  int64_t seed = 42;
  std::string device = "cpu";
  std::string precision = "bf16-mixed";
  /// "false" | "true" (recompute every transformer layer in backward) | "auto" (only as many layers as the memory
  /// plan says the micro-batch needs on the GPU; none on the CPU). YAML's true / false read as "true" / "false".
  std::string gradient_checkpointing = "false";
  bool weight_cast_cache = true;
  std::string offload = "none";
  std::string freeze = "full";
  std::vector<std::string> trainable_include, trainable_exclude;
  std::string lr_schedule = "cosine";
  int64_t lr_warmup_steps = 1000;
  double lr_peak = 2.5e-5;
  int64_t lr_decay_steps = 30000;
  double lr_end = 2.5e-6;
  double lr_timescale = 10000;  ///< rsqrt: steps after warmup at which the LR is peak / sqrt(2) (openpi's 1e4)
  double adam_b1 = 0.9, adam_b2 = 0.95, adam_eps = 1e-8;
  double weight_decay = 1e-10;
  double clip_grad_norm = 1.0;
  double ema_decay = 0.99;
  int64_t max_nonfinite_skips = 0;
  int64_t log_interval = 100;
  int64_t metrics_interval = 0;
  int64_t num_threads = 0;
  int64_t rtc_max_delay = 0;
  std::string rtc_delay_distribution = "uniform";
  double rtc_delay_exp_rate = 0.5;
  std::vector<std::string> loss_mask;
  int64_t val_interval = 0;
  int64_t val_samples = 64;
  bool tensorboard = false;
  KiConfig ki;
  SubtaskConfig subtask;

  template <class V>
  void visit(V& v) {
    v("num_steps", num_steps, "optimizer steps to train");
    v("batch_size", batch_size, "global batch per optimizer step = per-rank batch × world size × grad_accum_steps");
    v("grad_accum_steps", grad_accum_steps, "micro-batches accumulated per optimizer step");
    v("seed", seed, "seed of every random stream (init, noise, time, shuffling, augmentation)");
    v("device", device, "cpu, cuda or cuda:N (under torchrun the local rank picks the GPU)");
    v("precision", precision, "float32 | bf16-mixed (f32 master weights, bf16 matmuls) | bf16 (all bf16)");
    v("gradient_checkpointing", gradient_checkpointing, "false | true (recompute each transformer layer in backward to save memory) | auto (only as many layers as the memory plan says the micro-batch needs to fit the GPU; none on the CPU). See docs/memory.md");
    v("weight_cast_cache", weight_cast_cache, "bf16-mixed: cast float32 weights to bf16 once per step and reuse the copy in recomputation (costs 2 bytes per trainable weight during forward/backward)");
    v("offload", offload, "none | optimizer (float32 master weights, AdamW moments, EMA and gradient accumulation in host memory; only the compute-dtype weights on the device) | auto (optimizer when the memory plan does not fit the GPU without it). See docs/memory.md");
    v("freeze", freeze, "trainable preset: full, projection-only, +vision, +language, action-expert-only, freeze-vision, lora, lora-only");
    v("trainable_include", trainable_include, "regexes (full match on parameter names) made trainable on top of the preset");
    v("trainable_exclude", trainable_exclude, "regexes (full match on parameter names) frozen on top of the preset");
    v("lr_schedule", lr_schedule, "cosine (openpi's CosineDecaySchedule: warmup, cosine to lr_end at lr_decay_steps) | "
                                  "rsqrt (openpi's RsqrtDecaySchedule: warmup, then lr_peak / sqrt((lr_timescale + s) "
                                  "/ lr_timescale), s = steps since warmup) | constant (LeRobot's constant-with-warmup: "
                                  "linear from 0, then lr_peak)");
    v("lr_warmup_steps", lr_warmup_steps, "linear warmup steps (cosine, rsqrt: from lr_peak / (lr_warmup_steps + 1); "
                                          "constant: from 0)");
    v("lr_peak", lr_peak, "learning rate at the end of warmup");
    v("lr_decay_steps", lr_decay_steps, "cosine: step (counted from 0) where the cosine reaches lr_end");
    v("lr_end", lr_end, "cosine: final learning rate");
    v("lr_timescale", lr_timescale, "rsqrt: decay timescale in steps (the LR halves lr_timescale·3 steps after warmup)");
    v("adam_b1", adam_b1, "AdamW beta1");
    v("adam_b2", adam_b2, "AdamW beta2");
    v("adam_eps", adam_eps, "AdamW epsilon");
    v("weight_decay", weight_decay, "decoupled weight decay on all trainable parameters");
    v("clip_grad_norm", clip_grad_norm, "global gradient-norm clipping threshold; 0 = off");
    v("ema_decay", ema_decay, "EMA decay of the weights; 0 = no EMA");
    v("max_nonfinite_skips", max_nonfinite_skips, "optimizer steps with a non-finite loss/grad norm that may be skipped before the run stops");
    v("log_interval", log_interval, "steps between progress lines (and metrics records unless metrics_interval is set)");
    v("metrics_interval", metrics_interval, "steps between metrics.jsonl records, each the mean over its steps; 0 = log_interval");
    v("num_threads", num_threads, "CPU threads of ATen, OpenMP and the BLAS together; 0 = OMP_NUM_THREADS, else every CPU this process may use (affinity-aware)");
    v("rtc_max_delay", rtc_max_delay, "training-time real-time chunking: each example's first d actions (d drawn in 0..rtc_max_delay) enter clean (t = 0) and leave the loss, so the model learns to continue a committed prefix; serve with --rtc trained for delays up to this. 0 = off (openpi's training). See docs/serving.md");
    v("rtc_delay_distribution", rtc_delay_distribution, "how d is drawn when rtc_max_delay > 0: uniform (as LeRobot and OpenTau) | exp (P(d) proportional to exp(-rtc_delay_exp_rate * d): short delays more often)");
    v("rtc_delay_exp_rate", rtc_delay_exp_rate, "decay rate of rtc_delay_distribution: exp, per action step");
    v("loss_mask", loss_mask, "positions left out of the loss, opt-in (default: none, as openpi): episode_end (chunk "
                              "rows past the episode's last frame, which repeat its last action), action_padding (the "
                              "zero dims past the robot's own action dims)");
    v("val_interval", val_interval, "steps between validation passes (and one at the end) when data.validation_split "
                                    "or validation_episodes hold episodes out; 0 = checkpoint.save_interval");
    v("val_samples", val_samples, "held-out samples each validation pass evaluates (spread evenly over the held-out "
                                  "frames, the same every pass); 0 = all");
    v("tensorboard", tensorboard, "also write TensorBoard event files (events.out.tfevents.*, a new one per start) "
                                  "into checkpoint.run_dir: every metrics.jsonl value at its step and the first "
                                  "batch's camera views at step 0; rank 0 only. See docs/formats.md");
    v.section("ki", ki);
    v.section("subtask", subtask);
  }
};

struct CheckpointConfig {
  std::string run_dir = "runs/default";
  int64_t save_interval = 1000;
  int64_t keep_last = 2;
  int64_t keep_period = 5000;
  int64_t keep_best = 0;
  std::string init_weights;
  bool reinit_mismatched_projections = false;
  std::string asset_id = "default";
  bool self_contained = false;
  std::string resume_policy = "newest_verified";

  template <class V>
  void visit(V& v) {
    v("run_dir", run_dir, "run directory: resolved config, metrics.jsonl, checkpoints/<step>/");
    v("save_interval", save_interval, "steps between checkpoints (a final one is always written)");
    v("keep_last", keep_last, "newest checkpoints kept");
    v("keep_period", keep_period, "checkpoints at multiples of this step are kept forever; 0 = none");
    v("keep_best", keep_best, "also keep the K checkpoints with the lowest val_loss (needs a validation split); 0 = "
                              "none");
    v("init_weights", init_weights, "openpi/LeRobot model.safetensors to start from (weights only); empty = random init");
    v("reinit_mismatched_projections", reinit_mismatched_projections, "re-initialize action/state projections whose shape differs from init_weights (different action_dim)");
    v("asset_id", asset_id, "name of the assets/<asset_id>/ folder holding norm_stats.json in exports");
    v("resume_policy", resume_policy, "which checkpoint --resume continues from: newest_verified (the newest whose manifest.json verifies; newer ones that fail are named in a warning, skipped and left untouched) or strict (the newest complete checkpoint must verify, else the run stops)");
    v("self_contained", self_contained, "true: every checkpoint holds all weights; false: a partial fine-tune from init_weights stores what trains plus a checksummed reference to init_weights");
  }
};

struct DistConfig {
  int64_t bucket_size_mb = 25;
  int64_t timeout_s = 300;
  std::string shard = "none";

  template <class V>
  void visit(V& v) {
    v("bucket_size_mb", bucket_size_mb, "gradient all-reduce bucket size in MB");
    v("timeout_s", timeout_s, "seconds before a collective waiting on a dead or hung rank fails the run");
    v("shard", shard, "what data-parallel ranks partition instead of replicating: none; optimizer (AdamW moments and EMA, ZeRO-1); gradients (also the gradients, ZeRO-2). See docs/distributed.md");
  }
};

struct ServeConfig {
  YAML::Node policy_metadata{YAML::NodeType::Map};  // any YAML map; resolved by config/policy_metadata.h

  template <class V>
  void visit(V& v) {
    v("policy_metadata", policy_metadata, "map sent to pi0-serve's clients with its metadata (openpi's policy_metadata), on top of the defaults of the data's robot: aloha data gets openpi's reset_pose [0, -1.5, 1.5, 0, 0, 0]; a key set to null removes a default (docs/serving.md)");
  }
};

struct Config {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  CheckpointConfig checkpoint;
  DistConfig dist;
  ServeConfig serve;

  template <class V>
  void visit(V& v) {
    v.section("model", model);
    v.section("data", data);
    v.section("train", train);
    v.section("checkpoint", checkpoint);
    v.section("dist", dist);
    v.section("serve", serve);
  }
};

/// Loads `path` (YAML), applies `overrides` ("section.key=value", value parsed as YAML), validates. Relative
/// paths inside the file stay relative to the working directory. Throws pi0::UserError naming the file/key.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
/// Same from YAML text (tests); `source` names it in messages.
Config parse_config(const YAML::Node& root, const std::string& source, const std::vector<std::string>& overrides = {});
/// Range and consistency checks; throws pi0::UserError ("train.batch_size must be > 0 (got 0)").
void validate(const Config& config);
/// Samples per rank per micro-step, what the loader builds per next(): train.batch_size / (world size ·
/// train.grad_accum_steps). Throws pi0::UserError naming both when it does not divide (validate() checks the
/// world-size-free part; the world size is known only at launch).
int64_t micro_batch_size(const TrainConfig& train, int64_t world_size);
/// The resolved config as YAML (round-trips through parse_config); numbers in their shortest round-trip form.
YAML::Node to_yaml(const Config& config);
/// The resolved config for a log: one YAML flow mapping per section ("train: {num_steps: 300, ...}"), wrapped at
/// 118 columns, no final line break; parses back to the same config.
std::string to_compact_text(const Config& config);
/// The datasets a run trains on, resolved: data.datasets, or data.dataset as the one entry (weight 1). An empty
/// norm_stats becomes data.norm_stats; an empty asset_id checkpoint.asset_id for entry 0, "<asset_id>_<i>" for entry i;
/// an empty delta_action_mask data.delta_action_mask.
std::vector<DatasetEntry> dataset_entries(const Config& config);
/// The key of entry i in messages: "data.dataset" for a single dataset, else "data.datasets[i]".
std::string dataset_key(const Config& config, size_t i);
/// `config` narrowed to entry i of dataset_entries(): data.dataset is that entry, data.datasets is empty, and
/// data.norm_stats, data.delta_action_mask and checkpoint.asset_id are the entry's. What per-dataset code (norm stats,
/// a bundle's robot profile, the transforms) reads.
Config for_dataset(const Config& config, size_t i);
/// The key entry i's delta mask comes from, for messages: "data.datasets[i].delta_action_mask" when the entry sets
/// its own, else "data.delta_action_mask".
std::string delta_action_mask_key(const Config& config, size_t i);
/// Whether any episodes are held out for validation (data.validation_split or an entry's validation_episodes).
bool validation_enabled(const Config& config);
/// train.val_interval resolved (0 → checkpoint.save_interval).
int64_t val_interval(const Config& config);
/// train.loss_mask as flags.
struct LossMask {
  bool episode_end = false;
  bool action_padding = false;
  bool any() const { return episode_end || action_padding; }
};
LossMask loss_mask(const TrainConfig& train);

/// Every key as (dotted key, default value as text, doc) in declaration order, for the reference docs.
std::vector<std::array<std::string, 3>> config_reference();


}  // namespace pi0::config
