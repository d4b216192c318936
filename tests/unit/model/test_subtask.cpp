// Subtask prediction (train.subtask; docs/subtask.md; acceptance test A15 of ../shared/docs/pi05-ki-fast.md §6):
// the subtask block [cue; text; EOS] after the prompt and before the FAST block. Checked here on a tiny pi0.5 with
// perturbed weights: the subtask CE against a plain full-vocabulary computation, the gradient reach with and without
// insulation, what the action expert sees (the subtask, never FAST), that training's expert equals sampling's after
// a teacher-forced block, and that greedy decoding through the KV cache equals the argmax of a joint pass.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "pi0/model/pi0.h"
#include "pi0/nn/attention_mask.h"
#include "support/test_support.h"

using namespace pi0;
using namespace pi0::model;

namespace {

bool is_backbone(const std::string& name) { return name.rfind("paligemma_with_expert.paligemma.", 0) == 0; }
bool bitwise_zero(const torch::Tensor& g) { return !g.defined() || g.count_nonzero().item<int64_t>() == 0; }

// Batch of two: example 0 has a short prompt, a 3-token cue, a 2-token text + EOS (block of 6 valid, then padding)
// and a FAST block of 5; example 1 a 4-token text + EOS and a FAST block of 3.
struct SubtaskCase {
  Pi0Options o = dummy_options(/*pi05=*/true, /*vocab_size=*/96);
  Pi0 model{o};
  Observation obs;
  torch::Tensor actions, noise, time;
  Pi0Impl::PrefixBlocks blocks;
  static constexpr int64_t kT = 9, kF = 5, kCue = 3;

  SubtaskCase() {
    torch::manual_seed(5);
    {
      torch::NoGradGuard ng;
      for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.05);
    }
    obs = testing::random_observation(o, 2, 2, /*pad=*/2);
    obs.tokenized_prompt_mask[0].narrow(0, 2, o.max_token_len - 2).fill_(false);
    actions = torch::randn({2, o.action_horizon, o.action_dim});
    noise = torch::randn_like(actions);
    time = torch::tensor({0.3f, 0.8f});
    set_subtask({6, 8});
    blocks.fast_tokens = torch::randint(1, o.paligemma.vocab_size, {2, kF}, torch::kLong);
    blocks.fast_mask = torch::ones({2, kF}, torch::kBool);
    blocks.fast_mask[1].narrow(0, 3, kF - 3).fill_(false);
    blocks.fast_tokens[1].narrow(0, 3, kF - 3).zero_();
  }
  // Random block ids with `valid[b]` valid tokens each (the first kCue the cue, the same in both examples).
  void set_subtask(const std::vector<int64_t>& valid) {
    blocks.subtask_tokens = torch::randint(2, o.paligemma.vocab_size, {2, kT}, torch::kLong);
    blocks.subtask_tokens.narrow(1, 0, kCue).copy_(torch::tensor({7, 8, 9}, torch::kLong).expand({2, kCue}));
    blocks.subtask_mask = torch::zeros({2, kT}, torch::kBool);
    blocks.subtask_targets = torch::zeros({2, kT}, torch::kBool);
    for (int64_t b = 0; b < 2; ++b) {
      blocks.subtask_mask[b].narrow(0, 0, valid[b]).fill_(true);
      blocks.subtask_targets[b].narrow(0, kCue, valid[b] - kCue).fill_(true);
      blocks.subtask_tokens[b][valid[b] - 1] = 1;  // EOS
      blocks.subtask_tokens[b].narrow(0, valid[b], kT - valid[b]).zero_();
    }
  }
  Pi0Impl::KiLoss forward(bool stop_gradient = true) {
    return model->compute_prefix_loss(obs, actions, blocks, stop_gradient, noise, time);
  }
  std::map<std::string, torch::Tensor> grads(const torch::Tensor& loss) {
    model->zero_grad();
    loss.backward();
    std::map<std::string, torch::Tensor> g;
    for (const auto& p : model->named_parameters())
      g[p.key()] = p.value().grad().defined() ? p.value().grad().clone() : torch::Tensor();
    return g;
  }
};

}  // namespace

