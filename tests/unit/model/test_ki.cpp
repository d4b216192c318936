// Knowledge insulation (Pi0Impl::compute_ki_loss, docs/ki.md; acceptance tests of ../shared/docs/pi05-ki-fast.md §6):
// the gradient-reach oracles (A11: flow matching reaches only the action expert, its projections and the time MLP;
// the FAST cross-entropy only SigLIP, the projector, the embedding and the prefix expert; without the stop-gradient
// flow matching reaches the backbone too), the mask invariances (A12: the FAST block cannot change the velocity; the
// suffix sees what sampling sees), the cross-entropy against a plain full-vocabulary computation, the reduction to
// today's pi0.5 with no FAST tokens (A13, on openpi's pi05 fixture), and gradient checkpointing.
#include <catch2/catch.hpp>

#include <functional>
#include <map>

#include "pi0/config/config.h"
#include "pi0/io/model_weights.h"
#include "pi0/io/safetensors.h"
#include "pi0/model/model_config.h"
#include "pi0/model/pi0.h"
#include "pi0/nn/attention_mask.h"
#include "support/openpi_fixture.h"
#include "support/test_support.h"

using namespace pi0;
using namespace pi0::model;

namespace {

// Which side of the insulation a parameter is on (the recipe's gradient reach, §2 of the spec).
bool is_backbone(const std::string& name) { return name.rfind("paligemma_with_expert.paligemma.", 0) == 0; }
bool is_expert_side(const std::string& name) {
  return name.rfind("paligemma_with_expert.gemma_expert.", 0) == 0 || name.rfind("action_in_proj.", 0) == 0 ||
         name.rfind("action_out_proj.", 0) == 0 || name.rfind("time_mlp_", 0) == 0;
}

// A tiny pi0.5 with perturbed weights (the projector starts at zero, which would hide SigLIP's gradient), a batch of
// two whose prompts have different padding, and FAST blocks of different lengths.
struct KiCase {
  Pi0Options o = dummy_options(/*pi05=*/true, /*vocab_size=*/96);
  Pi0 model{o};
  Observation obs;
  torch::Tensor actions, noise, time, fast, fast_mask;
  static constexpr int64_t kF = 5;

  KiCase() {
    torch::manual_seed(3);
    {
      torch::NoGradGuard ng;
      for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.05);
    }
    obs = testing::random_observation(o, 2, 2, /*pad=*/2);
    // Example 0: two valid prompt tokens, then padding (its first FAST token is predicted from row 1 of the prompt).
    obs.tokenized_prompt_mask[0].narrow(0, 2, o.max_token_len - 2).fill_(false);
    actions = torch::randn({2, o.action_horizon, o.action_dim});
    noise = torch::randn_like(actions);
    time = torch::tensor({0.3f, 0.8f});
    fast = torch::randint(1, o.paligemma.vocab_size, {2, kF}, torch::kLong);
    fast_mask = torch::ones({2, kF}, torch::kBool);
    fast_mask[1].narrow(0, 3, kF - 3).fill_(false);  // example 1: 3 valid tokens, then padding
    fast[1].narrow(0, 3, kF - 3).zero_();
  }

  Pi0Impl::KiLoss forward(bool stop_gradient = true) {
    return model->compute_ki_loss(obs, actions, fast, fast_mask, stop_gradient, noise, time);
  }
  // Gradients by parameter name after backward of `loss` (undefined where none reached).
  std::map<std::string, torch::Tensor> grads(const torch::Tensor& loss) {
    model->zero_grad();
    loss.backward();
    std::map<std::string, torch::Tensor> g;
    for (const auto& p : model->named_parameters())
      g[p.key()] = p.value().grad().defined() ? p.value().grad().clone() : torch::Tensor();
    return g;
  }
};

bool bitwise_zero(const torch::Tensor& g) { return !g.defined() || g.count_nonzero().item<int64_t>() == 0; }

}  // namespace

