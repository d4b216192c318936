// Access to openpi's reference fixtures (../shared/fixtures/openpi, see its README.md): where they are, a visible
// skip (testing::skip) (or a failure under PI0_REQUIRE_FIXTURES=1, as CI runs) when they are absent, the fixture model as a config
// with explicit dimensions, and the fixture inputs as an Observation. Nothing here is copied from the fixtures.
#pragma once
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pi0/model/observation.h"
#include "support/skip.h"
#include "support/test_support.h"

namespace pi0::testing {

/// $PI0_FIXTURES_DIR if set, else <repo>/../shared/fixtures/openpi.
inline std::string openpi_fixtures_dir() {
  if (const char* env = std::getenv("PI0_FIXTURES_DIR"); env && *env) return env;
  return std::string(PI0_SOURCE_DIR) + "/../shared/fixtures/openpi";
}

/// True when <fixtures>/<relative> exists. Otherwise a skip (CTest: "Not Run") and false, or a test failure when
/// PI0_REQUIRE_FIXTURES=1 (CI sets it so the parity tests always run there).
inline bool openpi_fixture_present(const std::string& relative) {
  const std::string path = openpi_fixtures_dir() + "/" + relative;
  if (std::filesystem::exists(path)) return true;
  const char* require = std::getenv("PI0_REQUIRE_FIXTURES");
  if (require && std::string(require) == "1") {
    FAIL("fixtures not found at " << path << " and PI0_REQUIRE_FIXTURES=1 (set PI0_FIXTURES_DIR)");
  } else {
    skip("fixtures not found at " + path + " (set PI0_FIXTURES_DIR, or PI0_REQUIRE_FIXTURES=1 to fail)");
  }
  return false;
}


/// The `model:` section describing the fixture model in `dir` (pi0/ or pi05/), from its config.json, with explicit
/// dimensions for both experts and SigLIP.
inline std::string fixture_model_yaml(const std::string& dir) {
  const auto c = read_json(dir + "/config.json");
  auto gemma = [](const nlohmann::json& g) {
    return "{width: " + std::to_string(g.at("width").get<int64_t>()) +
           ", depth: " + std::to_string(g.at("depth").get<int64_t>()) +
           ", mlp_dim: " + std::to_string(g.at("mlp_dim").get<int64_t>()) +
           ", num_heads: " + std::to_string(g.at("num_heads").get<int64_t>()) +
           ", num_kv_heads: " + std::to_string(g.at("num_kv_heads").get<int64_t>()) +
           ", head_dim: " + std::to_string(g.at("head_dim").get<int64_t>()) + "}";
  };
  const auto& s = c.at("siglip");
  const std::string siglip = "{width: " + std::to_string(s.at("width").get<int64_t>()) +
                             ", depth: " + std::to_string(s.at("depth").get<int64_t>()) +
                             ", mlp_dim: " + std::to_string(s.at("mlp_dim").get<int64_t>()) +
                             ", num_heads: " + std::to_string(s.at("num_heads").get<int64_t>()) +
                             ", patch_size: " + std::to_string(s.at("patch_size").get<int64_t>()) + "}";
  return "model:\n  type: " + std::string(c.at("pi05").get<bool>() ? "pi05" : "pi0") +
         "\n  paligemma_variant: " + gemma(c.at("paligemma")) +
         "\n  action_expert_variant: " + gemma(c.at("action_expert")) +
         "\n  siglip_variant: " + siglip +
         "\n  vocab_size: " + std::to_string(c.at("vocab_size").get<int64_t>()) +
         "\n  image_size: " + std::to_string(c.at("image_resolution")[0].get<int64_t>()) +
         "\n  action_dim: " + std::to_string(c.at("action_dim").get<int64_t>()) +
         "\n  action_horizon: " + std::to_string(c.at("action_horizon").get<int64_t>()) +
         "\n  max_token_len: " + std::to_string(c.at("max_token_len").get<int64_t>()) + "\n";
}

/// The fixture's observation (images HWC → NCHW, int32 tokens → int64) from inputs.safetensors tensors.
inline model::Observation fixture_observation(const std::map<std::string, torch::Tensor>& in) {
  model::Observation obs;
  for (const auto& cam : model::kCameraNames) {
    obs.images.push_back(in.at("image/" + cam).permute({0, 3, 1, 2}).contiguous());
    obs.image_masks.push_back(in.at("image_mask/" + cam).to(torch::kBool));
  }
  obs.state = in.at("state").to(torch::kFloat32);
  obs.tokenized_prompt = in.at("tokenized_prompt").to(torch::kLong);
  obs.tokenized_prompt_mask = in.at("tokenized_prompt_mask").to(torch::kBool);
  return obs;
}

/// max |a − b| / max |b| over the rows where `mask_BT` is true (a, b [B,T,...]); all rows when mask is undefined.
inline double masked_rel_error(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& mask_BT = {}) {
  auto x = a.to(torch::kFloat64), y = b.to(torch::kFloat64);
  if (mask_BT.defined()) {
    x = x.index({mask_BT});
    y = y.index({mask_BT});
  }
  const double scale = y.abs().max().item<double>();
  return (x - y).abs().max().item<double>() / std::max(scale, 1e-30);
}

}  // namespace pi0::testing