TEST_CASE("subtask prediction: the subtask and FAST CEs equal a full-vocabulary log-softmax over the joint prefix pass",
          "[unit][model][subtask]") {
  SubtaskCase c;
  c.model->set_ki_logit_chunk(3);
  torch::NoGradGuard ng;
  const auto out = c.forward();
  // Reference: the backbone over [P; T; F], both blocks causal after the prompt, logits at every row; each target
  // read from the valid row before it.
  auto& m = *c.model;
  auto& pwe = *m.paligemma_with_expert;
  const auto prefix = m.embed_prefix(c.obs);
  const int64_t tp = prefix.embs.size(1), tt = SubtaskCase::kT, f = SubtaskCase::kF;
  const auto embs = torch::cat({prefix.embs, pwe.language_model->embed(c.blocks.subtask_tokens),
                                pwe.language_model->embed(c.blocks.fast_tokens)}, 1);
  const auto pad = torch::cat({prefix.pad_mask, c.blocks.subtask_mask, c.blocks.fast_mask}, 1);
  const auto ar = torch::cat({prefix.ar_mask, torch::ones({tt + f}, torch::kBool)});
  const auto joint = pwe.forward(embs, torch::Tensor(), nn::make_attn_mask(pad, ar), nn::positions_from_mask(pad),
                                 torch::Tensor(), nullptr, nullptr, 0);
  const auto logp = torch::log_softmax(torch::matmul(joint.prefix, pwe.language_model->embed_tokens->weight.t()), -1);
  for (int64_t b = 0; b < 2; ++b) {
    double sub = 0, fast = 0;
    int64_t n_sub = 0, n_fast = 0, prev = -1;
    for (int64_t j = 0; j < tp + tt + f; ++j) {
      if (!pad[b][j].item<bool>()) continue;
      if (j >= tp && j < tp + tt && c.blocks.subtask_targets[b][j - tp].item<bool>()) {
        sub -= logp[b][prev][c.blocks.subtask_tokens[b][j - tp].item<int64_t>()].item<double>();
        ++n_sub;
      } else if (j >= tp + tt) {
        fast -= logp[b][prev][c.blocks.fast_tokens[b][j - tp - tt].item<int64_t>()].item<double>();
        ++n_fast;
      }
      prev = j;
    }
    INFO("example " << b);
    CHECK(out.subtask_targets[b].item<float>() == n_sub);
    CHECK(out.subtask_ce[b].item<double>() == Approx(sub / n_sub).epsilon(1e-6));
    CHECK(out.targets[b].item<float>() == n_fast);
    CHECK(out.ce[b].item<double>() == Approx(fast / n_fast).epsilon(1e-6));
  }
  CHECK(out.subtask_targets[0].item<float>() == 3);  // two text tokens and EOS; the cue is fed, not predicted
}

TEST_CASE("subtask prediction: with insulation flow matching leaves the backbone bitwise untouched, without it not",
          "[unit][model][subtask]") {
  for (const bool checkpointing : {false, true}) {
    SubtaskCase c;
    c.model->set_gradient_checkpointing(checkpointing);
    INFO("gradient checkpointing " << checkpointing);
    const auto flow = c.grads(c.forward(/*stop_gradient=*/true).flow.mean());
    const auto sub = c.grads(c.forward(/*stop_gradient=*/true).subtask_ce.mean());
    int64_t backbone = 0, reached_by_sub = 0;
    for (const auto& [name, g] : flow) {
      INFO(name);
      if (is_backbone(name)) {
        ++backbone;
        CHECK(bitwise_zero(g));
        reached_by_sub += !bitwise_zero(sub.at(name));
      } else {
        CHECK(bitwise_zero(sub.at(name)));  // the subtask CE never reaches the expert side
      }
    }
    CHECK(reached_by_sub == backbone);
  }
  // Subtask prediction without insulation: the expert's loss reaches the backbone through the block's keys/values.
  SubtaskCase c;
  const auto flow = c.grads(c.forward(/*stop_gradient=*/false).flow.mean());
  CHECK_FALSE(bitwise_zero(flow.at("paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight")));
}

TEST_CASE("subtask prediction: the expert sees the subtask text but never the FAST tokens", "[unit][model][subtask]") {
  SubtaskCase c;
  torch::NoGradGuard ng;
  const auto a = c.forward();
  // Other FAST ids and lengths: the velocity (and the subtask CE) bit-identical.
  c.blocks.fast_tokens = torch::randint(1, c.o.paligemma.vocab_size, {2, SubtaskCase::kF}, torch::kLong);
  c.blocks.fast_mask[0].narrow(0, 2, SubtaskCase::kF - 2).fill_(false);
  const auto b = c.forward();
  CHECK(torch::equal(a.flow, b.flow));
  CHECK(torch::equal(a.subtask_ce, b.subtask_ce));
  CHECK_FALSE(torch::equal(a.ce, b.ce));
  // Another subtask text: the velocity of each example changes.
  c.set_subtask({7, 5});
  const auto s = c.forward();
  for (int64_t e = 0; e < 2; ++e) CHECK_FALSE(torch::equal(s.flow[e], b.flow[e]));
  // An all-padding block (a frame without a label) is the same as no block for the expert.
  c.blocks.subtask_mask.zero_();
  c.blocks.subtask_targets.zero_();
  const auto empty = c.forward();
  Pi0Impl::PrefixBlocks none;
  none.fast_tokens = c.blocks.fast_tokens, none.fast_mask = c.blocks.fast_mask;
  const auto without = c.model->compute_prefix_loss(c.obs, c.actions, none, true, c.noise, c.time);
  CHECK(testing::max_rel_error(empty.flow, without.flow) < 1e-6);
  CHECK(empty.subtask_ce.abs().sum().item<double>() == 0.0);
}

