// Helpers shared by tests: random observations for small models, finite-difference gradients, temp dirs.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <functional>
#include <random>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pi0/common/fs.h"
#include "pi0/model/observation.h"
#include "pi0/model/pi0.h"

namespace pi0::testing {

/// A random observation for `o` with `num_cameras` images (image_size from o.siglip), all masks true, and
/// prompts of `o.max_token_len` tokens whose last `pad` tokens are padding.
inline model::Observation random_observation(const model::Pi0Options& o, int64_t batch, int64_t num_cameras = 2,
                                             int64_t pad = 1, torch::ScalarType dtype = torch::kFloat32) {
  model::Observation obs;
  const int64_t s = o.siglip.image_size;
  for (int64_t c = 0; c < num_cameras; ++c) {
    obs.images.push_back(torch::rand({batch, 3, s, s}, dtype) * 2 - 1);
    obs.image_masks.push_back(torch::ones({batch}, torch::kBool));
  }
  obs.state = torch::randn({batch, o.action_dim}, dtype);
  obs.tokenized_prompt = torch::randint(1, o.paligemma.vocab_size, {batch, o.max_token_len}, torch::kLong);
  obs.tokenized_prompt_mask = torch::ones({batch, o.max_token_len}, torch::kBool);
  if (pad > 0) {
    obs.tokenized_prompt.narrow(1, o.max_token_len - pad, pad).zero_();
    obs.tokenized_prompt_mask.narrow(1, o.max_token_len - pad, pad).fill_(false);
  }
  return obs;
}

/// Central finite difference of scalar f() with respect to t.flatten()[i] (t modified in place and restored).
inline double finite_difference(const std::function<double()>& f, torch::Tensor t, int64_t i, double h = 1e-6) {
  torch::NoGradGuard no_grad;
  auto flat = t.view({-1});
  const double orig = flat[i].item<double>();
  flat[i] = orig + h;
  const double up = f();
  flat[i] = orig - h;
  const double down = f();
  flat[i] = orig;
  return (up - down) / (2 * h);
}

/// max |a − b| / max(|b|_max, tiny): one relative error for a whole tensor.
inline double max_rel_error(const torch::Tensor& a, const torch::Tensor& b) {
  auto diff = (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
  auto scale = b.to(torch::kFloat64).abs().max().item<double>();
  return diff / std::max(scale, 1e-30);
}

/// The JSON document in `path` (a golden or fixture file); the test fails (REQUIRE) if it cannot be opened.
inline nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  REQUIRE(f);
  return nlohmann::json::parse(f);
}

/// A --dump-batches sample.json's decoded FAST chunk against its actions: max |fast_actions − actions| over the
/// first `dims` columns (the robot's; the actions are zero-padded past them). REQUIREs matching shapes.
inline double fast_chunk_error(const nlohmann::json& sample, size_t dims) {
  const auto& fa = sample.at("fast_actions");
  const auto& a = sample.at("actions");
  REQUIRE(fa.size() == a.size());
  REQUIRE(fa.at(0).size() == dims);
  double worst = 0;
  for (size_t r = 0; r < fa.size(); ++r)
    for (size_t c = 0; c < dims; ++c) worst = std::max(worst, std::abs(fa[r][c].get<double>() - a[r][c].get<double>()));
  return worst;
}

/// A JSON number written with all 17 significant digits, so that a YAML config built from a golden's settings
/// reads back the same double.
inline std::string exact_number(const nlohmann::json& j) {
  std::ostringstream os;
  os.precision(17);
  os << j.get<double>();
  return os.str();
}

/// The train-section lines (each "\n  key: value") of openpi's optimizer and schedule as a golden records them
/// (`optimizer`: b1, b2, eps, weight_decay, clip_gradient_norm; `lr_schedule`: warmup_steps, peak_lr, decay_steps,
/// decay_lr) and the EMA decay, in this trainer's keys, for the training-parity configs.
inline std::string openpi_optimizer_yaml(const nlohmann::json& opt, const nlohmann::json& lr,
                                         const nlohmann::json& ema_decay) {
  return "\n  lr_warmup_steps: " + std::to_string(lr.at("warmup_steps").get<int64_t>()) +
         "\n  lr_peak: " + exact_number(lr.at("peak_lr")) +
         "\n  lr_decay_steps: " + std::to_string(lr.at("decay_steps").get<int64_t>()) +
         "\n  lr_end: " + exact_number(lr.at("decay_lr")) + "\n  adam_b1: " + exact_number(opt.at("b1")) +
         "\n  adam_b2: " + exact_number(opt.at("b2")) + "\n  adam_eps: " + exact_number(opt.at("eps")) +
         "\n  weight_decay: " + exact_number(opt.at("weight_decay")) +
         "\n  clip_grad_norm: " + exact_number(opt.at("clip_gradient_norm")) +
         "\n  ema_decay: " + exact_number(ema_decay);
}

/// A fresh empty directory under the system temp dir, removed when the object dies.
/// The whole file as bytes; the test fails (REQUIRE) if it cannot be opened.
inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

class TempDir {
 public:
  explicit TempDir(const std::string& tag = "pi0test") {
    std::random_device rd;
    path_ = pi0::posix_fs::temp_directory_path() / (tag + "_" + std::to_string(rd()) + std::to_string(rd()));
    pi0::posix_fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    pi0::posix_fs::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::string str(const std::string& child = "") const { return child.empty() ? path_.string() : (path_ / child).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace pi0::testing
