#include "pi0/io/bundle.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "pi0/common/check.h"
#include "pi0/data/aloha.h"
#include "pi0/data/tokenizer.h"
#include "pi0/io/manifest.h"
#include "pi0/io/model_weights.h"
#include "pi0/io/safetensors.h"
#include "pi0/model/model_config.h"
#include "pi0/nn/dense.h"
#include "pi0/nn/param_device.h"
#include "pi0/train/checkpoint_dir.h"
#include "pi0/train/data_setup.h"

namespace fs = std::filesystem;

namespace pi0::io {
namespace {

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kEmaFile = "ema.safetensors";
constexpr const char* kConfigYaml = "config.yaml";
constexpr const char* kConfigJson = "config.json";
constexpr const char* kTokenizerFile = "tokenizer.model";

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.flush();
  if (!out) throw UserError(path.string() + ": cannot write file");
}

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
  const fs::path assets = dir / "assets";
  if (fs::exists(assets / configured / "norm_stats.json")) return configured;
  std::vector<std::string> found;
  if (fs::is_directory(assets)) {
    for (const auto& e : fs::directory_iterator(assets))
      if (fs::exists(e.path() / "norm_stats.json")) found.push_back(e.path().filename().string());
  }
  if (found.size() == 1) return found[0];
  throw UserError((assets / configured / "norm_stats.json").string() +
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

}  // namespace

ExportReport export_bundle(const std::string& checkpoint_dir, const std::string& out_dir,
                           const ExportOptions& options) {
  const fs::path ckpt(checkpoint_dir);
  if (!fs::is_directory(ckpt)) throw UserError(checkpoint_dir + ": no such checkpoint directory");
  if (!fs::exists(ckpt / train::kCompleteMarker)) {
    throw UserError(checkpoint_dir + ": not a complete checkpoint (no " + train::kCompleteMarker +
                    " marker); pass a run directory or run_dir/checkpoints/<step>");
  }
  for (const char* f : {kModelFile, kConfigYaml, kTokenizerFile}) {
    if (!fs::exists(ckpt / f)) throw UserError((ckpt / f).string() + ": missing from the checkpoint");
  }
  if (options.dtype != torch::kBFloat16 && options.dtype != torch::kFloat32)
    throw UserError("--dtype: expected bf16 or float32");
  verify_directory(checkpoint_dir, "checkpoint");
  const bool has_ema = fs::exists(ckpt / kEmaFile);
  std::string weights = options.weights;
  if (weights.empty()) {
    weights = has_ema ? "ema" : "model";
    if (!has_ema) spdlog::info("{}: no {} (trained with train.ema_decay=0); exporting the model weights", checkpoint_dir, kEmaFile);
  } else if (weights != "ema" && weights != "model") {
    throw UserError("--weights: got '" + weights + "', expected ema or model");
  } else if (weights == "ema" && !has_ema) {
    throw UserError((ckpt / kEmaFile).string() + ": missing, so --weights ema is impossible (use --weights model)");
  }
  const fs::path out(out_dir);
  if (fs::exists(out) && !fs::is_empty(out) && !looks_like_bundle(out)) {
    throw UserError(out_dir + ": exists and is not an inference bundle; expected a new or empty directory");
  }

  config::Config cfg = config::load_config((ckpt / kConfigYaml).string());
  const auto asset_id = find_asset_id(ckpt, cfg.checkpoint.asset_id);
  const auto base_ref = read_base_ref(checkpoint_dir);
  const std::string base_path = options.base_weights.empty() && base_ref ? base_ref->path : options.base_weights;
  if (base_ref && !fs::exists(base_path)) {
    throw UserError((ckpt / kBaseRefFile).string() + ": the base weights '" + base_path + "' this checkpoint builds " +
                    "on do not exist; if they moved, point at the new location with --base-weights NEW_PATH");
  }
  // Built uninitialized: every value comes from the files. For a bf16 export, a parameter the files store in
  // bf16 (frozen weights of a bf16-mixed run) stays bf16, so the float32 model never exists in full; merging LoRA
  // into it computes in float32 and rounds once, as before.
  model::Pi0 model{nullptr};
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
    SafetensorsFile ema((ckpt / kEmaFile).string());
    std::map<std::string, torch::Tensor> averages;
    for (const auto& n : ema.names()) averages[n] = ema.get(n);  // views of the mapping, copied one at a time
    LoadOptions lo;
    lo.strict = false;  // EMA covers the trainable parameters only; the rest stay from model.safetensors
    auto report = load_named_weights(*model, averages, ema.path(), lo);
    if (!report.unexpected.empty()) {
      throw UserError(ema.path() + ": tensor '" + report.unexpected.front() +
                      "' is not a parameter of the model in " + (ckpt / kConfigYaml).string());
    }
    spdlog::info("overlaid {} EMA tensors from {}", report.loaded.size(), ema.path());
  }
  ExportReport rep;
  rep.checkpoint_dir = checkpoint_dir;
  rep.out_dir = out_dir;
  rep.weights = weights;
  rep.lora_layers_merged = nn::merge_all_lora(*model);

