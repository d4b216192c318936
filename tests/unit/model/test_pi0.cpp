// pi0 / pi0.5 model: shapes, parameter names against openpi's state_dict (§4.2), exact full-size counts,
// masking behaviour end to end, KV-cache sampling against full recomputation, finite-difference gradients of
// the flow-matching loss, and gradient checkpointing equivalence.
#include <catch2/catch.hpp>

#include <map>

#include "pi0/model/param_layout.h"
#include "pi0/model/pi0.h"
#include "pi0/nn/checkpoint.h"
#include "support/test_support.h"

using namespace pi0;
using namespace pi0::model;

namespace {
std::map<std::string, std::vector<int64_t>> layout_map(const Pi0Options& o) {
  std::map<std::string, std::vector<int64_t>> m;
  for (const auto& p : parameter_layout(o)) m[p.name] = p.shape;
  return m;
}
int64_t total(const Pi0Options& o) {
  int64_t n = 0;
  for (const auto& p : parameter_layout(o)) n += p.numel();
  return n;
}
int64_t component_total(const Pi0Options& o, const std::string& c) {
  int64_t n = 0;
  for (const auto& p : parameter_layout(o))
    if (component_of(p.name) == c) n += p.numel();
  return n;
}
const std::string V = "paligemma_with_expert.paligemma.model.vision_tower.vision_model.";
const std::string P = "paligemma_with_expert.paligemma.model.";
const std::string E = "paligemma_with_expert.gemma_expert.model.";
}  // namespace

TEST_CASE("parameter layout equals the instantiated model's named_parameters", "[unit][model]") {
  for (bool pi05 : {false, true}) {
    for (bool lora : {false, true}) {
      auto o = dummy_options(pi05);
      if (lora) o.paligemma.lora_rank = 2, o.action_expert.lora_rank = 3, o.action_expert.lora_alpha = 3;
      Pi0 model(o);
      auto layout = parameter_layout(o);
      auto params = model->named_parameters();
      REQUIRE(params.size() == layout.size());
      size_t i = 0;
      for (const auto& item : params) {
        INFO("pi05=" << pi05 << " lora=" << lora << " index " << i);
        CHECK(item.key() == layout[i].name);
        CHECK(item.value().sizes().vec() == layout[i].shape);
        ++i;
      }
    }
  }
}

TEST_CASE("full-size names and shapes follow openpi's PyTorch state_dict", "[unit][model]") {
  auto pi0 = layout_map(pi0_options(false));
  auto pi05 = layout_map(pi0_options(true));
  using S = std::vector<int64_t>;
  std::map<std::string, S> common = {
      {"action_in_proj.weight", {1024, 32}},
      {"action_in_proj.bias", {1024}},
      {"action_out_proj.weight", {32, 1024}},
      {"action_out_proj.bias", {32}},
      {V + "embeddings.patch_embedding.weight", {1152, 3, 14, 14}},
      {V + "embeddings.patch_embedding.bias", {1152}},
      {V + "embeddings.position_embedding.weight", {256, 1152}},
      {V + "encoder.layers.0.layer_norm1.weight", {1152}},
      {V + "encoder.layers.26.self_attn.q_proj.weight", {1152, 1152}},
      {V + "encoder.layers.26.self_attn.out_proj.bias", {1152}},
      {V + "encoder.layers.26.mlp.fc1.weight", {4304, 1152}},
      {V + "encoder.layers.26.mlp.fc2.weight", {1152, 4304}},
      {V + "post_layernorm.bias", {1152}},
      {P + "multi_modal_projector.linear.weight", {2048, 1152}},
      {P + "multi_modal_projector.linear.bias", {2048}},
      {P + "language_model.embed_tokens.weight", {257152, 2048}},
      {P + "language_model.layers.17.self_attn.q_proj.weight", {2048, 2048}},
      {P + "language_model.layers.17.self_attn.k_proj.weight", {256, 2048}},
      {P + "language_model.layers.17.self_attn.v_proj.weight", {256, 2048}},
      {P + "language_model.layers.17.self_attn.o_proj.weight", {2048, 2048}},
      {P + "language_model.layers.0.mlp.gate_proj.weight", {16384, 2048}},
      {P + "language_model.layers.0.mlp.up_proj.weight", {16384, 2048}},
      {P + "language_model.layers.0.mlp.down_proj.weight", {2048, 16384}},
      {P + "language_model.layers.0.input_layernorm.weight", {2048}},
      {P + "language_model.layers.0.post_attention_layernorm.weight", {2048}},
      {P + "language_model.norm.weight", {2048}},
      {E + "layers.17.self_attn.q_proj.weight", {2048, 1024}},
      {E + "layers.17.self_attn.k_proj.weight", {256, 1024}},
      {E + "layers.17.self_attn.o_proj.weight", {1024, 2048}},
      {E + "layers.0.mlp.gate_proj.weight", {4096, 1024}},
      {E + "layers.0.mlp.down_proj.weight", {1024, 4096}},
  };
  for (const auto& [name, shape] : common) {
    INFO(name);
    REQUIRE(pi0.count(name));
    REQUIRE(pi05.count(name));
    CHECK(pi0[name] == shape);
    CHECK(pi05[name] == shape);
  }
  CHECK(pi0["state_proj.weight"] == S{1024, 32});
  CHECK(pi0["action_time_mlp_in.weight"] == S{1024, 2048});
  CHECK(pi0["action_time_mlp_out.weight"] == S{1024, 1024});
  CHECK(pi0[E + "layers.3.input_layernorm.weight"] == S{1024});
  CHECK(pi0[E + "norm.weight"] == S{1024});
  CHECK(pi05["time_mlp_in.weight"] == S{1024, 1024});
  CHECK(pi05["time_mlp_out.bias"] == S{1024});
  CHECK(pi05[E + "layers.3.input_layernorm.dense.weight"] == S{3072, 1024});
  CHECK(pi05[E + "layers.3.post_attention_layernorm.dense.bias"] == S{3072});
  CHECK(pi05[E + "norm.dense.weight"] == S{3072, 1024});
  CHECK(pi05.count("state_proj.weight") == 0);
  CHECK(pi05.count(E + "norm.weight") == 0);
  CHECK(pi0.count(E + "embed_tokens.weight") == 0);
}

