// model::Pi0 with Pi0Options::fast (model.type pi0_fast): the trainer's model computes openpi's pi0-FAST. Its
// PaliGemma modules, loaded with the golden weights of tests/data/pi0_fast_model_reference.py, give the golden loss
// and greedy tokens through compute_fast_loss / sample_fast_tokens; its parameters are parameter_layout's; gradient
// checkpointing changes nothing; bf16 compute stays near float32.
#include <catch2/catch.hpp>

#include <set>

#include <nlohmann/json.hpp>

#include "pi0/io/model_weights.h"
#include "pi0/io/safetensors.h"
#include "pi0/model/param_layout.h"
#include "pi0/model/pi0.h"
#include "pi0/nn/checkpoint.h"
#include "support/test_support.h"

using namespace pi0;
using json = nlohmann::json;

namespace {

std::string golden(const std::string& name) {
  return std::string(PI0_SOURCE_DIR) + "/tests/data/golden/pi0_fast/" + name;
}

model::Pi0Options golden_fast_options(const json& meta) {
  model::Pi0Options o;
  o.fast = true;
  const auto& g = meta.at("gemma");
  o.paligemma = model::gemma_variant("dummy");
  o.paligemma.width = g.at("width");
  o.paligemma.depth = g.at("depth");
  o.paligemma.mlp_dim = g.at("mlp_dim");
  o.paligemma.num_heads = g.at("num_heads");
  o.paligemma.num_kv_heads = g.at("num_kv_heads");
  o.paligemma.head_dim = g.at("head_dim");
  o.paligemma.vocab_size = g.at("vocab_size");
  // Deliberately unlike the PaliGemma: pi0-FAST builds no expert, so nothing checks it against joint attention.
  o.action_expert = model::gemma_variant("gemma_300m");
  const auto& s = meta.at("siglip");
  o.siglip = model::SiglipOptions{{s.at("width"), s.at("depth"), s.at("mlp_dim"), s.at("num_heads"), s.at("patch_size")},
                                  s.at("image_size")};
  o.action_dim = meta.at("d");
  o.action_horizon = meta.at("h");
  o.max_token_len = meta.at("max_token_len");
  return o;
}

// The golden file names openpi's pi0-FAST tensors "paligemma.model..."; inside model::Pi0 they sit under
// "paligemma_with_expert." as pi0's do.
void load_golden(model::Pi0Impl& m, const std::map<std::string, torch::Tensor>& w) {
  torch::NoGradGuard no_grad;
  size_t used = 0;
  for (auto& p : m.named_parameters()) {
    const std::string prefix = "paligemma_with_expert.";
    REQUIRE(p.key().rfind(prefix, 0) == 0);
    const auto name = p.key().substr(prefix.size());
    INFO(name);
    REQUIRE(w.count(name) == 1);
    p.value().copy_(w.at(name));
    ++used;
  }
  CHECK(used == w.size());
}

model::Observation observation(const std::map<std::string, torch::Tensor>& c, const json& meta, const std::string& part,
                               const std::string& name) {
  model::Observation obs;
  int64_t i = 0;
  const auto masks = c.at(name + "/image_masks");
  for (const auto& cam : meta.at("cameras")) {
    obs.images.push_back(c.at("images/" + cam.get<std::string>()).permute({0, 3, 1, 2}).contiguous());
    obs.image_masks.push_back(masks.select(1, i++).to(torch::kBool));
  }
  obs.state = c.at("state");
  obs.tokenized_prompt = c.at(part + "/tokenized_prompt");
  obs.tokenized_prompt_mask = c.at(part + "/tokenized_prompt_mask").to(torch::kBool);
  return obs;
}

double rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max() / b.to(torch::kFloat64).abs().max())
      .item<double>();
}

}  // namespace

TEST_CASE("pi0fast variant: model::Pi0 with fast computes openpi's pi0-FAST loss and greedy tokens",
          "[fast][model][parity]") {
  const json meta = pi0::testing::read_json(golden("model.json"));
  const auto c = io::read_safetensors(golden("model_cases.safetensors"));
  const auto options = golden_fast_options(meta);
  model::Pi0 m(options);
  // Its parameters are exactly the layout the placement, the freeze presets and --print-params count.
  const auto layout = model::parameter_layout(options);
  const auto named = m->named_parameters();
  REQUIRE(named.size() == layout.size());
  for (size_t i = 0; i < layout.size(); ++i) {
    CHECK(named[i].key() == layout[i].name);
    CHECK(named[i].value().sizes() == torch::IntArrayRef(layout[i].shape));
  }
  load_golden(*m, io::read_safetensors(golden("model_weights.safetensors")));
  // The case without a replaced EOS embedding row (the others change it to force the stop).
  const std::string name = "all_cameras";
  const auto ar = c.at("train/token_ar_mask").to(torch::kBool), lm = c.at("train/token_loss_mask").to(torch::kBool);
  {
    torch::NoGradGuard no_grad;
    const auto loss = m->compute_fast_loss(observation(c, meta, "train", name), ar, lm);
    CHECK(rel_diff(loss.loss, c.at(name + "/loss")) < 1e-5);
  }
  const auto dec = m->sample_fast_tokens(observation(c, meta, "infer", name), c.at("infer/token_ar_mask").to(torch::kBool),
                                         meta.at("max_decoding_steps").get<int64_t>());
  CHECK(torch::equal(dec.tokens, c.at(name + "/output_tokens")));
  CHECK(dec.steps == meta.at("cases").at(name).at("steps_run").get<int64_t>());
  // Flow matching is not pi0-FAST's.
  CHECK_THROWS_WITH(m->compute_loss(observation(c, meta, "train", name), torch::zeros({2, options.action_horizon, 4})),
                    Catch::Contains("pi0-FAST has no flow-matching loss"));
}

