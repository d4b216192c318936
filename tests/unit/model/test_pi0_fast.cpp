// model::Pi0Fast against openpi's own pi0-FAST (pi0_fast.py / gemma_fast.py / siglip.py at 15a9616) at tiny
// dimensions: tests/data/golden/pi0_fast/model_*.safetensors from tests/data/pi0_fast_model_reference.py. Per-example
// loss and the logits at every loss-masked target within 1e-5; greedy tokens exact (every openpi argmax margin in the
// goldens is > 0.1) and each decoding step's logits within 1e-5, which pins the decode positions (prefill_len + s + 1)
// and the right-aligned cache window; the number of steps run pins the all-rows-EOS stop.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "pi0/io/safetensors.h"
#include "pi0/model/pi0_fast.h"
#include "pi0/train/lr_schedule.h"
#include "support/test_support.h"

using namespace pi0;
using json = nlohmann::json;

namespace {

std::string golden(const std::string& name) {
  return std::string(PI0_SOURCE_DIR) + "/tests/data/golden/pi0_fast/" + name;
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
  const json meta = pi0::testing::read_json(golden("model.json"));
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
  const json meta = pi0::testing::read_json(golden("model.json"));
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

TEST_CASE("pi0fast: an example without loss targets has loss 0 and no logits", "[fast][model]") {
  const json meta = pi0::testing::read_json(golden("model.json"));
  const auto c = io::read_safetensors(golden("model_cases.safetensors"));
  model::Pi0Fast m(golden_options(meta));
  load_exact(*m, io::read_safetensors(golden("model_weights.safetensors")));
  // The inference prefix (no actions): its loss mask is all false, as openpi's tokenize gives without actions.
  const auto obs = observation(c, meta, "infer", c.at("all_cameras/image_masks"));
  const auto loss_mask = c.at("infer/token_loss_mask").to(torch::kBool);
  REQUIRE_FALSE(loss_mask.any().item<bool>());
  const auto loss = m->compute_loss(obs, c.at("infer/token_ar_mask").to(torch::kBool), loss_mask, true);
  CHECK(torch::equal(loss.loss, torch::zeros({2})));
  CHECK(torch::equal(loss.targets, torch::zeros({2})));
  CHECK(loss.logits.size(0) == 0);
  CHECK(loss.logits.size(1) == meta.at("gemma").at("vocab_size").get<int64_t>());
}

TEST_CASE("pi0fast: temperature sampling is seeded and differs from greedy", "[fast][model]") {
  const json meta = pi0::testing::read_json(golden("model.json"));
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

TEST_CASE("pi0fast_train_parity: 12 openpi training steps with AdamW and EMA", "[fast][model][parity]") {
  // openpi's train step (value_and_grad of the batch-mean loss, clip_by_global_norm, optax AdamW, cosine schedule,
  // EMA) replayed with the model's gradients and LibTorch's AdamW: pins the gradients of every tensor over 12 steps.
  // openpi's AdamW equals torch's (decoupled decay on the pre-update weight; eps added to sqrt(v_hat)); the global
  // norm clip scales by max_norm / norm only above max_norm, as optax does.
  const json meta = pi0::testing::read_json(golden("model.json"));
  const auto c = io::read_safetensors(golden("model_cases.safetensors"));
  const auto& t = meta.at("train");
  model::Pi0Fast m(golden_options(meta));
  load_exact(*m, io::read_safetensors(golden("model_weights.safetensors")));
  std::map<std::string, torch::Tensor> initial, ema;
  for (const auto& p : m->named_parameters()) {
    initial[p.key()] = p.value().detach().clone();
    ema[p.key()] = p.value().detach().clone();
  }
  const auto& o = t.at("optimizer");
  const auto& lr = t.at("lr_schedule");
  torch::optim::AdamW opt(m->parameters(), torch::optim::AdamWOptions(1e-3)
                                               .betas({o.at("b1").get<double>(), o.at("b2").get<double>()})
                                               .eps(o.at("eps").get<double>())
                                               .weight_decay(o.at("weight_decay").get<double>()));
  const double max_norm = o.at("clip_gradient_norm"), ema_decay = t.at("ema_decay");
  const int64_t steps = t.at("steps");
  const auto cams = torch::ones({2, 3}, torch::kBool);
  double worst_loss = 0, worst_norm = 0;
  for (int64_t k = 0; k < steps; ++k) {
    const std::string p = "train_steps/step" + std::to_string(k);
    auto obs = observation(c, meta, p, cams);
    opt.zero_grad();
    const auto loss = m->compute_loss(obs, c.at(p + "/token_ar_mask").to(torch::kBool),
                                      c.at(p + "/token_loss_mask").to(torch::kBool)).loss.mean();
    loss.backward();
    double sq = 0;
    for (const auto& param : m->parameters()) sq += param.grad().to(torch::kFloat64).pow(2).sum().item<double>();
    const double norm = std::sqrt(sq);
    if (norm > max_norm)
      for (auto& param : m->parameters()) param.mutable_grad().mul_(max_norm / norm);
    const double step_lr = train::warmup_cosine_lr(k, lr.at("warmup_steps"), lr.at("peak_lr"), lr.at("decay_steps"),
                                                   lr.at("decay_lr"));
    for (auto& g : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(step_lr);
    opt.step();
    {
      torch::NoGradGuard no_grad;
      for (const auto& param : m->named_parameters())
        ema[param.key()].mul_(ema_decay).add_(param.value().detach(), 1.0 - ema_decay);
    }
    const double want_loss = c.at("train_steps/loss")[k].item<double>();
    const double want_norm = c.at("train_steps/grad_norm")[k].item<double>();
    INFO("step " << k << ": loss " << loss.item<double>() << " vs " << want_loss << ", grad norm " << norm << " vs "
                 << want_norm);
    worst_loss = std::max(worst_loss, std::abs(loss.item<double>() - want_loss) / want_loss);
    worst_norm = std::max(worst_norm, std::abs(norm - want_norm) / want_norm);
    CHECK(std::abs(loss.item<double>() - want_loss) <= 1e-5 * want_loss);
    CHECK(std::abs(norm - want_norm) <= 1e-5 * want_norm);
    CHECK(std::abs(step_lr - c.at("train_steps/lr")[k].item<double>()) <= 1e-6 * step_lr);
  }
  // Each tensor's total update and EMA within 1e-3 (Frobenius, relative to openpi's). SigLIP's attention key biases
  // have a true gradient of zero (a shift shared by all keys cancels in the softmax): Adam amplifies rounding noise
  // there on both sides, so they are left out.
  double worst_update = 0, worst_ema = 0;
  int64_t compared = 0;
  for (const auto& param : m->named_parameters()) {
    const auto& n = param.key();
    if (n.find("self_attn.k_proj.bias") != std::string::npos) continue;
    const auto init = initial.at(n).to(torch::kFloat64);
    const auto ref = c.at("train_steps/final/" + n).to(torch::kFloat64) - init;
    const auto ref_ema = c.at("train_steps/ema/" + n).to(torch::kFloat64) - init;
    const double e_update =
        ((param.value().detach().to(torch::kFloat64) - init) - ref).norm().item<double>() / ref.norm().item<double>();
    const double e_ema = ((ema.at(n).to(torch::kFloat64) - init) - ref_ema).norm().item<double>() /
                         ref_ema.norm().item<double>();
    INFO(n << ": update error " << e_update << ", EMA error " << e_ema);
    CHECK(e_update < 1e-3);
    CHECK(e_ema < 1e-3);
    worst_update = std::max(worst_update, e_update);
    worst_ema = std::max(worst_ema, e_ema);
    ++compared;
  }
  CHECK(compared == static_cast<int64_t>(m->named_parameters().size()) - meta.at("siglip").at("depth").get<int64_t>());
  std::printf("pi0fast train parity: %lld steps, loss max rel %.2e, grad norm max rel %.2e; %lld tensors: update max "
              "rel %.2e, EMA %.2e\n",
              static_cast<long long>(steps), worst_loss, worst_norm, static_cast<long long>(compared), worst_update,
              worst_ema);
}