  // The bundle's config describes the merged model (no LoRA factors) and points at the bundle's own files.
  config::Config bundle_cfg = cfg;
  bundle_cfg.model.paligemma_variant = strip_lora(cfg.model.paligemma_variant);
  bundle_cfg.model.action_expert_variant = strip_lora(cfg.model.action_expert_variant);
  bundle_cfg.data.norm_stats = "assets/" + asset_id + "/norm_stats.json";
  bundle_cfg.data.tokenizer = kTokenizerFile;
  bundle_cfg.checkpoint.asset_id = asset_id;

  const fs::path tmp = out.string() + ".tmp_" + std::to_string(::getpid());
  fs::remove_all(tmp);
  fs::create_directories(tmp / "assets" / asset_id);
  try {
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
                         {"adapt_to_pi", bundle_cfg.data.dataset.adapt_to_pi_enabled()},
                         {"max_token_len", o.max_token_len},
                         {"image_size", o.siglip.image_size},
                         {"asset_id", asset_id},
                         {"tokenizer", kTokenizerFile},
                         {"weights", weights},
                         {"source_checkpoint", fs::absolute(ckpt).lexically_normal().string()}};
    write_text(tmp / kConfigJson, cj.dump(2) + "\n");
    write_text(tmp / kConfigYaml, YAML::Dump(config::to_yaml(bundle_cfg)) + "\n");
    fs::copy_file(ckpt / "assets" / asset_id / "norm_stats.json", tmp / "assets" / asset_id / "norm_stats.json");
    fs::copy_file(ckpt / kTokenizerFile, tmp / kTokenizerFile);
    write_manifest(tmp.string(), std::nullopt, {{kModelFile, model_digest}});  // pi0-infer verifies against it
    install_dir(tmp, out);
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

Bundle load_bundle(const std::string& dir, const torch::Device& device,
                   std::optional<torch::ScalarType> compute_dtype) {
  const fs::path d(dir);
  if (!fs::is_directory(d)) throw UserError(dir + ": no such bundle directory");
  for (const char* f : {kModelFile, kConfigYaml, kTokenizerFile}) {
    if (!fs::exists(d / f)) throw UserError((d / f).string() + ": missing; expected a bundle written by pi0-export");
  }
  verify_directory(dir, "bundle");
  Bundle b;
  b.dir = dir;
  b.config = config::load_config((d / kConfigYaml).string());
  const fs::path stats_path = d / b.config.data.norm_stats;
  b.transform = train::transform_options(b.config).resolved();
  if (b.transform.norm != "none") {
    if (!fs::exists(stats_path))
      throw UserError(stats_path.string() + ": missing; expected a bundle written by pi0-export");
    b.norm_stats = data::load_norm_stats(stats_path.string());
  }
  b.tokenizer_path = (d / kTokenizerFile).string();
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
  load_model_weights(*b.model, (d / kModelFile).string());
  b.model->eval();
  return b;
}

namespace {

// "image/base_0_rgb" → slot index, or -1.
int camera_slot(const std::string& camera) {
  for (size_t i = 0; i < model::kCameraNames.size(); ++i)
    if (model::kCameraNames[i] == camera) return static_cast<int>(i);
  return -1;
}

std::string camera_list() {
  std::string s;
  for (const auto& c : model::kCameraNames) s += (s.empty() ? "" : ", ") + c;
  return s;
}

// One [H,W,3] image (uint8, or float in [-1,1]) → [3,S,S] float in [-1,1], as the training transform does.
torch::Tensor prepare_image(const torch::Tensor& hwc, int64_t size) {
  torch::Tensor u8;
  if (hwc.scalar_type() == torch::kUInt8) {
    u8 = hwc.contiguous();
  } else if (hwc.size(0) == size && hwc.size(1) == size) {
    return hwc.permute({2, 0, 1}).to(torch::kFloat32).contiguous();
  } else {
    // Resizing works on 8-bit images (like openpi's image_tools): quantize, then take the uint8 path.
    u8 = ((hwc.to(torch::kFloat32).clamp(-1, 1) + 1.0f) * 127.5f).round().to(torch::kUInt8).contiguous();
  }
  return data::image_to_float(data::resize_with_pad(u8, size));
}

}  // namespace

InferenceInputs make_inference_inputs(const Bundle& bundle, const std::map<std::string, torch::Tensor>& tensors,
                                      const std::string& source, const std::optional<std::string>& prompt,
                                      const data::Tokenizer* tokenizer) {
  const auto& t = bundle.transform;
  const int64_t S = t.image_size;
  const auto mode = t.norm_mode();
  auto get = [&](const std::string& key) -> torch::Tensor {
    auto it = tensors.find(key);
    return it == tensors.end() ? torch::Tensor() : it->second;
  };

  // State: [B,S] raw robot state.
  torch::Tensor state = get("state");
  if (!state.defined()) throw UserError(source + ": missing tensor 'state', expected the raw robot state [B,S]");
  if (state.dim() != 2 || !state.is_floating_point())
    throw UserError(source + ": 'state' has shape " + shape_str(state.sizes()) + " and dtype " +
                    std::string(c10::toString(state.scalar_type())) + ", expected a float [B,S] tensor");
  const int64_t B = state.size(0);
  if (B < 1) throw UserError(source + ": 'state' has batch size 0, expected >= 1");
  if (state.size(1) > t.action_dim)
    throw UserError(source + ": 'state' has " + std::to_string(state.size(1)) + " dims, expected <= the model's action_dim " +
                    std::to_string(t.action_dim));
  InferenceInputs in;
  in.raw_state = state.to(torch::kFloat32).contiguous();
  if (bundle.config.data.dataset.adapt_to_pi_enabled())
    in.raw_state = data::aloha_state_to_pi(in.raw_state, source + ": 'state' (the bundle was trained with adapt_to_pi)");
  const std::string stats_src = bundle.norm_stats.source.empty() ? "norm stats" : bundle.norm_stats.source;
  torch::Tensor norm_state =
      mode == data::NormMode::kNone
          ? in.raw_state
          : data::normalize(in.raw_state, bundle.norm_stats.at("state"), mode, stats_src + ": key norm_stats.state");
  auto& obs = in.observation;
  obs.state = data::pad_last_dim(norm_state, t.action_dim).to(torch::kFloat32).contiguous();

  // Keys this function understands; anything else under image/ or image_mask/ is a typo.
  for (const auto& [key, value] : tensors) {
    for (const std::string prefix : {"image/", "image_mask/"}) {
      if (key.rfind(prefix, 0) == 0 && camera_slot(key.substr(prefix.size())) < 0)
        throw UserError(source + ": unknown camera in '" + key + "', expected one of " + camera_list());
    }
  }
  bool any_image = false;
  for (size_t slot = 0; slot < model::kCameraNames.size(); ++slot) {
    const std::string cam = model::kCameraNames[slot];
    torch::Tensor img = get("image/" + cam), mask = get("image_mask/" + cam);
    if (!img.defined()) {
      if (mask.defined()) throw UserError(source + ": 'image_mask/" + cam + "' given without 'image/" + cam + "'");
      obs.images.push_back(torch::full({B, 3, S, S}, -1.0f));
      obs.image_masks.push_back(torch::zeros({B}, torch::kBool));
      continue;
    }
    any_image = true;
    if (img.dim() != 4 || img.size(0) != B || img.size(3) != 3 || img.size(1) < 1 || img.size(2) < 1)
      throw UserError(source + ": 'image/" + cam + "' has shape " + shape_str(img.sizes()) + ", expected [B,H,W,3] with B = " +
                      std::to_string(B) + " (channels last, RGB)");
    if (img.scalar_type() != torch::kUInt8 && !img.is_floating_point())
      throw UserError(source + ": 'image/" + cam + "' has dtype " + std::string(c10::toString(img.scalar_type())) +
                      ", expected uint8 or float in [-1,1]");
    if (img.is_floating_point()) {
      const double lo = img.min().item<double>(), hi = img.max().item<double>();
      if (lo < -1.0 - 1e-3 || hi > 1.0 + 1e-3)
        throw UserError(source + ": 'image/" + cam + "' has values in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                        "], expected float images in [-1,1] (or pass uint8)");
    }
    std::vector<torch::Tensor> per;
    for (int64_t b = 0; b < B; ++b) per.push_back(prepare_image(img[b], S));
    obs.images.push_back(torch::stack(per));
    if (mask.defined()) {
      if (mask.dim() != 1 || mask.size(0) != B)
        throw UserError(source + ": 'image_mask/" + cam + "' has shape " + shape_str(mask.sizes()) + ", expected [" +
                        std::to_string(B) + "] bool");
      obs.image_masks.push_back(mask.to(torch::kBool));
    } else {
      obs.image_masks.push_back(torch::ones({B}, torch::kBool));
    }
  }
  if (!any_image) throw UserError(source + ": no 'image/<camera>' tensor, expected at least one of " + camera_list());

  // Prompt: given as text (tokenized here like the training transform) or as tokens.
  torch::Tensor tokens = get("tokenized_prompt"), token_mask = get("tokenized_prompt_mask");
  if (prompt) {
    if (tokens.defined())
      throw UserError(source + ": holds 'tokenized_prompt' and --prompt was given; expected one of the two");
    PI0_CHECK(tokenizer != nullptr, "make_inference_inputs: --prompt needs a tokenizer");
    const bool discrete_state = t.model_type == "pi05" && t.discrete_state_input;
    std::vector<torch::Tensor> tok, msk;
    for (int64_t b = 0; b < B; ++b) {
      auto tp = tokenizer->tokenize(*prompt, t.max_token_len, discrete_state ? norm_state[b] : torch::Tensor());
      tok.push_back(tp.tokens);
      msk.push_back(tp.mask);
    }
    obs.tokenized_prompt = torch::stack(tok);
    obs.tokenized_prompt_mask = torch::stack(msk);
  } else {
    if (!tokens.defined())
      throw UserError(source + ": missing 'tokenized_prompt' [B,L] and no --prompt given; expected one of the two");
    if (tokens.dim() != 2 || tokens.size(0) != B || tokens.is_floating_point() || tokens.scalar_type() == torch::kBool)
      throw UserError(source + ": 'tokenized_prompt' has shape " + shape_str(tokens.sizes()) + " and dtype " +
                      std::string(c10::toString(tokens.scalar_type())) + ", expected integer [" + std::to_string(B) + ",L]");
    if (!token_mask.defined() || token_mask.sizes() != tokens.sizes())
      throw UserError(source + ": 'tokenized_prompt_mask' is " +
                      (token_mask.defined() ? "of shape " + shape_str(token_mask.sizes()) : std::string("missing")) +
                      ", expected bool of the tokens' shape " + shape_str(tokens.sizes()));
    const int64_t vocab = bundle.config.model.vocab_size;
    if (tokens.numel() > 0 && (tokens.min().item<int64_t>() < 0 || tokens.max().item<int64_t>() >= vocab))
      throw UserError(source + ": 'tokenized_prompt' holds ids outside [0, " + std::to_string(vocab) +
                      "), expected ids of the bundle's tokenizer");
    obs.tokenized_prompt = tokens.to(torch::kLong).contiguous();
    obs.tokenized_prompt_mask = token_mask.to(torch::kBool).contiguous();
  }
  return in;
}

torch::Tensor robot_actions(const Bundle& bundle, const torch::Tensor& actions_BHA, const torch::Tensor& raw_state_BS) {
  const auto& t = bundle.transform;
  const auto mode = t.norm_mode();
  torch::Tensor a = actions_BHA.to(torch::kCPU, torch::kFloat32);
  if (mode != data::NormMode::kNone) {
    const auto& stats = bundle.norm_stats.at("actions");
    const int64_t d = std::min<int64_t>(a.size(-1), static_cast<int64_t>(stats.mean.size()));
    a = data::unnormalize(a.narrow(-1, 0, d), stats, mode);
  }
  if (!t.delta_action_mask.empty()) {
    std::vector<torch::Tensor> per;
    for (int64_t b = 0; b < a.size(0); ++b)
      per.push_back(data::absolute_actions(a[b], raw_state_BS[b].to(torch::kFloat32), t.delta_action_mask));
    a = torch::stack(per);
  }
  if (bundle.config.data.dataset.adapt_to_pi_enabled()) a = data::aloha_actions_from_pi(a, "the model's actions");
  return a.contiguous();
}

}  // namespace pi0::io
