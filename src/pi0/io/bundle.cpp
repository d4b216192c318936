#include "pi0/io/bundle.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "pi0/common/check.h"
#include "pi0/common/interrupt.h"
#include "pi0/common/files.h"
#include "pi0/common/fs.h"
#include "pi0/common/strings.h"
#include "pi0/data/config_options.h"
#include "pi0/data/fast_prompt.h"
#include "pi0/data/fast_tokenizer.h"
#include "pi0/data/tokenizer.h"
#include "pi0/io/checkpoint_dir.h"
#include "pi0/io/checkpoint_files.h"
#include "pi0/io/manifest.h"
#include "pi0/io/model_weights.h"
#include "pi0/io/safetensors.h"
#include "pi0/io/sharded_state.h"
#include "pi0/model/model_config.h"
#include "pi0/nn/dense.h"
#include "pi0/nn/param_device.h"

namespace fs = pi0::posix_fs;

namespace pi0::io {
namespace {

// File names: checkpoint_files.h.
constexpr const char* kConfigYaml = kConfigYamlFile;
constexpr const char* kConfigJson = kConfigJsonFile;

void write_text(const fs::path& path, const std::string& text) { write_file_atomic(path.string(), text); }

// The expert without LoRA (what a merged export holds): "_lora" dropped from a name, rank 0 for explicit dims.
config::GemmaSpec strip_lora(config::GemmaSpec spec) {
  const std::string suffix = "_lora";
  auto& v = spec.variant;
  if (v.size() > suffix.size() && v.compare(v.size() - suffix.size(), suffix.size(), suffix) == 0)
    v = v.substr(0, v.size() - suffix.size());
  spec.lora_rank = 0;
  spec.lora_alpha = 0.0;
  return spec;
}

// A model part in config.json: the variant name, or the dimensions as an object.
nlohmann::json spec_json(const config::GemmaSpec& s) {
  if (s.is_named()) return s.variant;
  return {{"width", s.width}, {"depth", s.depth}, {"mlp_dim", s.mlp_dim}, {"num_heads", s.num_heads},
          {"num_kv_heads", s.num_kv_heads}, {"head_dim", s.head_dim}};
}

// The assets/<asset_id>/ folder of a checkpoint: the configured id, else the only folder there.
std::string find_asset_id(const fs::path& dir, const std::string& configured) {
  const fs::path assets = dir / kAssetsDir;
  if (fs::exists(assets / configured / kNormStatsFile)) return configured;
  std::vector<std::string> found;
  if (fs::is_directory(assets)) {
    for (const auto& e : fs::directory_iterator(assets))
      if (fs::exists(e.path() / kNormStatsFile)) found.push_back(e.path().filename().string());
  }
  if (found.size() == 1) return found[0];
  throw UserError((assets / configured / kNormStatsFile).string() +
                  ": missing; expected the norm stats of checkpoint.asset_id '" + configured + "' (found " +
                  std::to_string(found.size()) + " other assets/*/norm_stats.json)");
}

bool looks_like_bundle(const fs::path& dir) {
  return fs::exists(dir / kConfigJson) && fs::exists(dir / kModelFile) && fs::exists(dir / kConfigYaml);
}

// Moves the finished `tmp` to `out` (replacing an earlier bundle there) with renames only.
void install_dir(const fs::path& tmp, const fs::path& out) {
  if (!fs::exists(out)) {
    fs::rename(tmp, out);
    return;
  }
  const fs::path old = out.string() + ".old_" + std::to_string(::getpid());
  fs::remove_all(old);
  fs::rename(out, old);
  fs::rename(tmp, out);
  fs::remove_all(old);
}

// Verifies a checkpoint or bundle directory against its manifest.json (sizes, steps, checksums) and checks every
// floating-point tensor is finite; a directory from before manifests is only checked for finiteness, with a warning.
void verify_directory(const std::string& dir, const std::string& what) {
  const auto manifest = read_manifest(dir);
  if (manifest) {
    const auto name = fs::path(dir).filename().string();
    const bool numeric = !name.empty() && name.find_first_not_of("0123456789") == std::string::npos;
    if (manifest->step && numeric && std::to_string(*manifest->step) != name) {
      throw UserError((fs::path(dir) / kManifestFile).string() + ": is for step " + std::to_string(*manifest->step) +
                      ", but the checkpoint directory is step " + name);
    }
    check_manifest(dir, *manifest);
  } else {
    spdlog::warn("{}: no {} (a {} from before manifests): its contents cannot be verified", dir, kManifestFile, what);
  }
  verify_contents(dir, manifest);
}

// Runs `f`; a UserError (or a file-system error) from reading the checkpoint becomes CheckpointRejected, which
// export_run falls back past.
template <class F>
auto reading_checkpoint(F&& f) {
  try {
    return f();
  } catch (const CheckpointRejected&) {
    throw;
  } catch (const UserError& e) {
    throw CheckpointRejected(e.what());
  } catch (const std::system_error& e) {  // posix_fs (and std::filesystem) errors name the path in what()
    throw CheckpointRejected(std::string(e.what()));
  }
}

}  // namespace

ExportReport export_bundle(const std::string& checkpoint_dir, const std::string& out_dir,
                           const ExportOptions& options) {
  const fs::path ckpt(checkpoint_dir);
  if (options.dtype != torch::kBFloat16 && options.dtype != torch::kFloat32)
    throw UserError("--dtype: expected bf16 or float32");
  if (!options.weights.empty() && options.weights != "ema" && options.weights != "model")
    throw UserError("--weights: got '" + options.weights + "', expected ema or model");
  const fs::path out(out_dir);
  if (fs::exists(out) && !fs::is_empty(out) && !looks_like_bundle(out)) {
    throw UserError(out_dir + ": exists and is not an inference bundle; expected a new or empty directory");
  }
  std::vector<std::string> ema_files;
  config::Config cfg;
  std::string asset_id, base_path;
  std::vector<std::string> asset_ids;  // every dataset's, the first one the bundle's default
  std::optional<BaseWeightsRef> base_ref;
  std::string fast_tokenizer;  // pi0-FAST: the folder the bundle copies
  reading_checkpoint([&] {
    if (!fs::is_directory(ckpt)) throw UserError(checkpoint_dir + ": no such checkpoint directory");
    if (!fs::exists(ckpt / kCompleteMarker)) {
      throw UserError(checkpoint_dir + ": not a complete checkpoint (no " + kCompleteMarker +
                      " marker); pass a run directory or run_dir/checkpoints/<step>");
    }
    for (const char* f : {kModelFile, kConfigYaml, kTokenizerFile}) {
      if (!fs::exists(ckpt / f)) throw UserError((ckpt / f).string() + ": missing from the checkpoint");
    }
    verify_directory(checkpoint_dir, "checkpoint");
    // EMA weights: one file, or one per rank of a run with dist.shard (pieces of the same tensors).
    ema_files = state_files(checkpoint_dir, kEmaState);
    cfg = config::load_config((ckpt / kConfigYaml).string());
    for (const auto& entry : config::dataset_entries(cfg)) {
      if (entry.format != "lerobot" || entry.adapt_to_pi != "auto") continue;
      // pi0-train records the value its data resolved; only checkpoints from before that still say "auto".
      spdlog::warn("{}: data.dataset.adapt_to_pi is 'auto' for LeRobot data (a checkpoint from before pi0-train "
                   "recorded the resolved value), so the bundle applies no ALOHA conversion at inference; if that "
                   "data was ALOHA's (robot_type aloha or cam_high), resume the run and export a newer checkpoint",
                   (ckpt / kConfigYaml).string());
    }
    if (cfg.data.datasets.empty()) {
      asset_id = find_asset_id(ckpt, cfg.checkpoint.asset_id);
      asset_ids = {asset_id};
    } else {
      // A mixture: each dataset's stats under its own asset id, all of them carried into the bundle.
      for (const auto& entry : config::dataset_entries(cfg)) {
        if (!fs::exists(ckpt / kAssetsDir / entry.asset_id / kNormStatsFile)) {
          throw UserError((ckpt / kAssetsDir / entry.asset_id / kNormStatsFile).string() +
                          ": missing; expected the norm stats of dataset '" + entry.asset_id + "'");
        }
        asset_ids.push_back(entry.asset_id);
      }
      asset_id = asset_ids.front();
    }
    base_ref = read_base_ref(checkpoint_dir);
    base_path = options.base_weights.empty() && base_ref ? base_ref->path : options.base_weights;
    if (cfg.model.type == "pi0_fast") {
      // pi0-FAST decodes its actions through the FAST tokenizer: the bundle carries the checkpoint's copy (a
      // checkpoint written before pi0-train copied it falls back to model.fast_tokenizer's folder, if still there).
      fast_tokenizer = (ckpt / kFastTokenizerDir).string();
      if (!fs::exists(fast_tokenizer)) {
        if (!fs::exists(fs::path(cfg.model.fast_tokenizer) / "tokenizer.json"))
          throw UserError(fast_tokenizer + ": missing from this pi0-FAST checkpoint, and its model.fast_tokenizer '" +
                          cfg.model.fast_tokenizer + "' is gone too; expected the FAST tokenizer folder it trained with");
        spdlog::warn("{}: no {} (a checkpoint from before pi0-train copied it); the bundle takes model.fast_tokenizer "
                     "'{}'", checkpoint_dir, kFastTokenizerDir, cfg.model.fast_tokenizer);
        fast_tokenizer = cfg.model.fast_tokenizer;
      }
      data::FastTokenizer check(fast_tokenizer);  // a bundle that could not load is not written
    }
  });
  if (base_ref && !fs::exists(base_path)) {
    throw UserError((ckpt / kBaseRefFile).string() + ": the base weights '" + base_path + "' this checkpoint builds " +
                    "on do not exist; if they moved, point at the new location with --base-weights NEW_PATH");
  }
  const bool has_ema = !ema_files.empty();
  std::string weights = options.weights;
  if (weights.empty()) {
    weights = has_ema ? "ema" : "model";
    if (!has_ema) spdlog::info("{}: no {} (trained with train.ema_decay=0); exporting the model weights", checkpoint_dir,
                             state_file_name(kEmaState, 0, 1));
  } else if (weights == "ema" && !has_ema) {
    throw UserError((ckpt / state_file_name(kEmaState, 0, 1)).string() + ": missing, so --weights ema is impossible (use --weights model)");
  }
  // Built uninitialized: every value comes from the files. For a bf16 export, a parameter the files store in
  // bf16 (frozen weights of a bf16-mixed run) stays bf16, so the float32 model never exists in full; merging LoRA
  // into it computes in float32 and rounds once, as before.
  model::Pi0 model{nullptr};
  reading_checkpoint([&] {
    {
      nn::SkipInitScope skip;
      model = model::Pi0(model::options_from_config(cfg.model));
    }
    if (options.dtype == torch::kBFloat16) {
      // What the checkpoint holds keeps its stored dtype; what a small checkpoint takes from its base is bf16 when
      // the run kept its frozen weights in bf16 (they are rounded to it on load anyway), whatever the base stores.
      SafetensorsFile own((ckpt / kModelFile).string());
      std::optional<SafetensorsFile> base_file;
      if (base_ref) base_file.emplace(base_path);
      const bool base_bf16 = base_ref && base_ref->frozen_dtype == "BF16";
      auto base_dtype = [&](const std::string& name) -> std::optional<torch::ScalarType> {
        if (!base_file) return std::nullopt;
        for (const auto& n : {name, "model." + name}) {
          if (base_file->contains(n)) return base_file->info(n).scalar_type;
        }
        if (name == model::kEmbeddingName) {
          for (const auto& n : {kLmHeadName, "model." + kLmHeadName})
            if (base_file->contains(n)) return base_file->info(n).scalar_type;
        }
        return std::nullopt;
      };
      torch::NoGradGuard no_grad;
      for (auto& item : model->named_parameters()) {
        auto& p = item.value();
        std::optional<torch::ScalarType> stored;
        if (own.contains(item.key())) stored = own.info(item.key()).scalar_type;
        else if (auto b = base_dtype(item.key())) stored = base_bf16 ? torch::kBFloat16 : *b;
        if (stored == torch::kBFloat16 && p.scalar_type() != torch::kBFloat16)
          p.set_data(torch::empty(p.sizes(), p.options().dtype(torch::kBFloat16)));
      }
    }
    load_checkpoint_weights(*model, checkpoint_dir, options.base_weights, "--base-weights NEW_PATH");
    if (weights == "ema") {
      // EMA covers the trainable parameters only; the rest stay from model.safetensors. Read tensor by tensor
      // (converted to the parameter's dtype on the way), stitched together from the ranks' pieces if sharded.
      StateReader ema(ema_files);
      std::map<std::string, torch::Tensor> params;
      for (auto& item : model->named_parameters()) params.emplace(item.key(), item.value());
      std::vector<StateReader::Request> requests;
      for (const auto& [name, numel] : ema.numels()) {
        const auto it = params.find(name);
        if (it == params.end()) {
          throw UserError(ema.describe() + ": tensor '" + name + "' is not a parameter of the model in " +
                          (ckpt / kConfigYaml).string());
        }
        if (it->second.numel() != numel) {
          throw UserError(ema.describe() + ": tensor '" + name + "' has " + std::to_string(numel) +
                          " elements, but the parameter has " + std::to_string(it->second.numel()));
        }
        requests.push_back({name, 0, it->second.data()});
      }
      ema.read(requests, /*exact_dtype=*/false);
      spdlog::info("overlaid {} EMA tensors from {}", requests.size(), ema.describe());
    }
  });
  ExportReport rep;
  rep.checkpoint_dir = checkpoint_dir;
  rep.out_dir = out_dir;
  rep.weights = weights;
  rep.lora_layers_merged = nn::merge_all_lora(*model);

  // The bundle's config describes the merged model (no LoRA factors) and points at the bundle's own files.
  config::Config bundle_cfg = cfg;
  bundle_cfg.model.paligemma_variant = strip_lora(cfg.model.paligemma_variant);
  bundle_cfg.model.action_expert_variant = strip_lora(cfg.model.action_expert_variant);
  bundle_cfg.data.norm_stats = std::string(kAssetsDir) + "/" + asset_id + "/" + kNormStatsFile;
  bundle_cfg.data.tokenizer = kTokenizerFile;
  if (!fast_tokenizer.empty()) bundle_cfg.model.fast_tokenizer = kFastTokenizerDir;
  bundle_cfg.checkpoint.asset_id = asset_id;
  for (size_t i = 0; i < bundle_cfg.data.datasets.size(); ++i) {
    auto& entry = bundle_cfg.data.datasets[i];
    entry.asset_id = asset_ids[i];
    entry.norm_stats = std::string(kAssetsDir) + "/" + asset_ids[i] + "/" + kNormStatsFile;
  }

  // The bundle is written next to --out and renamed into place; errors name --out, not that temporary folder.
  const std::string out_what = "--out '" + out_dir + "'";
  const fs::path out_parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  create_directories_or_throw(out_parent.string(), out_what + ": parent directory");
  if (::access(out_parent.c_str(), W_OK) != 0) {
    throw UserError(out_what + ": cannot write in '" + out_parent.string() + "' (" + errno_reason(errno) + ")");
  }
  const fs::path tmp = out.string() + ".tmp_" + std::to_string(::getpid());
  fs::remove_all(tmp);
  try {
    for (const auto& id : asset_ids) create_directories_or_throw((tmp / kAssetsDir / id).string(), "");
    SaveOptions so;
    so.dtype = options.dtype;
    so.openpi_layout = true;
    so.include_lora = false;
    uint64_t next_report = 2ull << 30;
    so.progress = [&](uint64_t done, uint64_t total) {
      if (done >= next_report && done < total) {
        spdlog::info("writing {}: {:.1f}/{:.1f} GB", kModelFile, done / 1e9, total / 1e9);
        while (next_report <= done) next_report += 2ull << 30;
      }
    };
    const auto model_digest = save_model_weights(*model, (tmp / kModelFile).string(), so);
    rep.num_tensors = static_cast<int64_t>(SafetensorsFile((tmp / kModelFile).string()).size());
    const auto& o = model->options();
    nlohmann::json cj = {{"action_dim", o.action_dim},
                         {"action_horizon", o.action_horizon},
                         {"paligemma_variant", spec_json(bundle_cfg.model.paligemma_variant)},
                         {"action_expert_variant", spec_json(bundle_cfg.model.action_expert_variant)},
                         {"precision", options.dtype == torch::kBFloat16 ? "bfloat16" : "float32"},
                         {"pi05", o.pi05},
                         {"model_type", cfg.model.type},
                         // the default robot profile's (the first dataset's; --asset picks another)
                         {"adapt_to_pi", config::for_dataset(bundle_cfg, 0).data.dataset.adapt_to_pi_enabled()},
                         {"max_token_len", o.max_token_len},
                         {"image_size", o.siglip.image_size},
                         {"asset_id", asset_id},
                         {"assets", asset_ids},
                         {"tokenizer", kTokenizerFile},
                         {"weights", weights},
                         {"source_checkpoint", fs::absolute(ckpt).lexically_normal().string()}};
    write_text(tmp / kConfigJson, cj.dump(2) + "\n");
    write_text(tmp / kConfigYaml, YAML::Dump(config::to_yaml(bundle_cfg)) + "\n");
    for (const auto& id : asset_ids)
      fs::copy_file(ckpt / kAssetsDir / id / kNormStatsFile, tmp / kAssetsDir / id / kNormStatsFile);
    fs::copy_file(ckpt / kTokenizerFile, tmp / kTokenizerFile);
    if (!fast_tokenizer.empty())
      copy_fast_tokenizer(fast_tokenizer, (tmp / kFastTokenizerDir).string(), checkpoint_dir);
    write_manifest(tmp.string(), std::nullopt, {{kModelFile, model_digest}});  // pi0-infer verifies against it
    install_dir(tmp, out);
  } catch (const UserError& e) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw UserError(out_what + ": cannot write the bundle (" + e.what() + ")");
  } catch (const std::system_error& e) {  // posix_fs errors (and std::filesystem's) carry errno
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw UserError(out_what + ": cannot write the bundle (" + errno_reason(e.code().value()) + ")");
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  spdlog::info("exported {} ({} weights, {} LoRA layers merged, {} tensors, {}) to {}", checkpoint_dir, weights,
               rep.lora_layers_merged, rep.num_tensors, options.dtype == torch::kBFloat16 ? "bf16" : "float32",
               out_dir);
  return rep;
}

ExportReport export_run(const std::string& path, const std::string& out_dir, const ExportOptions& options) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    throw UserError("--checkpoint: '" + path + "' is not a directory" + (ec ? " (" + errno_reason(ec.value()) + ")" : ""));
  }
  if (fs::exists(fs::path(path) / kCompleteMarker, ec)) return export_bundle(path, out_dir, options);
  const auto steps = complete_checkpoints(path);
  if (steps.empty()) {
    throw UserError("--checkpoint: '" + path + "' is neither a complete checkpoint (no " + kCompleteMarker +
                    ") nor a run directory with complete checkpoints in " + checkpoints_dir(path));
  }
  // Newest first, past the ones that do not verify, as pi0-train --resume does (with the same warnings).
  std::string newest_rejection;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const auto dir = checkpoint_path(path, *it);
    if (it == steps.rbegin()) spdlog::info("{}: newest complete checkpoint is step {} ({})", path, *it, dir);
    else spdlog::warn("falling back to {}", dir);
    try {
      return export_bundle(dir, out_dir, options);
    } catch (const CheckpointRejected& e) {
      if (newest_rejection.empty()) newest_rejection = e.what();
      spdlog::warn("checkpoint {} does not verify and is skipped (left untouched): {}", dir, printable(e.what()));
    }
  }
  throw UserError("--checkpoint: '" + path + "': none of its " + std::to_string(steps.size()) +
                  " complete checkpoints verifies (newest: " + newest_rejection + "; any others are named in warnings " +
                  "above); restore one from a backup, or export one with --checkpoint " +
                  checkpoints_dir(path) + "/<step> to see why");
}