TEST_CASE("pi0fast variant: gradient checkpointing gives the same loss and gradients, bf16 stays near float32",
          "[fast][model]") {
  const json meta = pi0::testing::read_json(golden("model.json"));
  const auto c = io::read_safetensors(golden("model_cases.safetensors"));
  model::Pi0 m(golden_fast_options(meta));
  load_golden(*m, io::read_safetensors(golden("model_weights.safetensors")));
  const auto obs = observation(c, meta, "train", "all_cameras");
  const auto ar = c.at("train/token_ar_mask").to(torch::kBool), lm = c.at("train/token_loss_mask").to(torch::kBool);
  auto run = [&] {
    m->zero_grad();
    const auto loss = m->compute_fast_loss(obs, ar, lm).loss.mean();
    loss.backward();
    std::vector<torch::Tensor> grads;
    for (const auto& p : m->parameters()) grads.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
    return std::make_pair(loss.item<double>(), grads);
  };
  const auto plain = run();
  const int64_t before = nn::checkpoint_recomputations();
  m->set_gradient_checkpointing(true);
  const auto ckpt = run();
  CHECK(nn::checkpoint_recomputations() > before);
  CHECK(ckpt.first == plain.first);
  REQUIRE(ckpt.second.size() == plain.second.size());
  for (size_t i = 0; i < plain.second.size(); ++i) {
    REQUIRE(plain.second[i].defined() == ckpt.second[i].defined());
    if (plain.second[i].defined()) CHECK(torch::allclose(ckpt.second[i], plain.second[i], 1e-5, 1e-7));
  }
  m->set_gradient_checkpointing(false);
  m->set_compute_dtype(torch::kBFloat16);
  torch::NoGradGuard no_grad;
  const double bf16 = m->compute_fast_loss(obs, ar, lm).loss.mean().item<double>();
  CHECK(bf16 == Approx(plain.first).epsilon(2e-2));
}

TEST_CASE("pi0fast variant: export in openpi's pi0-FAST layout and load back bit-exact", "[fast][model][io]") {
  const json meta = pi0::testing::read_json(golden("model.json"));
  const auto options = golden_fast_options(meta);
  pi0::testing::TempDir dir("pi0fastio");
  model::Pi0 m(options);  // random weights
  const auto path = dir.str("model.safetensors");
  io::save_model_weights(*m, path);  // openpi's layout
  // The names (and shapes) openpi's pi0-FAST has: those of the golden weights its own code wrote.
  const auto file = io::read_safetensors(path);
  const auto golden_weights = io::read_safetensors(golden("model_weights.safetensors"));
  REQUIRE(file.size() == golden_weights.size());
  for (const auto& [name, t] : golden_weights) {
    INFO(name);
    REQUIRE(file.count(name) == 1);
    CHECK(file.at(name).sizes() == t.sizes());
  }
  const auto layout = io::export_layout(options);
  REQUIRE(layout.size() == file.size());
  for (const auto& spec : layout) CHECK(file.count(spec.name) == 1);
  // Back into a fresh model: every parameter bit-exact.
  model::Pi0 back(options);
  const auto report = io::load_model_weights(*back, path);
  CHECK(report.missing.empty());
  CHECK(report.unexpected.empty());
  const auto a = m->named_parameters(), b = back->named_parameters();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].key());
    CHECK(torch::equal(a[i].value(), b[i].value()));
  }
  // The golden file itself loads by those names.
  model::Pi0 from_golden(options);
  io::load_model_weights(*from_golden, golden("model_weights.safetensors"));
  CHECK(torch::equal(from_golden->paligemma_with_expert->language_model->embed_tokens->weight,
                     golden_weights.at("paligemma.model.language_model.embed_tokens.weight")));
  // A pi0 model refuses a pi0-FAST file, naming model.type.
  auto pi0_options = options;
  pi0_options.fast = false;
  pi0_options.action_expert = options.paligemma;
  model::Pi0 not_fast(pi0_options);
  CHECK_THROWS_WITH(io::load_model_weights(*not_fast, path), Catch::Contains("check model.type"));
}