TEST_CASE("full-size parameter counts are exact", "[unit][model]") {
  CHECK(total(pi0_options(false)) == 3238048528LL);
  CHECK(total(pi0_options(true)) == 3353433872LL);
  // Per-block figures of the reference (openpi-reference §1.4).
  CHECK(component_total(pi0_options(false), "vision") == 414803696LL);
  CHECK(component_total(pi0_options(false), "language") + component_total(pi0_options(false), "embedding") ==
        2508531712LL);
  CHECK(component_total(pi0_options(false), "embedding") == 257152LL * 2048);
  CHECK(component_total(pi0_options(false), "action_expert") == 311464960LL);
  CHECK(component_total(pi0_options(true), "action_expert") == 427932672LL);
  CHECK(component_total(pi0_options(false), "projections") == 3248160LL);
  CHECK(component_total(pi0_options(true), "projections") == 2165792LL);
}

TEST_CASE("model output shapes", "[unit][model]") {
  for (bool pi05 : {false, true}) {
    auto o = dummy_options(pi05);
    Pi0 model(o);
    auto obs = testing::random_observation(o, 3);
    auto tokens = model->paligemma_with_expert->vision->forward(obs.images[0], torch::kFloat32, 0);
    CHECK(tokens.sizes() == torch::IntArrayRef({3, 4, 32}));  // (28/14)² patches, tiny width 32
    auto prefix = model->embed_prefix(obs);
    CHECK(prefix.embs.sizes() == torch::IntArrayRef({3, 2 * 4 + 6, 64}));
    auto actions = torch::randn({3, o.action_horizon, o.action_dim});
    auto loss = model->compute_loss(obs, actions);
    CHECK(loss.sizes() == torch::IntArrayRef({3, 4, 8}));
    CHECK(loss.scalar_type() == torch::kFloat32);
    CHECK(model->sample_actions(obs, std::nullopt, 2).sizes() == torch::IntArrayRef({3, 4, 8}));
    // bf16 compute keeps the loss in float32.
    model->set_compute_dtype(torch::kBFloat16);
    CHECK(model->compute_loss(obs, actions).scalar_type() == torch::kFloat32);
  }
}

TEST_CASE("masked cameras and padded prompt tokens do not influence the actions", "[unit][model]") {
  for (bool pi05 : {false, true}) {
    auto o = dummy_options(pi05);
    Pi0 model(o);
    {
      // Zero-initialized pieces (SigLIP head, adaRMS gates) would hide the prefix from the actions.
      torch::NoGradGuard ng;
      for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.05);
    }
    auto obs = testing::random_observation(o, 2, 2, 2);
    obs.image_masks[1] = torch::tensor({false, true});
    auto noise = torch::randn({2, o.action_horizon, o.action_dim});
    auto base = model->sample_actions(obs, noise, 3);
    auto changed = obs;
    changed.images = {obs.images[0], obs.images[1].clone()};
    changed.images[1][0].uniform_(-1, 1);  // camera masked for sample 0
    changed.tokenized_prompt = obs.tokenized_prompt.clone();
    changed.tokenized_prompt.narrow(1, o.max_token_len - 2, 2).fill_(7);  // pad positions
    auto after = model->sample_actions(changed, noise, 3);
    INFO("pi05=" << pi05);
    CHECK(torch::allclose(after[0], base[0], 1e-5, 1e-6));
    // A visible change (camera of sample 1) does change the result: the test can fail.
    changed.images[1][1].uniform_(-1, 1);
    CHECK(!torch::allclose(model->sample_actions(changed, noise, 3)[1], base[1], 1e-4, 1e-5));
  }
}

