// Model weights in openpi's layout: tied-embedding names, LeRobot prefix, strict errors, projection
// re-initialization, full-size export names without allocation.
#include <catch2/catch.hpp>

#include <map>

#include "pi0/common/check.h"
#include "pi0/io/model_weights.h"
#include "pi0/io/safetensors.h"
#include "support/test_support.h"

using namespace pi0;
using namespace pi0::model;
using Catch::Contains;

namespace {
std::vector<std::pair<std::string, torch::Tensor>> state(Pi0Impl& m) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& p : m.named_parameters()) out.emplace_back(p.key(), p.value().detach().clone());
  return out;
}
bool same_params(Pi0Impl& a, Pi0Impl& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  for (auto& p : pa)
    if (!torch::equal(p.value(), pb[p.key()])) return false;
  return true;
}
}  // namespace

TEST_CASE("embed_tokens and lm_head files load to the same model", "[unit][io]") {
  testing::TempDir dir;
  auto o = dummy_options(false);
  Pi0 src(o);
  io::save_model_weights(*src, dir.str("openpi.safetensors"));  // lm_head + alias + dummy expert head
  io::SafetensorsFile f(dir.str("openpi.safetensors"));
  CHECK(f.contains(io::kLmHeadName));
  CHECK(!f.contains(kEmbeddingName));
  CHECK(f.metadata().at(kEmbeddingName) == io::kLmHeadName);
  CHECK(f.info(io::kExpertLmHeadName).shape == std::vector<int64_t>{o.paligemma.vocab_size, 64});
  io::save_safetensors(dir.str("plain.safetensors"), state(*src));  // embed_tokens name, no extras

  Pi0 a(o), b(o);
  REQUIRE(!same_params(*a, *src));
  io::load_model_weights(*a, dir.str("openpi.safetensors"));
  io::load_model_weights(*b, dir.str("plain.safetensors"));
  CHECK(same_params(*a, *src));
  CHECK(same_params(*b, *src));
}

TEST_CASE("LeRobot's model. prefix and bf16 files load with dtype conversion", "[unit][io]") {
  testing::TempDir dir;
  auto o = dummy_options(true);
  Pi0 src(o);
  std::vector<std::pair<std::string, torch::Tensor>> prefixed;
  for (auto& [n, t] : state(*src)) prefixed.emplace_back("model." + n, t.to(torch::kBFloat16));
  io::save_safetensors(dir.str("lerobot.safetensors"), prefixed);
  Pi0 dst(o);
  auto report = io::load_model_weights(*dst, dir.str("lerobot.safetensors"));
  CHECK(report.loaded.size() == dst->named_parameters().size());
  auto w = dst->named_parameters()["action_in_proj.weight"];
  CHECK(w.scalar_type() == torch::kFloat32);
  CHECK(torch::equal(w, src->named_parameters()["action_in_proj.weight"].to(torch::kBFloat16).to(torch::kFloat32)));
}

TEST_CASE("strict loading lists every missing, unexpected and mismatched tensor", "[unit][io]") {
  testing::TempDir dir;
  auto o = dummy_options(false);
  Pi0 src(o);
  auto tensors = state(*src);
  tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                               [](auto& p) { return p.first == "state_proj.bias"; }),
                tensors.end());
  tensors.emplace_back("extra.weight", torch::zeros({2}));
  for (auto& [n, t] : tensors)
    if (n == "action_out_proj.bias") t = torch::zeros({3});
  io::save_safetensors(dir.str("bad.safetensors"), tensors);
  Pi0 dst(o);
  REQUIRE_THROWS_WITH(io::load_model_weights(*dst, dir.str("bad.safetensors")),
                      Contains("bad.safetensors: weights do not match the model:") &&
                          Contains("missing [state_proj.bias]") && Contains("unexpected [extra.weight]") &&
                          Contains("shape mismatch [action_out_proj.bias (file [3], model [8])]") &&
                          Contains("reinit_mismatched_projections"));
}

TEST_CASE("action_dim change: projections re-initialized on request, with a report", "[unit][io]") {
  testing::TempDir dir;
  auto o = dummy_options(false);
  Pi0 src(o);
  io::save_model_weights(*src, dir.str("base.safetensors"));
  auto o14 = o;
  o14.action_dim = 14;
  Pi0 dst(o14);
  REQUIRE_THROWS_WITH(io::load_model_weights(*dst, dir.str("base.safetensors")), Contains("action_in_proj.weight"));
  io::LoadOptions opts;
  opts.reinit_mismatched_projections = true;
  auto report = io::load_model_weights(*dst, dir.str("base.safetensors"), opts);
  std::sort(report.reinitialized.begin(), report.reinitialized.end());
  CHECK(report.reinitialized == std::vector<std::string>{"action_in_proj.weight", "action_out_proj.bias",
                                                         "action_out_proj.weight", "state_proj.weight"});
  CHECK(torch::equal(dst->named_parameters()["action_in_proj.bias"], src->named_parameters()["action_in_proj.bias"]));
}

TEST_CASE("LoRA factors absent from a base checkpoint keep their initialization", "[unit][io]") {
  testing::TempDir dir;
  auto o = dummy_options(false);
  Pi0 base(o);
  io::save_model_weights(*base, dir.str("base.safetensors"));
  auto lo = o;
  lo.paligemma.lora_rank = 4;
  lo.paligemma.lora_alpha = 4;
  Pi0 lora(lo);
  auto report = io::load_model_weights(*lora, dir.str("base.safetensors"));
  CHECK(report.missing.empty());
  CHECK(report.loaded.size() == base->named_parameters().size());
}

TEST_CASE("full-size export layouts have openpi's names without allocating", "[unit][io]") {
  for (bool pi05 : {false, true}) {
    auto layout = io::export_layout(pi0_options(pi05));
    std::map<std::string, std::vector<int64_t>> m;
    int64_t total = 0;
    for (auto& s : layout) m[s.name] = s.shape, total += s.numel();
    CHECK(m.at(io::kLmHeadName) == std::vector<int64_t>{257152, 2048});
    CHECK(m.at(io::kExpertLmHeadName) == std::vector<int64_t>{257152, 1024});
    CHECK(m.count(kEmbeddingName) == 0);
    // Released model + the 263,323,648-parameter dead expert lm_head.
    CHECK(total == (pi05 ? 3353433872LL : 3238048528LL) + 263323648LL);
  }
}