TEST_CASE("subtask prediction: training's expert equals sampling's after the teacher-forced block",
          "[unit][model][subtask]") {
  SubtaskCase c;
  torch::NoGradGuard ng;
  // One Euler step from t = 1: x_0 = noise − v(noise, 1). Trained on those actions at t = 1, the target velocity is
  // exactly that v, so the flow loss is zero when training's expert (positions, mask, keys/values) is sampling's.
  const auto sampled = c.model->sample_actions_with_subtask(c.obs, c.blocks.subtask_tokens, c.blocks.subtask_mask,
                                                            c.noise, /*num_steps=*/1);
  c.actions = sampled;
  c.time = torch::ones({2});
  const auto out = c.forward();
  CHECK(out.flow.max().item<double>() < 1e-9);
  // And the block matters to sampling: without it the actions differ.
  const auto plain = c.model->sample_actions(c.obs, c.noise, 1);
  CHECK(testing::max_rel_error(plain, sampled) > 1e-4);
}

TEST_CASE("subtask prediction: greedy decoding through the KV cache equals the argmax of a teacher-forced joint pass",
          "[unit][model][subtask]") {
  SubtaskCase c;
  torch::NoGradGuard ng;
  const std::vector<int64_t> cue = {7, 8, 9};
  const int64_t max_tokens = 8;
  // First with an end no token can be (-1): the block runs to max_tokens. Then an end id example 0 emits early.
  const auto free_run = c.model->decode_subtask(c.obs, cue, max_tokens, /*end_id=*/-1);
  REQUIRE(free_run.tokens.sizes() == torch::IntArrayRef({2, max_tokens}));
  CHECK(free_run.mask.all().item<bool>());
  const int64_t end_id = free_run.tokens[0][4].item<int64_t>();
  const int64_t end_at = free_run.tokens[0][3].item<int64_t>() == end_id ? 3 : 4;
  Pi0Impl::SubtaskDecoded dec;
  const auto actions = c.model->sample_actions_after_subtask(c.obs, cue, max_tokens, end_id, &dec, c.noise, 3);
  // Example 0 stops at its end token, the rest padding; the cue is the block's start; before the end the tokens
  // are the free run's (the same greedy choices).
  CHECK(torch::equal(dec.tokens.narrow(1, 0, 3), torch::tensor({7, 8, 9}, torch::kLong).expand({2, 3})));
  CHECK(dec.tokens[0][end_at].item<int64_t>() == end_id);
  CHECK(dec.mask[0].sum().item<int64_t>() == end_at + 1);
  CHECK(torch::equal(dec.tokens[0].narrow(0, 0, end_at + 1), free_run.tokens[0].narrow(0, 0, end_at + 1)));
  if (dec.tokens.size(1) > end_at + 1) CHECK(dec.tokens[0].narrow(0, end_at + 1, dec.tokens.size(1) - end_at - 1).eq(0).all().item<bool>());
  // Teacher-forced reference: the backbone over [P; decoded block] in one pass; each generated token is the argmax
  // of the logits at the row before it (where the top two are not within rounding of each other).
  auto& m = *c.model;
  auto& pwe = *m.paligemma_with_expert;
  const auto prefix = m.embed_prefix(c.obs);
  const int64_t tp = prefix.embs.size(1), t = dec.tokens.size(1);
  const auto embs = torch::cat({prefix.embs, pwe.language_model->embed(dec.tokens)}, 1);
  const auto pad = torch::cat({prefix.pad_mask, dec.mask}, 1);
  const auto ar = torch::cat({prefix.ar_mask, torch::ones({t}, torch::kBool)});
  const auto joint = pwe.forward(embs, torch::Tensor(), nn::make_attn_mask(pad, ar), nn::positions_from_mask(pad),
                                 torch::Tensor(), nullptr, nullptr, 0);
  const auto logits = m.token_logits(joint.prefix.narrow(1, tp, t).reshape({2 * t, -1})).view({2, t, -1});
  int64_t checked = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = static_cast<int64_t>(cue.size()); i < t; ++i) {
      if (!dec.mask[b][i].item<bool>()) continue;
      const auto top = logits[b][i - 1].topk(2);
      if ((std::get<0>(top)[0] - std::get<0>(top)[1]).item<double>() < 1e-4) continue;
      INFO("example " << b << " position " << i);
      CHECK(dec.tokens[b][i].item<int64_t>() == std::get<1>(top)[0].item<int64_t>());
      ++checked;
    }
  CHECK(checked >= 2);
  // The actions sampled after the decoded subtask equal sampling with that block given as a teacher-forced block.
  const auto reference = c.model->sample_actions_with_subtask(c.obs, dec.tokens, dec.mask, c.noise, 3);
  CHECK(testing::max_rel_error(actions, reference) < 1e-5);
}