TEST_CASE("KV-cache sampling equals full recomputation (float32, 1e-5 relative)", "[unit][model]") {
  for (bool pi05 : {false, true}) {
    auto o = dummy_options(pi05);
    Pi0 model(o);
    {
      torch::NoGradGuard ng;  // make every component non-trivial, including zero-initialized ones
      for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.05);
    }
    auto obs = testing::random_observation(o, 2, 3, 2);
    auto noise = torch::randn({2, o.action_horizon, o.action_dim});
    auto cached = model->sample_actions(obs, noise, 10, true);
    auto full = model->sample_actions(obs, noise, 10, false);
    INFO("pi05=" << pi05);
    CHECK(testing::max_rel_error(cached, full) < 1e-5);
    CHECK(testing::max_rel_error(cached, noise) > 1e-2);  // sampling moved away from the noise
  }
}

TEST_CASE("flow-matching loss gradient matches finite differences (float64)", "[unit][model]") {
  for (bool pi05 : {false, true}) {
    auto o = dummy_options(pi05, 64, 14);
    o.paligemma.depth = o.action_expert.depth = 2;
    Pi0 model(o);
    model->to(torch::kFloat64);
    model->set_compute_dtype(torch::kFloat64);
    {
      torch::NoGradGuard ng;
      for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.1);
    }
    auto obs = testing::random_observation(o, 2, 1, 1, torch::kFloat64);
    auto actions = torch::randn({2, o.action_horizon, o.action_dim}, torch::kFloat64).requires_grad_(true);
    auto noise = torch::randn({2, o.action_horizon, o.action_dim}, torch::kFloat64);
    auto time = torch::tensor({0.3, 0.8}, torch::kFloat64);
    auto loss_fn = [&]() { return model->compute_loss(obs, actions, noise, time).mean(); };
    auto named = model->named_parameters();
    std::vector<std::string> names = {"action_in_proj.weight", "action_out_proj.bias",
                                      pi05 ? "time_mlp_in.weight" : "action_time_mlp_in.weight",
                                      pi05 ? E + "layers.1.input_layernorm.dense.weight" : "state_proj.weight",
                                      E + "layers.0.self_attn.q_proj.weight",
                                      P + "language_model.layers.0.mlp.up_proj.weight",
                                      V + "encoder.layers.0.mlp.fc1.weight"};
    std::vector<torch::Tensor> targets = {actions};
    for (auto& n : names) targets.push_back(named[n]);
    auto grads = torch::autograd::grad({loss_fn()}, targets);
    auto f = [&]() { return loss_fn().item<double>(); };
    for (size_t k = 0; k < targets.size(); ++k) {
      const int64_t n = targets[k].numel();
      for (int64_t i = 0; i < n; i += std::max<int64_t>(1, n / 6)) {
        INFO("pi05=" << pi05 << " target " << (k == 0 ? "actions" : names[k - 1]) << " [" << i << "]");
        const double fd = testing::finite_difference(f, targets[k].detach(), i);
        CHECK(grads[k].view({-1})[i].item<double>() == Approx(fd).epsilon(1e-5).margin(1e-9));
      }
    }
  }
}

namespace {
// A dummy model with perturbed weights (so no gradient is trivially zero) and fixed noise and time: what the
// checkpointing tests compare with and without recomputation.
struct CheckpointingCase {
  Pi0Options o;
  Pi0 model;
  Observation obs;
  torch::Tensor actions, noise, time;
  explicit CheckpointingCase(bool pi05) : o(dummy_options(pi05)), model(o) {
    {
      torch::NoGradGuard ng;
      for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.05);
    }
    obs = testing::random_observation(o, 2);
    actions = torch::randn({2, o.action_horizon, o.action_dim});
    noise = torch::randn_like(actions);
    time = torch::tensor({0.2f, 0.9f});
  }
  struct Result {
    double loss;
    std::vector<torch::Tensor> grads;  ///< per parameter, zeros where none
    int64_t recomputed;                ///< layers recomputed in backward
  };
  Result run() {
    model->zero_grad();
    const auto before = nn::checkpoint_recomputations();
    auto loss = model->compute_loss(obs, actions, noise, time).mean();
    loss.backward();
    Result r{loss.item<double>(), {}, nn::checkpoint_recomputations() - before};
    for (auto& p : model->parameters()) r.grads.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
    return r;
  }
};
}  // namespace