Bundle load_bundle(const std::string& dir, const torch::Device& device,
                   std::optional<torch::ScalarType> compute_dtype, const std::string& asset) {
  const fs::path d(dir);
  if (!fs::is_directory(d)) throw UserError(dir + ": no such bundle directory");
  for (const char* f : {kModelFile, kConfigYaml, kTokenizerFile}) {
    if (!fs::exists(d / f)) throw UserError((d / f).string() + ": missing; expected a bundle written by pi0-export");
  }
  verify_directory(dir, "bundle");
  Bundle b;
  b.dir = dir;
  {
    // The robot profile: one dataset's stats and data settings (a mixture's first unless --asset names another).
    const auto cfg = config::load_config((d / kConfigYaml).string());
    const auto entries = config::dataset_entries(cfg);
    size_t chosen = 0;
    std::string ids;
    for (size_t i = 0; i < entries.size(); ++i) {
      ids += (i ? ", " : "") + entries[i].asset_id;
      if (entries[i].asset_id == asset) chosen = i;
    }
    if (!asset.empty() && entries[chosen].asset_id != asset) {
      throw UserError("--asset '" + asset + "': not in the bundle " + dir + " (its assets: " + ids + ")");
    }
    b.config = config::for_dataset(cfg, chosen);
    for (const auto& e : entries) b.assets.push_back(e.asset_id);
    b.asset_given = !asset.empty();
    if (entries.size() > 1) {
      for (size_t i = 0; i < entries.size(); ++i) {
        Bundle::AssetDims dims{entries[i].asset_id};
        const fs::path p = d / config::for_dataset(cfg, i).data.norm_stats;
        if (fs::exists(p)) {
          const auto stats = data::load_norm_stats(p.string());
          if (stats.keys.count("state")) dims.state_dim = static_cast<int64_t>(stats.at("state").mean.size());
          if (stats.keys.count("actions")) dims.action_dim = static_cast<int64_t>(stats.at("actions").mean.size());
        }
        b.asset_dims.push_back(dims);
      }
    }
  }
  const fs::path stats_path = d / b.config.data.norm_stats;
  b.transform = data::transform_options(b.config).resolved();
  if (b.transform.norm != "none") {
    if (!fs::exists(stats_path))
      throw UserError(stats_path.string() + ": missing; expected a bundle written by pi0-export");
    b.norm_stats = data::load_norm_stats(stats_path.string());
  }
  b.tokenizer_path = (d / kTokenizerFile).string();
  if (b.config.train.subtask.enabled) b.subtask_tokenizer = std::make_shared<const data::Tokenizer>(b.tokenizer_path);
  if (b.config.model.type == "pi0_fast") {
    // The prompt layout (state bins) and the action extraction of openpi's pi0-FAST, over the bundle's own copies.
    const fs::path folder = d / b.config.model.fast_tokenizer;
    std::shared_ptr<const data::FastTokenizer> fast;
    try {
      fast = std::make_shared<const data::FastTokenizer>(folder.string());
    } catch (const UserError& e) {
      throw UserError(std::string(e.what()) + " (the FAST tokenizer of pi0-FAST bundle " + dir + ")");
    }
    b.fast_prompt = std::make_shared<const data::FastPromptTokenizer>(
        std::make_shared<const data::Tokenizer>(b.tokenizer_path), std::move(fast));
  }
  {
    // Uninitialized, on the device, in the bundle's dtype: the weights are read straight into their final place.
    nn::ParamDeviceScope on_device(device);
    nn::SkipInitScope skip;
    b.model = model::Pi0(model::options_from_config(b.config.model));
  }
  // Compute at the bundle's precision unless asked otherwise.
  SafetensorsFile weights_file((d / kModelFile).string());
  if (weights_file.names().empty()) throw UserError(weights_file.path() + ": holds no tensors");
  // A bundle holds every tensor in the one dtype pi0-export wrote (config.json "precision"); anything else means
  // the file was altered, and converting it would compute with wrong weights.
  torch::ScalarType stored = weights_file.info(weights_file.names().front()).scalar_type;
  std::string stored_from = "the first tensor";
  if (fs::exists(d / kConfigJson)) {
    std::ifstream cj_in(d / kConfigJson);
    const auto cj = nlohmann::json::parse(cj_in, nullptr, /*allow_exceptions=*/false);
    const std::string precision = cj.is_object() ? cj.value("precision", std::string()) : std::string();
    if (precision == "bfloat16" || precision == "float32") {
      stored = precision == "bfloat16" ? torch::kBFloat16 : torch::kFloat32;
      stored_from = (d / kConfigJson).string() + " precision " + precision;
    }
  }
  for (const auto& n : weights_file.names()) {
    const auto& info = weights_file.info(n);
    if (info.scalar_type != stored) {
      throw UserError(weights_file.path() + ": tensor '" + n + "' is stored as " + info.dtype + ", expected " +
                      *dtype_from_scalar_type(stored) + " like every tensor of a bundle (from " + stored_from +
                      "): the file was altered; export the bundle again");
    }
  }
  const auto dtype = compute_dtype.value_or(stored == torch::kBFloat16 ? torch::kBFloat16 : torch::kFloat32);
  if (dtype == torch::kBFloat16) {
    torch::NoGradGuard no_grad;
    for (auto& p : b.model->parameters()) p.set_data(torch::empty(p.sizes(), p.options().dtype(torch::kBFloat16)));
    b.model->to(torch::kBFloat16);  // buffers
    b.model->set_compute_dtype(torch::kBFloat16);
  }
  b.dtype = dtype;
  // Tests only (docs/testing.md): held here until a stop arrives, which load_model_weights then acts on.
  test_pause_until_interrupt("bundle_load");
  load_model_weights(*b.model, (d / kModelFile).string());
  b.model->eval();
  return b;
}