TEST_CASE("knowledge insulation: flow matching reaches only the expert side and the FAST CE only the backbone",
          "[unit][model][ki]") {
  for (const bool checkpointing : {false, true}) {
    KiCase c;
    c.model->set_gradient_checkpointing(checkpointing);
    INFO("gradient checkpointing " << checkpointing);
    const auto flow = c.grads(c.forward().flow.mean());
    const auto ce = c.grads(c.forward().ce.mean());
    int64_t expert_reached = 0, backbone_reached = 0, expert_params = 0, backbone_params = 0;
    for (const auto& [name, g] : flow) {
      INFO(name);
      REQUIRE((is_backbone(name) || is_expert_side(name)));
      if (is_backbone(name)) {
        ++backbone_params;
        CHECK(bitwise_zero(g));               // flow matching never reaches the backbone
        backbone_reached += !bitwise_zero(ce.at(name));
      } else {
        ++expert_params;
        CHECK(bitwise_zero(ce.at(name)));     // the CE never reaches the expert side
        expert_reached += !bitwise_zero(g);
      }
    }
    // And each loss does reach its own side: every expert-side tensor, and every backbone tensor (SigLIP, projector,
    // embedding, every prefix layer, the final norm).
    CHECK(expert_reached == expert_params);
    CHECK(backbone_reached == backbone_params);
  }
}

TEST_CASE("without the stop-gradient flow matching reaches the backbone through the keys and values",
          "[unit][model][ki]") {
  KiCase c;
  const auto flow = c.grads(c.forward(/*stop_gradient=*/false).flow.mean());
  for (const std::string name :
       {"paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings.patch_embedding.weight",
        "paligemma_with_expert.paligemma.model.multi_modal_projector.linear.weight",
        "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight",
        "paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.k_proj.weight"}) {
    INFO(name);
    CHECK_FALSE(bitwise_zero(flow.at(name)));
  }
  // The same forward: the values do not depend on the stop-gradient.
  KiCase d;
  const auto on = d.forward(true), off = d.forward(false);
  CHECK(torch::equal(on.flow, off.flow));
  CHECK(torch::equal(on.ce, off.ce));
}

TEST_CASE("knowledge insulation: the FAST block cannot change the velocity nor the suffix the CE", "[unit][model][ki]") {
  KiCase c;
  torch::NoGradGuard ng;
  const auto a = c.forward();
  // Other ids, and another number of valid tokens in each example (the block's padded length stays F).
  c.fast = torch::randint(1, c.o.paligemma.vocab_size, {2, KiCase::kF}, torch::kLong);
  c.fast_mask = torch::ones({2, KiCase::kF}, torch::kBool);
  c.fast_mask[0].narrow(0, 2, KiCase::kF - 2).fill_(false);
  const auto b = c.forward();
  CHECK(torch::equal(a.flow, b.flow));
  CHECK_FALSE(torch::equal(a.ce, b.ce));
  CHECK(b.targets[0].item<float>() == 2);
  CHECK(b.targets[1].item<float>() == KiCase::kF);
  // And the other way: another suffix (noise, time, actions) leaves the CE bit-identical.
  c.noise = torch::randn_like(c.noise);
  c.time = torch::tensor({0.6f, 0.1f});
  c.actions = torch::randn_like(c.actions);
  const auto s = c.forward();
  CHECK(torch::equal(s.ce, b.ce));
  CHECK(torch::equal(s.correct, b.correct));
  CHECK_FALSE(torch::equal(s.flow, b.flow));
}

TEST_CASE("knowledge insulation: the suffix sees what sampling sees (the flow loss equals the joint pass's)",
          "[unit][model][ki]") {
  KiCase c;
  torch::NoGradGuard ng;
  const auto joint = c.model->compute_loss(c.obs, c.actions, c.noise, c.time);
  const auto ki = c.forward();
  CHECK(testing::max_rel_error(ki.flow, joint) < 1e-5);
  // Also with no FAST tokens at all (F = 0): the prefix pass and a cached suffix pass, as sample_actions.
  const auto none = c.model->compute_ki_loss(c.obs, c.actions, torch::zeros({2, 0}, torch::kLong),
                                             torch::zeros({2, 0}, torch::kBool), true, c.noise, c.time);
  // (Not bitwise: the prefix pass has another length, so its products may be blocked differently.)
  CHECK(testing::max_rel_error(none.flow, ki.flow) < 1e-6);
  CHECK(none.ce.abs().sum().item<double>() == 0.0);
}

