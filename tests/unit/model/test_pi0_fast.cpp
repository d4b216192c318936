// model::Pi0Fast against openpi's own pi0-FAST (pi0_fast.py / gemma_fast.py / siglip.py at 15a9616) at tiny
// dimensions: tests/data/golden/pi0_fast/model_*.safetensors from tests/data/pi0_fast_model_reference.py. Per-example
// loss and the logits at every loss-masked target within 1e-5; greedy tokens exact (every openpi argmax margin in the
// goldens is > 0.1) and each decoding step's logits within 1e-5, which pins the decode positions (prefill_len + s + 1)
// and the right-aligned cache window; the number of steps run pins the all-rows-EOS stop.
#include <catch2/catch.hpp>

#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "pi0/io/safetensors.h"
#include "pi0/model/pi0_fast.h"

using namespace pi0;
using json = nlohmann::json;

namespace {

std::string golden(const std::string& name) {
  return std::string(PI0_SOURCE_DIR) + "/tests/data/golden/pi0_fast/" + name;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

/// max |a - b| / max |b|.
double rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max() / b.to(torch::kFloat64).abs().max())
      .item<double>();
}

model::Pi0FastOptions golden_options(const json& meta) {
  model::Pi0FastOptions o;
  const auto& g = meta.at("gemma");
  o.paligemma = model::gemma_variant("dummy");
  o.paligemma.width = g.at("width");
  o.paligemma.depth = g.at("depth");
  o.paligemma.mlp_dim = g.at("mlp_dim");
  o.paligemma.num_heads = g.at("num_heads");
  o.paligemma.num_kv_heads = g.at("num_kv_heads");
  o.paligemma.head_dim = g.at("head_dim");
  o.paligemma.vocab_size = g.at("vocab_size");
  const auto& s = meta.at("siglip");
  o.siglip = model::SiglipOptions{{s.at("width"), s.at("depth"), s.at("mlp_dim"), s.at("num_heads"), s.at("patch_size")},
                                  s.at("image_size")};
  o.action_dim = meta.at("d");
  o.action_horizon = meta.at("h");
  o.max_token_len = meta.at("max_token_len");
  return o;
}

/// Every parameter from the file by name; the file holds nothing else.
void load_exact(model::Pi0FastImpl& m, const std::map<std::string, torch::Tensor>& w) {
  torch::NoGradGuard no_grad;
  std::set<std::string> used;
  for (auto& p : m.named_parameters()) {
    INFO(p.key());
    REQUIRE(w.count(p.key()) == 1);
    REQUIRE(w.at(p.key()).sizes() == p.value().sizes());
    p.value().copy_(w.at(p.key()));
    used.insert(p.key());
  }
  for (const auto& [name, t] : w) {
    INFO("tensor in the golden that the model lacks: " << name);
    CHECK(used.count(name) == 1);
  }
}

model::Observation observation(const std::map<std::string, torch::Tensor>& c, const json& meta, const std::string& part,
                               const torch::Tensor& image_masks) {
  model::Observation obs;
  int64_t i = 0;
  for (const auto& cam : meta.at("cameras")) {
    obs.images.push_back(c.at("images/" + cam.get<std::string>()).permute({0, 3, 1, 2}).contiguous());
    obs.image_masks.push_back(image_masks.select(1, i++).to(torch::kBool));
  }
  obs.state = c.at("state");
  obs.tokenized_prompt = c.at(part + "/tokenized_prompt");
  obs.tokenized_prompt_mask = c.at(part + "/tokenized_prompt_mask").to(torch::kBool);
  return obs;
}

}  // namespace