std::string asset_hint(const Bundle& bundle, const std::string& what, int64_t state_dim, int64_t min_action_dim) {
  if (bundle.asset_dims.size() < 2 || bundle.asset_given) return "";
  std::string all, fit;
  for (const auto& a : bundle.asset_dims) {
    all += (all.empty() ? "" : ", ") + a.id + " (state " + std::to_string(a.state_dim) + ", actions " +
           std::to_string(a.action_dim) + ")";
    const bool ok = (state_dim < 0 || a.state_dim == state_dim) && (min_action_dim < 0 || a.action_dim >= min_action_dim);
    if (ok) fit += (fit.empty() ? "" : ", ") + a.id;
  }
  return "; the bundle holds assets " + all + " and used '" + bundle.config.checkpoint.asset_id + "' (its first): " +
         what + (fit.empty() ? " fit none of them" : " fit " + fit) + "; pick one with --asset NAME";
}

int64_t action_dims(const Bundle& bundle) {
  const bool normalized = bundle.transform.norm_mode() != data::NormMode::kNone;
  return normalized && bundle.norm_stats.keys.count("actions")
             ? static_cast<int64_t>(bundle.norm_stats.at("actions").mean.size())
             : bundle.config.model.action_dim;
}

std::optional<torch::ScalarType> parse_compute_dtype(const std::string& v) {
  if (v.empty()) return std::nullopt;
  if (v == "bf16" || v == "bfloat16") return torch::kBFloat16;
  if (v == "f32" || v == "float32") return torch::kFloat32;
  throw UserError("--dtype: got '" + v + "', expected bf16, bfloat16, f32 or float32");
}

}  // namespace pi0::io