TEST_CASE("per-layer gradient checkpointing gives the same loss and gradients", "[unit][model]") {
  for (bool pi05 : {false, true}) {
    CheckpointingCase c(pi05);
    c.model->set_gradient_checkpointing(false);
    const auto plain = c.run();
    c.model->set_gradient_checkpointing(true);
    const auto recomputed = c.run();
    INFO("pi05=" << pi05);
    CHECK(plain.loss == Approx(recomputed.loss).epsilon(1e-6));
    size_t nonzero = 0;
    for (size_t i = 0; i < plain.grads.size(); ++i) {
      CHECK(testing::max_rel_error(recomputed.grads[i], plain.grads[i]) < 1e-4);
      nonzero += plain.grads[i].abs().sum().item<double>() > 0;
    }
    CHECK(nonzero > plain.grads.size() / 2);
  }
}

TEST_CASE("gradient checkpointing recomputes each layer once, except the last joint layer and frozen SigLIP",
          "[unit][model]") {
  auto o = dummy_options(false);
  Pi0 model(o);
  model->set_gradient_checkpointing(true);
  auto obs = testing::random_observation(o, 2);
  auto actions = torch::randn({2, o.action_horizon, o.action_dim});
  auto step = [&] {
    model->zero_grad();
    const auto before = nn::checkpoint_recomputations();
    model->compute_loss(obs, actions).mean().backward();
    return nn::checkpoint_recomputations() - before;
  };
  CHECK(step() == (o.paligemma.depth - 1) + o.siglip.depth);
  auto& vision = *model->paligemma_with_expert->vision;
  for (auto& p : vision.parameters()) p.requires_grad_(false);
  CHECK(step() == o.paligemma.depth - 1);  // a frozen tower is run once, never recomputed
}

TEST_CASE("partial gradient checkpointing recomputes the first layers of each stack, same loss and gradients",
          "[unit][model]") {
  CheckpointingCase c(/*pi05=*/true);
  auto& o = c.o;
  auto& model = c.model;
  auto run = [&](int64_t vision, int64_t language) {
    model->set_checkpointed_layers(vision, language);
    return c.run();
  };
  const auto plain = run(0, 0);
  CHECK(plain.recomputed == 0);
  const int64_t depth = o.paligemma.depth;
  struct Case {
    int64_t vision, language, recomputed;
  };
  // The last joint layer is never recomputed: depth joint layers recompute depth − 1.
  for (const Case k : {Case{1, 2, 3}, Case{2, 1, 3}, Case{0, depth, depth - 1}, Case{1, 0, 1}}) {
    CAPTURE(k.vision, k.language);
    const auto partial = run(k.vision, k.language);
    CHECK(model->checkpointed_layers() == CheckpointedLayers{k.vision, k.language});
    CHECK(partial.recomputed == k.recomputed);
    CHECK(partial.loss == Approx(plain.loss).epsilon(1e-6));
    for (size_t i = 0; i < plain.grads.size(); ++i)
      CHECK(testing::max_rel_error(partial.grads[i], plain.grads[i]) < 1e-4);
  }
  model->set_gradient_checkpointing(true);
  CHECK(model->checkpointed_layers() == all_layers(o));
  model->set_gradient_checkpointing(false);
  CHECK(model->checkpointed_layers() == CheckpointedLayers{});
  CHECK_THROWS(model->set_checkpointed_layers(o.siglip.depth + 1, 0));
  CHECK_THROWS(model->set_checkpointed_layers(0, -1));
}

TEST_CASE("gradient checkpointing with only the layers trainable gives their gradients", "[unit][model]") {
  // As the lora-only preset: every layer input comes from frozen embeddings, so no checkpoint input needs grad.
  auto o = dummy_options(true);
  Pi0 model(o);
  for (auto& p : model->named_parameters())
    p.value().requires_grad_(p.key().find(".layers.") != std::string::npos &&
                             p.key().find("vision_tower") == std::string::npos);
  auto obs = testing::random_observation(o, 2);
  auto actions = torch::randn({2, o.action_horizon, o.action_dim});
  auto noise = torch::randn_like(actions);
  auto time = torch::tensor({0.3f, 0.8f});
  auto grads = [&](bool ckpt) {
    model->set_gradient_checkpointing(ckpt);
    model->zero_grad();
    model->compute_loss(obs, actions, noise, time).mean().backward();
    std::vector<torch::Tensor> g;
    for (auto& p : model->parameters())
      if (p.requires_grad()) g.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
    return g;
  };
  auto plain = grads(false), ck = grads(true);
  REQUIRE(plain.size() == ck.size());
  double total = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    CHECK(testing::max_rel_error(ck[i], plain[i]) < 1e-4);
    total += ck[i].abs().sum().item<double>();
  }
  CHECK(total > 0);
}