TEST_CASE("pi0fast_forward_parity and pi0fast_decode_parity: openpi Pi0FAST at tiny dimensions", "[fast][model][parity]") {
  const json meta = read_json(golden("model.json"));
  const auto weights = io::read_safetensors(golden("model_weights.safetensors"));
  const auto c = io::read_safetensors(golden("model_cases.safetensors"));
  model::Pi0Fast m(golden_options(meta));
  load_exact(*m, weights);
  m->eval();
  m->set_logit_chunk(7);  // several chunks per batch, one of them partial
  const auto emb_row1 = m->language_model->embed_tokens->weight[1].clone();
  const int64_t steps = meta.at("max_decoding_steps");
  int n_cases = 0;
  for (const auto& [name, want] : meta.at("cases").items()) {
    INFO("case " << name);
    {
      torch::NoGradGuard no_grad;
      const std::string row_key = name + "/eos_embedding_row";
      m->language_model->embed_tokens->weight[1].copy_(c.count(row_key) ? c.at(row_key) : emb_row1);
    }
    const auto masks = c.at(name + "/image_masks");
    const auto train_obs = observation(c, meta, "train", masks);
    torch::Tensor loss_diff, logit_diff;
    {
      torch::NoGradGuard no_grad;
      const auto loss = m->compute_loss(train_obs, c.at("train/token_ar_mask").to(torch::kBool),
                                        c.at("train/token_loss_mask").to(torch::kBool), /*keep_logits=*/true);
      INFO("loss ours " << loss.loss << " openpi " << c.at(name + "/loss"));
      CHECK(rel_diff(loss.loss, c.at(name + "/loss")) < 1e-5);
      REQUIRE(loss.logits.sizes() == c.at(name + "/target_logits").sizes());
      CHECK(rel_diff(loss.logits, c.at(name + "/target_logits")) < 1e-5);
      const auto lm = c.at("train/token_loss_mask").to(torch::kBool);
      CHECK(torch::equal(loss.targets, lm.narrow(1, 1, lm.size(1) - 1).to(torch::kFloat32).sum(1)));
    }
    const auto infer_obs = observation(c, meta, "infer", masks);
    const auto dec = m->sample_tokens(infer_obs, c.at("infer/token_ar_mask").to(torch::kBool), steps, 0.0,
                                      std::nullopt, /*keep_logits=*/true);
    const auto want_tokens = c.at(name + "/output_tokens");
    INFO("tokens ours " << dec.tokens << " openpi " << want_tokens);
    CHECK(torch::equal(dec.tokens, want_tokens));
    CHECK(dec.steps == want.at("steps_run").get<int64_t>());
    const auto want_logits = c.at(name + "/step_logits");  // [B, steps, V]
    REQUIRE(static_cast<int64_t>(dec.step_logits.size()) == want_logits.size(1));
    for (size_t s = 0; s < dec.step_logits.size(); ++s) {
      INFO("step " << s);
      CHECK(rel_diff(dec.step_logits[s], want_logits.select(1, static_cast<int64_t>(s))) < 1e-5);
    }
    ++n_cases;
  }
  CHECK(n_cases == 4);
}

TEST_CASE("pi0fast: the loss backpropagates to every parameter that reaches a target", "[fast][model]") {
  const json meta = read_json(golden("model.json"));
  const auto c = io::read_safetensors(golden("model_cases.safetensors"));
  model::Pi0Fast m(golden_options(meta));
  load_exact(*m, io::read_safetensors(golden("model_weights.safetensors")));
  const auto obs = observation(c, meta, "train", c.at("all_cameras/image_masks"));
  const auto loss = m->compute_loss(obs, c.at("train/token_ar_mask").to(torch::kBool),
                                    c.at("train/token_loss_mask").to(torch::kBool));
  loss.loss.mean().backward();
  for (const auto& p : m->named_parameters()) {
    INFO(p.key());
    REQUIRE(p.value().grad().defined());
    CHECK(p.value().grad().abs().sum().item<double>() > 0.0);
  }
  CHECK((loss.correct <= loss.targets).all().item<bool>());
}

TEST_CASE("pi0fast: temperature sampling is seeded and differs from greedy", "[fast][model]") {
  const json meta = read_json(golden("model.json"));
  const auto c = io::read_safetensors(golden("model_cases.safetensors"));
  model::Pi0Fast m(golden_options(meta));
  load_exact(*m, io::read_safetensors(golden("model_weights.safetensors")));
  const auto obs = observation(c, meta, "infer", c.at("all_cameras/image_masks"));
  const auto ar = c.at("infer/token_ar_mask").to(torch::kBool);
  auto run = [&](uint64_t seed) {
    auto gen = at::detail::createCPUGenerator(seed);
    return m->sample_tokens(obs, ar, 6, 5.0, gen).tokens;
  };
  CHECK(torch::equal(run(3), run(3)));
  // At temperature 5 over 793 tokens, six steps of two rows almost surely differ from the greedy choice somewhere.
  CHECK(!torch::equal(run(3), m->sample_tokens(obs, ar, 6).tokens));
}