TEST_CASE("knowledge insulation: the FAST CE equals a full-vocabulary log-softmax over the joint prefix pass",
          "[unit][model][ki]") {
  KiCase c;
  c.model->set_ki_logit_chunk(2);  // several chunks over the 8 targets
  torch::NoGradGuard ng;
  const auto ki = c.forward();
  // Reference: the backbone over [P; F] as one causal-after-prefix sequence, logits at every row, then the loss of
  // each valid F token read from the row that precedes it among the valid rows.
  auto& m = *c.model;
  auto prefix = m.embed_prefix(c.obs);
  const int64_t tp = prefix.embs.size(1);
  auto embs = torch::cat({prefix.embs, m.paligemma_with_expert->language_model->embed(c.fast)}, 1);
  auto pad = torch::cat({prefix.pad_mask, c.fast_mask}, 1);
  auto ar = torch::cat({prefix.ar_mask, torch::ones({KiCase::kF}, torch::kBool)});
  auto out = m.paligemma_with_expert->forward(embs, torch::Tensor(), nn::make_attn_mask(pad, ar),
                                              nn::positions_from_mask(pad), torch::Tensor(), nullptr, nullptr, 0);
  const auto logp = torch::log_softmax(
      torch::matmul(out.prefix, m.paligemma_with_expert->language_model->embed_tokens->weight.t()), -1);
  for (int64_t b = 0; b < 2; ++b) {
    double sum = 0;
    int64_t n = 0, correct = 0;
    int64_t prev = -1;  // the last valid row before the current one
    for (int64_t j = 0; j < tp + KiCase::kF; ++j) {
      if (!pad[b][j].item<bool>()) continue;
      if (j >= tp && prev >= 0) {
        const int64_t tok = c.fast[b][j - tp].item<int64_t>();
        sum -= logp[b][prev][tok].item<double>();
        correct += logp[b][prev].argmax().item<int64_t>() == tok;
        ++n;
      }
      prev = j;
    }
    INFO("example " << b);
    CHECK(ki.targets[b].item<float>() == n);
    CHECK(ki.ce[b].item<double>() == Approx(sum / n).epsilon(1e-6));
    CHECK(ki.correct[b].item<float>() == correct);
  }
}

TEST_CASE("knowledge insulation: gradient checkpointing gives the same losses and gradients", "[unit][model][ki]") {
  for (const bool stop_gradient : {true, false}) {
    KiCase c;
    auto total = [&] {
      const auto l = c.forward(stop_gradient);
      return l.ce.mean() + 10.0 * l.flow.mean();
    };
    const auto plain = c.grads(total());
    c.model->set_gradient_checkpointing(true);
    const auto recomputed = c.grads(total());
    INFO("stop_gradient " << stop_gradient);
    for (const auto& [name, g] : plain) {
      INFO(name);
      REQUIRE(recomputed.at(name).defined() == g.defined());
      if (g.defined()) CHECK(testing::max_rel_error(recomputed.at(name), g) < 1e-4);
    }
  }
}

TEST_CASE("knowledge insulation with no FAST tokens reduces to openpi's pi0.5 loss (fixture)", "[parity][model][ki]") {
  if (!testing::openpi_fixture_present("pi05/outputs.safetensors")) return;
  const std::string dir = testing::openpi_fixtures_dir() + "/pi05";
  const auto cfg = config::parse_config(YAML::Load(testing::fixture_model_yaml(dir)), dir + "/config.json");
  Pi0 m(options_from_config(cfg.model));
  io::load_named_weights(*m, io::read_safetensors(dir + "/weights.safetensors"), dir + "/weights.safetensors");
  const auto in = io::read_safetensors(dir + "/inputs.safetensors");
  const auto ref = io::read_safetensors(dir + "/outputs.safetensors");
  const auto obs = testing::fixture_observation(in);
  const int64_t b = in.at("actions").size(0);
  torch::NoGradGuard ng;
  const auto ki = m->compute_ki_loss(obs, in.at("actions"), torch::zeros({b, 0}, torch::kLong),
                                     torch::zeros({b, 0}, torch::kBool), true, in.at("noise"), in.at("time"));
  const double err = testing::masked_rel_error(ki.flow, ref.at("loss"));
  INFO("max |KI flow loss − openpi loss| / max |openpi loss| = " << err);
  CHECK(err < 1e-5);
  // ce_weight 0: the total is the flow term alone.
  CHECK(ki.ce.abs().sum().item<double>() == 0.0);
}
